//! Logs, traces and metrics. JSON logs through `tracing`; OTLP/HTTP trace export when an
//! endpoint is configured; W3C trace context carried across the queue; one Prometheus recorder
//! per process rendered by each binary's `/metrics`.

use std::collections::HashMap;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::TelemetrySettings;

/// Keeps the tracer provider alive; flushes spans on drop.
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber. Call once per process, from `main`.
pub fn init(settings: &TelemetrySettings, service: &str) -> anyhow::Result<TelemetryGuard> {
    install_crypto();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let json = match settings.log_format.as_str() {
        "json" => true,
        "pretty" => false,
        // A person at a terminal reads lines; a collector parses JSON.
        _ => !terminal,
    };
    let fmt = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_filter(filter())
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(terminal)
            .with_filter(filter())
            .boxed()
    };
    let mut provider = None;
    let otel = if settings.otlp_endpoint.is_empty() {
        None
    } else {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!(
                "{}/v1/traces",
                settings.otlp_endpoint.trim_end_matches('/')
            ))
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(format!("{}-{service}", settings.service_name))
            .build();
        let p = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = p.tracer(service.to_owned());
        opentelemetry::global::set_tracer_provider(p.clone());
        provider = Some(p);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(filter()),
        )
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()?;
    Ok(TelemetryGuard { provider })
}

/// rustls needs one process-wide crypto provider; we build with ring only.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The process-wide Prometheus recorder (installed on first use; later calls share it, which
/// lets tests run several apps in one process).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
                ])
                .expect("buckets are valid")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (embedding); then ours only renders.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// W3C `traceparent`/`tracestate` of the current span, for message headers.
pub fn current_trace_headers() -> HashMap<String, String> {
    let mut headers = HashMap::new();
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    headers
}

/// Makes `span` a child of the context carried in `headers`.
pub fn set_parent_from(span: &tracing::Span, headers: &HashMap<String, String>) {
    let cx = TraceContextPropagator::new().extract(headers);
    let _ = span.set_parent(cx);
}
