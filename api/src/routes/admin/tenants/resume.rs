//! `POST /admin/v1/tenants/{id}/resume`: the tenant is active again; its held runs go at once.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::tenants;

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::tenant_change_error;
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

#[utoipa::path(post, path = "/admin/v1/tenants/{id}/resume", tag = "admin", operation_id = "admin_resume_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant, active again", body = TenantView)))]
pub async fn resume_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenants::set_suspended(&state.pool, id, false).await;
    let tenant = match tenant {
        Ok(t) => t,
        Err(e) => return Err(tenant_change_error(&state.pool, id, e).await),
    };
    state.announcer.announce(Invalidation::Tenant(id)).await;
    // Its held runs go now rather than at the next sweep.
    crate::fair_dispatch::dispatch_and_publish(&state, id).await;
    Ok(Json(view(&state, tenant)))
}
