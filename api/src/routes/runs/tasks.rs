//! `GET /v1/runs/{id}/tasks`: the tasks (child runs) of a plan-and-solve run.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::{StoreError, plans, runs};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

/// Every task of the run, by round and place; empty for a run that is no plan-and-solve run.
#[utoipa::path(get, path = "/v1/runs/{id}/tasks", tag = "runs", operation_id = "list_run_tasks", params(("id" = uuid::Uuid, Path, description = "The run")),
    responses((status = 200, description = "The run's tasks, by round and place", body = view::TaskList),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn list_tasks(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::TaskList>, ApiError> {
    let run = match runs::get_for_tenant(&state.pool, caller.tenant_id, id).await {
        Ok(run) => run,
        Err(StoreError::NotFound) => return Err(ApiError::not_found("run")),
        Err(e) => return Err(ApiError::unexpected(e)),
    };
    let tasks = if run.agent.mode.is_react() {
        Vec::new()
    } else {
        plans::tasks_of(&state.pool, caller.tenant_id, id)
            .await
            .map_err(ApiError::unexpected)?
    };
    Ok(Json(view::TaskList {
        data: tasks.iter().map(view::Task::from).collect(),
    }))
}
