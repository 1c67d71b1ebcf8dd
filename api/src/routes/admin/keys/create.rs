//! `POST /admin/v1/tenants/{id}/keys`: a new API key of the tenant; its secret appears only in
//! this answer.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;

use agentfleet_shared::store::keys::{self, CreatedKey};

use crate::error::ApiError;
use crate::extract::{JsonBody, PathId};
use crate::routes::admin::errors::key_error;
use crate::routes::admin::keys::expiry::expiry;
use crate::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// 1 to 200 characters, e.g. where the key is used.
    pub name: String,
    /// When the key stops working (RFC 3339, in the future). At most one of `expires_at`
    /// and `expires_in_secs`; neither: the key never expires.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

#[utoipa::path(post, path = "/admin/v1/tenants/{id}/keys", tag = "admin", operation_id = "admin_create_key",
    params(("id" = uuid::Uuid, Path, description = "The tenant")), request_body = CreateKey,
    responses((status = 201, description = "The key and its secret (shown once)", body = CreatedKey)))]
pub async fn create_key(
    State(state): State<AppState>,
    PathId(tenant): PathId,
    JsonBody(body): JsonBody<CreateKey>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    keys::check_name(&body.name).map_err(|m| ApiError::invalid("name", m))?;
    let expires_at = expiry(body.expires_at, body.expires_in_secs, Utc::now())?;
    let created = keys::create(&state.pool, tenant, &body.name, expires_at)
        .await
        .map_err(key_error)?;
    Ok((StatusCode::CREATED, Json(created)))
}
