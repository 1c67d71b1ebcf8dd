//! `GET /admin/v1/keys/{id}`: one key, without its secret.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::keys::{self, KeyInfo};

use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::key_error;
use crate::state::AppState;

#[utoipa::path(get, path = "/admin/v1/keys/{id}", tag = "admin", operation_id = "admin_get_key",
    params(("id" = uuid::Uuid, Path, description = "The key")),
    responses((status = 200, description = "The key, without its secret", body = KeyInfo)))]
pub async fn get_key(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<KeyInfo>, ApiError> {
    Ok(Json(keys::get(&state.pool, id).await.map_err(key_error)?))
}
