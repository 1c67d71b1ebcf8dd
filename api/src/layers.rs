//! Middleware that keeps every answer in the documented error shape, whatever happens inside a
//! handler: a deadline (`api.request_timeout_ms`) and a panic both become a JSON error, with
//! the detail in the log only.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use crate::error::ApiError;

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
