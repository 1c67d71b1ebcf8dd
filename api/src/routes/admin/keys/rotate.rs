//! `POST /admin/v1/keys/{id}/rotate`: a new key in its place (its secret shown once); the old
//! one is revoked, or expires after a grace period.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;

use agentfleet_shared::store::keys::{self, Rotated};

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathId};
use crate::routes::admin::errors::key_error;
use crate::routes::admin::keys::expiry::{expiry, seconds};
use crate::state::AppState;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateKey {
    /// How long the old key keeps working (it then expires); 0 or absent: revoked at once.
    #[serde(default)]
    pub grace_secs: Option<u64>,
    /// Expiry of the new key, as for a created key.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

#[utoipa::path(post, path = "/admin/v1/keys/{id}/rotate", tag = "admin", operation_id = "admin_rotate_key",
    params(("id" = uuid::Uuid, Path, description = "The key")), request_body = RotateKey,
    responses((status = 201, description = "The new key (secret shown once) and the old one, revoked or expiring after the grace period", body = Rotated),
              (status = 409, description = "`key_not_valid`: the key is already revoked or expired", body = crate::routes::view::ErrorBody)))]
pub async fn rotate_key(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<RotateKey>,
) -> Result<(StatusCode, Json<Rotated>), ApiError> {
    let grace = match body.grace_secs {
        None | Some(0) => None,
        Some(secs) => Some(seconds("grace_secs", secs)?),
    };
    let expires_at = expiry(body.expires_at, body.expires_in_secs, Utc::now())?;
    let rotated = keys::rotate(&state.pool, id, grace, expires_at)
        .await
        .map_err(key_error)?;
    // The old key is revoked, or its cached entries lack the new expiry.
    state.announcer.announce(Invalidation::Key(id)).await;
    Ok((StatusCode::CREATED, Json(rotated)))
}
