//! An OTLP/HTTP trace collector on a free loopback port, for the tracing tests: it answers
//! `POST /v1/traces` as a collector does, decodes each protobuf `ExportTraceServiceRequest`
//! independently of product code, and keeps the spans.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;

/// One span as the collector received it; ids in lowercase hex, as in `traceparent`.
#[derive(Debug, Clone)]
pub struct CollectedSpan {
    /// The exporting process's `service.name`.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Attribute values rendered as text (`42`, `true`, `ok`).
    pub attributes: HashMap<String, String>,
    /// Linked spans: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// `ok`, `error` or `unset`.
    pub status: &'static str,
}

impl CollectedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A collector on a free loopback port; point `telemetry.otlp_endpoint` at [`Collector::endpoint`].
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
}

impl Collector {
    pub async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { addr, spans }
    }

    /// The base URL the exporters append `/v1/traces` to.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.lock().expect("spans lock").clone()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<CollectedSpan>>>>, body: Bytes) -> Response {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, "not an ExportTraceServiceRequest").into_response();
    };
    let mut got = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(|kv| text(kv.value.as_ref()))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                let status = match span.status.as_ref().map(|s| s.code) {
                    Some(1) => "ok",
                    Some(2) => "error",
                    _ => "unset",
                };
                got.push(CollectedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    status,
                });
            }
        }
    }
    spans.lock().expect("spans lock").extend(got);
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
