//! `POST /admin/v1/tenants/{id}/suspend`: its keys keep reading and cancelling, nothing new starts.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::tenants;

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::tenant_change_error;
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

#[utoipa::path(post, path = "/admin/v1/tenants/{id}/suspend", tag = "admin", operation_id = "admin_suspend_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant, suspended: its keys read and cancel, nothing new starts (within `api.auth_cache_ttl_ms`)", body = TenantView)))]
pub async fn suspend_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenants::set_suspended(&state.pool, id, true).await;
    let tenant = match tenant {
        Ok(t) => t,
        Err(e) => return Err(tenant_change_error(&state.pool, id, e).await),
    };
    state.announcer.announce(Invalidation::Tenant(id)).await;
    Ok(Json(view(&state, tenant)))
}
