//! Middleware that keeps every answer in the documented error shape, whatever happens inside a
//! handler: a deadline (`api.request_timeout_ms`) and a panic both become a JSON error, with
//! the detail in the log only. And the request's span, when traces are exported.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use agentfleet_shared::telemetry;

use crate::error::ApiError;

/// The span of one request. With traces exported: an OpenTelemetry server span, the child of
/// the caller's W3C `traceparent` when it sent a valid one (anything malformed is ignored and
/// the span starts a trace of its own), named after its route once routing has matched it.
/// Health probes get none. Without export: tower-http's usual debug span (free unless
/// `RUST_LOG` asks for it).
pub fn request_span(req: &Request) -> tracing::Span {
    if !telemetry::exporting() {
        return tower_http::trace::MakeSpan::make_span(
            &mut tower_http::trace::DefaultMakeSpan::new(),
            req,
        );
    }
    let path = req.uri().path();
    if matches!(path, "/healthz" | "/readyz") {
        return tracing::Span::none();
    }
    let method = req.method().as_str();
    let span = tracing::info_span!(
        "http.request",
        otel.name = method,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        url.path = path,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(parent) = telemetry::remote_context_of_http(req.headers()) {
        telemetry::set_parent(&span, parent);
    }
    span
}

/// Names the request's span after the route it matched (`POST /v1/runs/{id}/resume`): a
/// route layer, where the matched path is known. Added only when traces are exported.
pub async fn name_span(req: Request, next: Next) -> Response {
    if let Some(path) = req.extensions().get::<MatchedPath>() {
        let span = tracing::Span::current();
        span.record("http.route", path.as_str());
        telemetry::rename(&span, format!("{} {}", req.method(), path.as_str()));
    }
    next.run(req).await
}

/// Records the answer's status on the request's span (a server error marks it failed).
pub fn record_status(response: &Response, latency: Duration, span: &tracing::Span) {
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    tracing::debug!(
        status = status.as_u16(),
        ?latency,
        "finished processing request"
    );
}

/// Answers 408 `request_timeout` when a handler has not answered within `timeout` (an event
/// stream counts as answered once its headers are sent).
pub async fn deadline(State(timeout): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(?timeout, "request timed out");
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request took too long; retry it (with the same Idempotency-Key)",
            )
            .into_response()
        }
    }
}

/// Answers 500 `internal` when a handler panics, instead of dropping the connection.
pub async fn catch_panic(req: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(response) => response,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = %what, "handler panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::middleware::{from_fn, from_fn_with_state};
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn answer_of(router: Router, path: &str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_panic_is_a_json_500_without_its_message() {
        let router = Router::new()
            .route(
                "/boom",
                get(|| async {
                    if true {
                        panic!("secret detail: postgres://db.internal");
                    }
                    "unreachable"
                }),
            )
            .layer(from_fn(catch_panic));
        let answer = answer_of(router, "/boom").await;
        assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
        assert!(
            answer.ends_with(r#"{"error":{"code":"internal","message":"internal error"}}"#),
            "{answer}"
        );
        assert!(!answer.contains("secret"), "{answer}");
    }

    #[tokio::test]
    async fn a_slow_handler_is_a_json_408() {
        let router = Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "late"
                }),
            )
            .layer(from_fn_with_state(Duration::from_millis(50), deadline));
        let answer = answer_of(router, "/slow").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    }
}
