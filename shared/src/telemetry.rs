//! Logs, traces and metrics. JSON logs through `tracing`; OTLP/HTTP trace export when an
//! endpoint is configured; W3C trace context carried across the queue; one Prometheus recorder
//! per process rendered by each binary's `/metrics`.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, TelemetrySettings};

/// Set once the OTLP exporter is installed: spans that exist only for traces, and the trace
/// context stored with runs and sent to tools, are made only then.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces (`telemetry.otlp_endpoint` is set).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

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
    let json = match settings.log_format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        // A person at a terminal reads lines; a collector parses JSON.
        LogFormat::Auto => !terminal,
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
        // The batch processor's schedule (`OTEL_BSP_SCHEDULE_DELAY` and the other standard
        // `OTEL_BSP_*` variables) is read from the environment.
        let p = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = p.tracer(service.to_owned());
        opentelemetry::global::set_tracer_provider(p.clone());
        provider = Some(p);
        // Its own filter: what is exported does not depend on what is logged (`RUST_LOG`).
        let traced = EnvFilter::try_new(&settings.trace_filter)?;
        EXPORTING.store(true, Ordering::Relaxed);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(traced),
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

/// W3C `traceparent`/`tracestate` of the current span, for message and request headers;
/// empty when this process does not export traces.
pub fn current_trace_headers() -> HashMap<String, String> {
    let mut headers = HashMap::new();
    if !exporting() {
        return headers;
    }
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    headers
}

/// The current span's `traceparent`, to store with a run (`runs.traceparent`); `None` when
/// this process does not export traces or no span is recording.
pub fn current_traceparent() -> Option<String> {
    current_trace_headers().remove(TRACEPARENT)
}

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` taken from a caller (W3C: 32 members of at most 256 characters, but
/// vendors keep it short); a longer one is dropped, the `traceparent` kept.
const MAX_TRACESTATE: usize = 512;

/// The remote context of W3C headers, if they carry a valid one. Anything malformed (not
/// ASCII, a wrong length or version, an all-zero id) yields `None`: the span becomes a root.
pub fn remote_context(headers: &HashMap<String, String>) -> Option<opentelemetry::Context> {
    let cx = TraceContextPropagator::new().extract(headers);
    cx.span().span_context().is_valid().then_some(cx)
}

/// [`remote_context`] of an HTTP request's `traceparent` and `tracestate`.
pub fn remote_context_of_http(
    headers: &reqwest::header::HeaderMap,
) -> Option<opentelemetry::Context> {
    let parent = headers.get(TRACEPARENT)?.to_str().ok()?;
    let mut carrier = HashMap::from([(TRACEPARENT.to_owned(), parent.to_owned())]);
    if let Some(state) = headers
        .get(TRACESTATE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= MAX_TRACESTATE)
    {
        carrier.insert(TRACESTATE.to_owned(), state.to_owned());
    }
    remote_context(&carrier)
}

/// [`remote_context`] of a stored `traceparent` (`runs.traceparent`).
pub fn remote_context_of(traceparent: &str) -> Option<opentelemetry::Context> {
    remote_context(&HashMap::from([(
        TRACEPARENT.to_owned(),
        traceparent.to_owned(),
    )]))
}

/// Makes `span` a child of `cx` (before the span is entered or has children).
pub fn set_parent(span: &tracing::Span, cx: opentelemetry::Context) {
    let _ = span.set_parent(cx);
}

/// Renames a started span (`otel.name` only names a span before it starts).
pub fn rename(span: &tracing::Span, name: String) {
    span.context().span().update_name(name);
}

/// Links `span` to the span of `cx` (a cause in another part of the trace, or another trace).
pub fn add_link(span: &tracing::Span, cx: &opentelemetry::Context) {
    span.add_link(cx.span().span_context().clone());
}

/// The trace and span ids of `cx`, to compare contexts.
pub fn ids_of(cx: &opentelemetry::Context) -> (String, String) {
    let sc = cx.span().span_context().clone();
    (sc.trace_id().to_string(), sc.span_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_trace_headers_are_ignored() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = remote_context_of(ok).expect("valid");
        assert_eq!(
            ids_of(&cx),
            (
                "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
                "00f067aa0ba902b7".to_owned()
            )
        );
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(remote_context_of(bad).is_none(), "{bad:?} accepted");
        }
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            reqwest::header::HeaderValue::from_bytes(b"00-\xff").unwrap(),
        );
        assert!(remote_context_of_http(&headers).is_none());
        headers.insert(TRACEPARENT, reqwest::header::HeaderValue::from_static(ok));
        headers.insert(
            TRACESTATE,
            reqwest::header::HeaderValue::from_str(&"a=b,".repeat(200)).unwrap(),
        );
        assert!(
            remote_context_of_http(&headers).is_some(),
            "an oversized tracestate is dropped"
        );
    }
}
