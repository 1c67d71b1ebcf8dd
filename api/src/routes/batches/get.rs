//! `GET /v1/batches/{id}`: one batch with its counts (and how every answer of a batch is made).

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::batches::{self, BatchRow};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/batches/{id}", tag = "batches", operation_id = "get_batch",
    params(("id" = uuid::Uuid, Path, description = "The batch")),
    responses((status = 200, description = "The batch: counts per status, times, usage", body = view::Batch),
              (status = 404, description = "No batch of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn get_batch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::Batch>, ApiError> {
    let row = load(&state, caller.tenant_id, id).await?;
    Ok(Json(view_of(&state, row).await?))
}

/// The tenant's batch, or 404.
pub async fn load(
    state: &AppState,
    tenant: uuid::Uuid,
    id: uuid::Uuid,
) -> Result<BatchRow, ApiError> {
    match batches::get_for_tenant(&state.pool, tenant, id).await {
        Ok(row) => Ok(row),
        Err(StoreError::NotFound) => Err(ApiError::not_found("batch")),
        Err(e) => Err(ApiError::unexpected(e)),
    }
}

/// The batch with its counts. `started_at` is recorded by the first such read whose counts
/// show a run past `queued`. When the counts show every run ended but the batch is not yet
/// marked finished (the sweep comes within `api.batch_sweep_interval_ms`), it is finished now,
/// so an answer never shows all runs ended under a status that says otherwise.
pub async fn view_of(state: &AppState, row: BatchRow) -> Result<view::Batch, ApiError> {
    let counts = batches::counts(&state.pool, row.id)
        .await
        .map_err(ApiError::unexpected)?;
    let ended = counts.active() == 0 && (counts.pending == 0 || row.is_cancelled());
    let mut row = row;
    // (A finished batch's was settled by the finish.)
    if row.started_at.is_none() && !row.is_finished() && counts.created() > counts.of("queued") {
        // A run has left `queued`: the batch's start is recorded now, once.
        row.started_at = batches::note_started(&state.pool, row.id)
            .await
            .map_err(ApiError::unexpected)?;
    }
    let row = if ended && matches!(row.status.as_str(), "in_progress" | "cancelling") {
        crate::batch_driver::finish(state, row.id)
            .await
            .map_err(ApiError::unexpected)?
            .unwrap_or(row)
    } else {
        row
    };
    Ok(view::batch(&row, &counts))
}
