//! Bearer-key authentication for everything under `/v1`.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

use agentfleet_shared::store::tenants::{self, Principal};

use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller. Every resource is looked up within its tenant, so another
/// tenant's resources answer 404.
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        principal_from(&parts.headers, state).await.map(Caller)
    }
}

/// The principal behind the request's `Authorization: Bearer <api key>`.
pub async fn principal_from(
    headers: &axum::http::HeaderMap,
    state: &AppState,
) -> Result<Principal, ApiError> {
    let unauthorized = |msg: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg);
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <api key>"))?;
    let key = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .ok_or_else(|| unauthorized("Authorization must be `Bearer <api key>`"))?;
    let hash = tenants::hash_key(key);
    state
        .auth_cache
        .get_or_lookup(&hash, || tenants::authenticate_hash(&state.pool, &hash))
        .await
        .map_err(ApiError::unexpected)?
        .ok_or_else(|| unauthorized("unknown or revoked API key"))
}

/// Authorization for event streams: a stream token (`?token=`) for the given run, or the
/// API key. Returns the tenant.
pub struct StreamAuth;

impl StreamAuth {
    pub async fn resolve(
        state: &AppState,
        headers: &axum::http::HeaderMap,
        token: Option<&str>,
        run: Option<uuid::Uuid>,
    ) -> Result<uuid::Uuid, ApiError> {
        if let (Some(token), Some(run)) = (token, run) {
            return state
                .tokens
                .verify(token, run, chrono::Utc::now().timestamp())
                .map_err(|e| {
                    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
                });
        }
        Ok(principal_from(headers, state).await?.tenant_id)
    }
}
