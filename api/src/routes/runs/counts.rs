//! `GET /v1/runs/counts`: runs per status among the newest ones matching the filters.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use agentfleet_shared::store::runs;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::QueryParams;
use crate::routes::runs::list::optional_uuid;
use crate::routes::view;
use crate::state::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountQuery {
    thread_id: Option<String>,
    batch_id: Option<String>,
}

/// `GET /v1/runs/counts`: how many of the newest `api.count_window` runs matching the filters
/// are in each status (what a dashboard polls; bounded whatever the tenant's history).
#[utoipa::path(get, path = "/v1/runs/counts", tag = "runs", operation_id = "count_runs",
    params(("thread_id" = Option<uuid::Uuid>, Query, description = "Only runs of this thread"),
           ("batch_id" = Option<uuid::Uuid>, Query, description = "Only runs of this batch")),
    responses((status = 200, description = "Runs per status among the newest `window` runs matching the filters", body = view::RunCounts)))]
pub async fn count_runs(
    State(state): State<AppState>,
    Caller(caller): Caller,
    QueryParams(q): QueryParams<CountQuery>,
) -> Result<Json<view::RunCounts>, ApiError> {
    let thread_id = optional_uuid("thread_id", q.thread_id.as_deref())?;
    let batch_id = optional_uuid("batch_id", q.batch_id.as_deref())?;
    let window = i64::from(state.settings.api.count_window);
    let rows = runs::count_by_status(&state.pool, caller.tenant_id, thread_id, batch_id, window)
        .await
        .map_err(ApiError::unexpected)?;
    Ok(Json(view::run_counts(&rows, window)))
}
