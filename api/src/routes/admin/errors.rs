//! Store errors of the admin routes, as answers (shared by `keys` and `tenants`).

use axum::http::StatusCode;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::keys::KeyError;

use crate::error::ApiError;

pub(crate) fn key_error(e: KeyError) -> ApiError {
    match e {
        KeyError::TenantNotFound => ApiError::not_found("tenant"),
        KeyError::KeyNotFound => ApiError::not_found("key"),
        KeyError::NotValid(id) => ApiError::new(
            StatusCode::CONFLICT,
            "key_not_valid",
            format!("key {id} is revoked or expired; create a new key instead"),
        ),
        KeyError::Store(e) => ApiError::unexpected(e),
    }
}

pub(crate) fn tenant_error(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("tenant"),
        e => ApiError::unexpected(e),
    }
}
