//! Store errors of the admin routes, as answers (shared by `keys` and `tenants`).

use axum::http::StatusCode;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::keys::KeyError;

use crate::error::ApiError;

pub(crate) fn key_error(e: KeyError) -> ApiError {
    match e {
        KeyError::TenantNotFound => ApiError::not_found("tenant"),
        KeyError::KeyNotFound => ApiError::not_found("key"),
        KeyError::TenantErased(id) => tenant_erased(id),
        KeyError::NotValid(id) => ApiError::new(
            StatusCode::CONFLICT,
            "key_not_valid",
            format!("key {id} is revoked or expired; create a new key instead"),
        ),
        KeyError::Store(e) => ApiError::unexpected(e),
    }
}

/// 409 `tenant_erased`: the tenant's erasure was requested; nothing of it can change.
pub(crate) fn tenant_erased(id: uuid::Uuid) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "tenant_erased",
        format!("tenant {id} is erased (GET /admin/v1/tenants/{id}/erasure)"),
    )
}

/// A change of a tenant that found no tenant to change: 409 if it is erased (the store's
/// updates leave erased tenants alone), 404 if it does not exist.
pub(crate) async fn tenant_change_error(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    e: StoreError,
) -> ApiError {
    match e {
        StoreError::NotFound => match agentfleet_shared::store::tenants::get(pool, id).await {
            Ok(t) if t.erased_at.is_some() => tenant_erased(id),
            _ => ApiError::not_found("tenant"),
        },
        e => ApiError::unexpected(e),
    }
}

pub(crate) fn tenant_error(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("tenant"),
        e => ApiError::unexpected(e),
    }
}
