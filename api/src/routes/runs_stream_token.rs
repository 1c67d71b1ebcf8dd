//! `POST /v1/runs/{id}/stream-token`: a short-lived token for one run's event stream, for
//! browsers (`new EventSource(url)` cannot send an `Authorization` header).

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use agentfleet_shared::store::{StoreError, runs};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::PathId;
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/runs/{id}/stream-token", tag = "events", params(("id" = String, Path)),
    responses((status = 200, description = "`{token, expires_at, url}`", body = Object), (status = 404)),
    security(("bearer" = [])))]
pub async fn issue_stream_token(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    let run_id = id;
    match runs::get_for_tenant(&state.pool, caller.tenant_id, run_id).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::not_found("run")),
        Err(e) => return Err(ApiError::unexpected(e)),
    }
    let ttl = state.settings.api.stream_token_ttl_secs as i64;
    let expires = chrono::Utc::now().timestamp() + ttl;
    let token = state.tokens.issue(run_id, caller.tenant_id, expires);
    Ok(Json(json!({
        "token": token,
        "expires_at": chrono::DateTime::from_timestamp(expires, 0),
        "url": format!("/v1/runs/{run_id}/events?token={token}"),
    })))
}
