//! Admin API, keys: create, list, get, revoke and rotate a tenant's API keys. A key's secret
//! appears only in the answer that made it.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentfleet_shared::store::keys::{self, CreatedKey, KeyInfo, MAX_SECS, Rotated};

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathId};
use crate::routes::admin::errors::key_error;
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

#[derive(Debug, Serialize, ToSchema)]
pub struct KeyList {
    /// Newest first, revoked and expired keys included.
    pub data: Vec<KeyInfo>,
}

/// The expiry asked for, as an instant after `now`; errors name the field.
pub fn expiry(
    expires_at: Option<DateTime<Utc>>,
    expires_in_secs: Option<u64>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    let at = match (expires_at, expires_in_secs) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "expires_in_secs",
                "give either expires_at or expires_in_secs, not both",
            ));
        }
        (Some(at), None) => {
            keys::check_expiry(at, now).map_err(|m| ApiError::invalid("expires_at", m))?;
            at
        }
        (None, Some(secs)) => now + seconds("expires_in_secs", secs)?,
        (None, None) => return Ok(None),
    };
    Ok(Some(at))
}

/// 1..=[`MAX_SECS`] seconds as a duration; errors name the field.
pub fn seconds(field: &str, secs: u64) -> Result<chrono::Duration, ApiError> {
    if secs == 0 || secs > MAX_SECS {
        return Err(ApiError::invalid(
            field,
            format!("must be within 1..={MAX_SECS}"),
        ));
    }
    Ok(chrono::Duration::seconds(secs as i64))
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

#[utoipa::path(get, path = "/admin/v1/keys/{id}", tag = "admin", operation_id = "admin_get_key",
    params(("id" = uuid::Uuid, Path, description = "The key")),
    responses((status = 200, description = "The key, without its secret", body = KeyInfo)))]
pub async fn get_key(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<KeyInfo>, ApiError> {
    Ok(Json(keys::get(&state.pool, id).await.map_err(key_error)?))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_one_of_two_forms_in_the_future() {
        let now = Utc::now();
        assert_eq!(expiry(None, None, now).unwrap(), None);
        assert_eq!(
            expiry(None, Some(60), now).unwrap(),
            Some(now + chrono::Duration::seconds(60))
        );
        let past = now - chrono::Duration::seconds(1);
        assert!(
            expiry(Some(past), None, now)
                .unwrap_err()
                .message
                .starts_with("expires_at:")
        );
        let both = expiry(Some(now), Some(1), now).unwrap_err();
        assert!(
            both.message.starts_with("expires_in_secs:"),
            "{}",
            both.message
        );
        assert!(expiry(None, Some(0), now).is_err());
        assert!(expiry(None, Some(MAX_SECS + 1), now).is_err());
    }
}
