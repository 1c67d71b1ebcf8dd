//! `POST /v1/runs/{id}/stream-token`: a short-lived token for one run's event stream, for
//! browsers (`new EventSource(url)` cannot send an `Authorization` header). The token is
//! bound to the key that asked for it: it is refused once that key is revoked or expires.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::{StoreError, runs};

use crate::auth::caller::Caller;
use crate::auth::stream_token::TokenClaims;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/runs/{id}/stream-token", tag = "events", operation_id = "issue_stream_token", params(("id" = uuid::Uuid, Path, description = "The run")),
    responses((status = 200, description = "A token for the run's event stream", body = view::StreamToken),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn issue_stream_token(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::StreamToken>, ApiError> {
    let run_id = id;
    match runs::get_for_tenant(&state.pool, caller.tenant_id, run_id).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::not_found("run")),
        Err(e) => return Err(ApiError::unexpected(e)),
    }
    let ttl = state.settings.api.stream_token_ttl_secs as i64;
    let mut expires = chrono::Utc::now().timestamp().saturating_add(ttl);
    // Never past the key's own expiry (the key is checked on each use too).
    if let Some(key_expires) = caller.expires_at {
        expires = expires.min(key_expires.timestamp());
    }
    let claims = TokenClaims {
        tenant: caller.tenant_id,
        key: caller.key_id,
    };
    let token = state.tokens.issue(run_id, claims, expires);
    Ok(Json(view::StreamToken {
        url: format!("/v1/runs/{run_id}/events?token={token}"),
        token,
        expires_at: chrono::DateTime::from_timestamp(expires, 0)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
    }))
}
