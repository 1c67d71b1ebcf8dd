//! `GET /v1/batches/{id}` (one batch with its counts) and `GET /v1/batches` (a page of them).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::batches::{self, BatchRow};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::extract::QueryParams;
use crate::routes::runs::list::cursor::{decode, encode};
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

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

/// Read as text and checked here, so every error names its parameter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<String>,
    before: Option<String>,
}

#[utoipa::path(get, path = "/v1/batches", tag = "batches", operation_id = "list_batches",
    params(("limit" = Option<u32>, Query, minimum = 1, description = "Page size (`api.default_page_size` when absent)"),
           ("before" = Option<String>, Query, pattern = "^[0-9]{1,16}_[0-9a-f]{32}$", description = "`next` of the previous page")),
    responses((status = 200, description = "A page of batches, newest first", body = view::BatchPage)))]
pub async fn list_batches(
    State(state): State<AppState>,
    Caller(caller): Caller,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<view::BatchPage>, ApiError> {
    let api = &state.settings.api;
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let before = match q.before.as_deref() {
        None => None,
        Some(c) => Some(decode(c).ok_or_else(|| ApiError::invalid("before", "malformed cursor"))?),
    };
    let mut rows =
        batches::list_for_tenant(&state.pool, caller.tenant_id, before, limit as i64 + 1)
            .await
            .map_err(ApiError::unexpected)?;
    let next = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|r| encode(r.created_at, r.id))
    } else {
        None
    };
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(view_of(&state, row).await?);
    }
    Ok(Json(view::BatchPage { batches: out, next }))
}
