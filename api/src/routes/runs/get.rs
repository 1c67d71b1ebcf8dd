//! `GET /v1/runs/{id}`: one run of the caller's tenant (another tenant's answers 404).

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::{StoreError, runs};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

/// `GET /v1/runs/{id}`: the run, with its pending question or calls while it waits.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", operation_id = "get_run", params(("id" = uuid::Uuid, Path, description = "The run")),
    responses((status = 200, description = "The run, with `pending` while it waits", body = view::Run),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn get_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::Run>, ApiError> {
    match runs::get_for_tenant(&state.pool, caller.tenant_id, id).await {
        Ok(run) => Ok(Json(view::run(&run))),
        Err(StoreError::NotFound) => Err(ApiError::not_found("run")),
        Err(e) => Err(ApiError::unexpected(e)),
    }
}
