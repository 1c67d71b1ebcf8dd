//! The JSON error body of every failed request: `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use agentfleet_shared::store::StoreError;

/// A rendered API error. Route error enums convert into it.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_secs: None,
        }
    }
    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }
    /// A field failed validation: 422 naming it.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("{field}: {message}"),
        )
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after_secs: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }
    /// An unexpected failure: logged with its cause, answered without internals. Failures to
    /// reach a dependency answer 503 with a retry hint: nothing was accepted.
    pub fn unexpected(err: impl Into<anyhow::Error>) -> ApiError {
        let err = err.into();
        if is_transient(&err) {
            tracing::warn!(error = %agentfleet_shared::report::one_line(&err), "dependency unavailable");
            return ApiError::unavailable("a backing service is unavailable; retry shortly");
        }
        tracing::error!(error = %agentfleet_shared::report::one_line(&err), "unexpected error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }
}

fn is_transient(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        // The database unreachable, restarting or busy, a statement out of time
        // (`database.statement_timeout_ms`) or a lock waited for too long
        // (`database.lock_timeout_ms`): a lock held elsewhere. Trying again later may succeed.
        if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
            return agentfleet_shared::store::is_transient_db(e);
        }
        if let Some(e) = cause.downcast_ref::<StoreError>() {
            return e.is_transient();
        }
        cause
            .downcast_ref::<agentfleet_shared::events::AppendError>()
            .is_some_and(|e| e.is_unavailable())
    })
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
        let mut resp = (self.status, body).into_response();
        if let Some(secs) = self.retry_after_secs {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// The answer for a path no endpoint serves.
pub async fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no endpoint at this path; GET /openapi.json lists them",
    )
}

/// The answer for a method an endpoint does not serve; the router adds `Allow`.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not serve that method; `Allow` lists those it does",
    )
}
