//! `POST /admin/v1/keys/{id}/revoke`: every API replica refuses the key from then on.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::keys::{self, KeyInfo};

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::key_error;
use crate::state::AppState;

#[utoipa::path(post, path = "/admin/v1/keys/{id}/revoke", tag = "admin", operation_id = "admin_revoke_key",
    params(("id" = uuid::Uuid, Path, description = "The key")),
    responses((status = 200, description = "The key, revoked (again: no change). Every API replica refuses it within `api.auth_cache_ttl_ms`", body = KeyInfo)))]
pub async fn revoke_key(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<KeyInfo>, ApiError> {
    let revoked = keys::revoke(&state.pool, id).await.map_err(key_error)?;
    state.announcer.announce(Invalidation::Key(id)).await;
    Ok(Json(revoked))
}
