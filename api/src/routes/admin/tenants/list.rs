//! `GET /admin/v1/tenants`: a page of tenants, in creation order.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use agentfleet_shared::store::tenants;

use crate::error::ApiError;
use crate::extract::QueryParams;
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;
use crate::validate;

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantPage {
    pub data: Vec<TenantView>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<Uuid>,
}

/// Read as text and checked here, so every error names its parameter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<String>,
}

#[utoipa::path(get, path = "/admin/v1/tenants", tag = "admin", operation_id = "admin_list_tenants",
    params(("after" = Option<Uuid>, Query, description = "`next_after` of the previous page"),
           ("limit" = Option<u32>, Query, minimum = 1, description = "Page size (`api.default_page_size` when absent, at most `api.max_page_size`)")),
    responses((status = 200, description = "Tenants in creation order", body = TenantPage)))]
pub async fn list_tenants(
    State(state): State<AppState>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<TenantPage>, ApiError> {
    let api = &state.settings.api;
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let after = match q.after.as_deref() {
        None => None,
        Some(a) => Some(validate::uuid("after", a)?),
    };
    let mut rows = tenants::list(&state.pool, after, limit + 1)
        .await
        .map_err(ApiError::unexpected)?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_after = more.then(|| rows.last().map(|t| t.id)).flatten();
    Ok(Json(TenantPage {
        data: rows.into_iter().map(|t| view(&state, t)).collect(),
        next_after,
    }))
}
