//! `GET /v1/runs/{id}`: one run of the caller's tenant (another tenant's answers 404).

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::{StoreError, plans, runs};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

/// `GET /v1/runs/{id}`: the run, with its pending question or calls while it waits, and a
/// plan-and-solve run's plan.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", operation_id = "get_run", params(("id" = uuid::Uuid, Path, description = "The run")),
    responses((status = 200, description = "The run, with `pending` while it waits", body = view::Run),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn get_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::Run>, ApiError> {
    let run = match runs::get_for_tenant(&state.pool, caller.tenant_id, id).await {
        Ok(run) => run,
        Err(StoreError::NotFound) => return Err(ApiError::not_found("run")),
        Err(e) => return Err(ApiError::unexpected(e)),
    };
    let mut answer = view::run(&run);
    if !run.agent.mode.is_react() {
        let tasks = plans::tasks_of(&state.pool, caller.tenant_id, id)
            .await
            .map_err(ApiError::unexpected)?;
        answer.plan = Some(view::plan(&run, &tasks));
    }
    Ok(Json(answer))
}
