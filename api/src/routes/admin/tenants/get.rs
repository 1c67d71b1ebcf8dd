//! `GET /admin/v1/tenants/{id}`: one tenant with the limits that apply to it.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::tenants;

use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::tenant_error;
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

#[utoipa::path(get, path = "/admin/v1/tenants/{id}", tag = "admin", operation_id = "admin_get_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant", body = TenantView)))]
pub async fn get_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenants::get(&state.pool, id).await.map_err(tenant_error)?;
    Ok(Json(view(&state, tenant)))
}
