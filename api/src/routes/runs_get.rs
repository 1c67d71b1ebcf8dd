use axum::Json;
use axum::extract::State;
use serde_json::Value;

use agentfleet_shared::store::{StoreError, runs};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::{PathId, view};
use crate::state::AppState;

/// `GET /v1/runs/{id}`: the run, with its pending question or calls while it waits.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "The run, with `pending` while it waits", body = Object), (status = 404)),
    security(("bearer" = [])))]
pub async fn get_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    match runs::get_for_tenant(&state.pool, caller.tenant_id, id).await {
        Ok(run) => Ok(Json(view::run_json(&run))),
        Err(StoreError::NotFound) => Err(ApiError::not_found("run")),
        Err(e) => Err(ApiError::unexpected(e)),
    }
}
