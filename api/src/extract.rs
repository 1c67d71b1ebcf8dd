//! What handlers take from a request, with every rejection answered in our error body
//! (`crate::error`): a JSON body checked for what no endpoint can store, query parameters, and
//! a path id.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

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

/// A JSON request body whose every rejection answers with our error body. Before the body is
/// read as `T`, it is checked for what no endpoint can store (see [`crate::validate::storable`]),
/// so that rule holds for every field of every endpoint, present and future.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    AppState: FromRef<S>,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected a request with `Content-Type: application/json`",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(status, "payload_too_large", "request body too large")
            } else {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "malformed_body",
                    "the request body could not be read",
                )
            }
        })?;
        let max_values = AppState::from_ref(state).settings.api.max_json_values;
        if crate::validate::more_json_values_than(&bytes, max_values) {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "the request body holds more than {max_values} JSON values (api.max_json_values)"
                ),
            ));
        }
        if crate::validate::may_be_unstorable(&bytes)
            && let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes)
        {
            crate::validate::storable(&value, &mut String::new())?;
        }
        match Json::<T>::from_bytes(&bytes) {
            Ok(Json(value)) => Ok(JsonBody(value)),
            Err(JsonRejection::JsonDataError(e)) => {
                // A JSON number is a number: `5.0` is the integer 5 (JSON Schema's `integer`
                // says so too), which serde's integer fields refuse. Read such a body again
                // with its whole floats written as integers; other errors stand.
                let retried = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|mut v| integral_floats_as_integers(&mut v).then_some(v))
                    .and_then(|v| serde_json::from_value::<T>(v).ok());
                retried
                    .map(JsonBody)
                    .ok_or_else(|| JsonRejection::JsonDataError(e).into())
            }
            Err(other) => Err(other.into()),
        }
    }
}

/// Rewrites every float with no fractional part within the integer range as that integer;
/// says whether any was.
fn integral_floats_as_integers(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            let Some(f) = n.as_f64().filter(|_| n.is_f64()) else {
                return false;
            };
            if f.fract() != 0.0 {
                return false;
            }
            let integer = if (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) {
                serde_json::Number::from(f as i64)
            } else if (0.0..1.844_674_407_370_955_2e19).contains(&f) {
                serde_json::Number::from(f as u64)
            } else {
                return false;
            };
            *n = integer;
            true
        }
        // Every element is visited (no short circuit): all of them are rewritten.
        Value::Array(items) => items
            .iter_mut()
            .map(integral_floats_as_integers)
            .fold(false, |any, changed| any | changed),
        Value::Object(map) => map
            .values_mut()
            .map(integral_floats_as_integers)
            .fold(false, |any, changed| any | changed),
        _ => false,
    }
}

/// `application/json`, or any `application/*+json`, with or without parameters.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.strip_prefix("application/") {
        Some(subtype) => subtype == "json" || subtype.ends_with("+json"),
        None => false,
    }
}

/// Query parameters whose rejections (a malformed or repeated parameter, an unknown one)
/// answer 422 with our error body, naming the parameter.
pub struct QueryParams<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(q)| QueryParams(q))
            .map_err(|rejection| {
                // The parameters are read as text and checked by the endpoint, so what is left
                // here is an unknown or repeated parameter, which serde names.
                let message = std::error::Error::source(&rejection)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "malformed query string".to_owned());
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    format!("query: {message}"),
                )
            })
    }
}

/// A path id: any malformed one answers 422 naming the parameter (ids are `format: uuid` in
/// the OpenAPI document). Runs after authentication.
pub struct PathId(pub uuid::Uuid);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|_| ApiError::invalid("id", "must be a UUID"))?;
        crate::validate::uuid("id", &raw).map(PathId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_floats_become_integers_and_nothing_else_changes() {
        let mut v = serde_json::json!({"a": 5.0, "b": [1.5, -3.0, 7], "c": "5.0", "d": 1e30});
        assert!(integral_floats_as_integers(&mut v));
        assert_eq!(
            v,
            serde_json::json!({"a": 5, "b": [1.5, -3, 7], "c": "5.0", "d": 1e30})
        );
        let mut v = serde_json::json!({"a": 5, "b": 1.5});
        assert!(!integral_floats_as_integers(&mut v));
    }
}
