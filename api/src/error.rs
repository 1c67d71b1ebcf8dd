//! The JSON error body of every failed request: `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::extract::rejection::JsonRejection;
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
        if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
            return matches!(e, sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed)
                || matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08")));
        }
        if let Some(StoreError::Db(e)) = cause.downcast_ref::<StoreError>() {
            return matches!(e, sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed);
        }
        cause.downcast_ref::<deadpool_redis::PoolError>().is_some()
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

/// Body problems: malformed JSON is 400, a well-formed body of the wrong shape is 422 (serde
/// names the field), an oversize body is 413.
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let status = rejection.status();
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid_request",
            _ => "malformed_json",
        };
        let message = match &rejection {
            JsonRejection::JsonDataError(e) => std::error::Error::source(e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.body_text()),
            JsonRejection::JsonSyntaxError(e) => std::error::Error::source(e)
                .map(|s| format!("body is not valid JSON: {s}"))
                .unwrap_or_else(|| e.body_text()),
            other => other.body_text(),
        };
        ApiError::new(status, code, message)
    }
}

/// `Json` whose rejections answer with our error body.
#[derive(axum::extract::FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct JsonBody<T>(pub T);
