//! `GET /admin/v1/tenants/{id}/keys`: the tenant's keys, newest first, without secrets.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use agentfleet_shared::store::keys::{self, KeyInfo};

use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::admin::errors::key_error;
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct KeyList {
    /// Newest first, revoked and expired keys included.
    pub data: Vec<KeyInfo>,
}

#[utoipa::path(get, path = "/admin/v1/tenants/{id}/keys", tag = "admin", operation_id = "admin_list_keys",
    params(("id" = uuid::Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant's keys, without secrets", body = KeyList)))]
pub async fn list_keys(
    State(state): State<AppState>,
    PathId(tenant): PathId,
) -> Result<Json<KeyList>, ApiError> {
    let data = keys::list(&state.pool, tenant).await.map_err(key_error)?;
    Ok(Json(KeyList { data }))
}
