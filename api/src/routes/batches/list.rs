//! `GET /v1/batches`: a page of the tenant's batches, newest first.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use agentfleet_shared::store::batches;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::QueryParams;
use crate::routes::batches::get::view_of;
use crate::routes::runs::list::cursor::{decode, encode};
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

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
