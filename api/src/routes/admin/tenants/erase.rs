//! `DELETE /admin/v1/tenants/{id}`: erases the tenant. Its keys are refused at once, its runs
//! are cancelled, then every row and Redis key of it is removed in the background; the answer
//! is the erasure's status (`GET /admin/v1/tenants/{id}/erasure` follows it).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use agentfleet_shared::store::erasure::{self, Erasure};

use crate::auth::invalidation::Invalidation;
use crate::erasure::{Eraser, new_owner, spawn};
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::tenant_error;
use crate::state::AppState;

#[utoipa::path(delete, path = "/admin/v1/tenants/{id}", tag = "admin", operation_id = "admin_erase_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 202, description = "Erasure under way: the tenant's keys are refused (on every API replica at once, and at most `api.auth_cache_ttl_ms` later whatever happens to the announcement), its runs are being cancelled, and its rows and Redis keys are removed in the background. Repeating the call changes nothing", body = Erasure),
              (status = 200, description = "The tenant was erased already: the erasure's proof (`remaining`: every table at 0)", body = Erasure)))]
pub async fn erase_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<(StatusCode, Json<Erasure>), ApiError> {
    let requested = erasure::request(&state.pool, id)
        .await
        .map_err(tenant_error)?;
    // This replica refuses the keys from now on; the others as soon as they hear.
    state.auth_cache.invalidate(|p| p.tenant_id == id);
    state.announcer.announce(Invalidation::Tenant(id)).await;
    let mut current = requested.erasure;
    if current.status == "done" {
        return Ok((StatusCode::OK, Json(current)));
    }
    if requested.new {
        tracing::info!(tenant = %id, keys_revoked = current.keys_revoked, "tenant erasure requested");
    }
    // Driven from here at once (unless a driver holds it already); any replica's sweep takes
    // it over if this one stops.
    let owner = new_owner();
    let lease = state.settings.erasure.lease_ms.get();
    if erasure::take(&state.pool, id, &owner, lease)
        .await
        .map_err(ApiError::unexpected)?
    {
        spawn(Eraser::of(&state), id, owner);
        if let Some(now) = erasure::get(&state.pool, id)
            .await
            .map_err(ApiError::unexpected)?
        {
            current = now;
        }
    }
    Ok((StatusCode::ACCEPTED, Json(current)))
}
