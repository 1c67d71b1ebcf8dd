//! `GET /admin/v1/tenants/{id}/erasure`: where the tenant's erasure is, and once it is done, its
//! proof (every table counted at 0).

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::erasure::{self, Erasure};

use crate::error::ApiError;
use crate::extract::PathId;
use crate::state::AppState;

#[utoipa::path(get, path = "/admin/v1/tenants/{id}/erasure", tag = "admin", operation_id = "admin_get_erasure",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The erasure: `status` (`erasing`, `done`), `phase`, when it was requested, started and finished, what it cancelled, revoked and deleted (rows per table, Redis keys), and `remaining`: the rows per table left (counted when deletion began less what was deleted since; counted again by each verification: every table at 0 once done)", body = Erasure),
              (status = 404, description = "No tenant has that id, or its erasure was never requested", body = crate::routes::view::ErrorBody)))]
pub async fn get_erasure(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<Erasure>, ApiError> {
    erasure::get(&state.pool, id)
        .await
        .map_err(ApiError::unexpected)?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("erasure"))
}
