//! The admin API (`/admin/v1/…`): tenants and their keys, for operators. Served on its own
//! listener (`api.admin_listen`), or on the public one when that is empty. Behind one operator
//! token, `api.admin_token`, compared in constant time; when the token is empty the admin API
//! does not exist (every path answers 404, as an unknown path does). Tenant API keys never
//! open it, and the operator token opens nothing under `/v1`. A source address that fails
//! too often is answered 429 for a while (`crate::auth::attempts`).
//!
//! This module holds the admin router and its token check; `tenants/` and `keys/` the
//! endpoints, one file each, and `errors.rs` their store errors as answers.

pub mod errors;
pub mod keys;
pub mod tenants;

use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use axum::routing::{get, post};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

pub fn router(state: &AppState) -> Router<AppState> {
    let api = &state.settings.api;
    Router::new()
        .route(
            "/admin/v1/tenants",
            post(tenants::create::create_tenant).get(tenants::list::list_tenants),
        )
        .route(
            "/admin/v1/tenants/{id}",
            get(tenants::get::get_tenant).delete(tenants::erase::erase_tenant),
        )
        .route(
            "/admin/v1/tenants/{id}/erasure",
            get(tenants::erasure::get_erasure),
        )
        .route(
            "/admin/v1/tenants/{id}/suspend",
            post(tenants::suspend::suspend_tenant),
        )
        .route(
            "/admin/v1/tenants/{id}/resume",
            post(tenants::resume::resume_tenant),
        )
        .route(
            "/admin/v1/tenants/{id}/limits",
            axum::routing::patch(tenants::limits::update_limits),
        )
        .route(
            "/admin/v1/tenants/{id}/retention",
            axum::routing::patch(tenants::retention::update_retention),
        )
        .route(
            "/admin/v1/tenants/{id}/keys",
            post(keys::create::create_key).get(keys::list::list_keys),
        )
        .route("/admin/v1/keys/{id}", get(keys::get::get_key))
        .route("/admin/v1/keys/{id}/revoke", post(keys::revoke::revoke_key))
        .route("/admin/v1/keys/{id}/rotate", post(keys::rotate::rotate_key))
        .route_layer(from_fn_with_state(state.clone(), require_admin))
        .layer(DefaultBodyLimit::max(api.max_body_bytes))
        .layer(from_fn_with_state(
            Duration::from_millis(api.request_timeout_ms),
            crate::layers::deadline,
        ))
}

/// Middleware of every admin route: 404 when the admin API is disabled, 429 for a source past
/// its failed attempts, 401 without the operator token. Runs before the path, query or body
/// is looked at.
pub async fn require_admin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let expected = &state.settings.api.admin_token;
    if expected.is_empty() {
        return Err(crate::error::no_route().await);
    }
    // Served without connection info (a router driven directly): one shared source.
    let source = req
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
    let now = std::time::Instant::now();
    if let Some(wait) = state.admin_failures.locked_out(source, now) {
        return Err(crate::auth::attempts::locked_out(
            wait,
            "too many failed admin authentications from this address; try again later \
             (api.admin_max_failures)",
        ));
    }
    if !token_matches(req.headers(), expected) {
        state.admin_failures.fail(source, now);
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the admin API needs `Authorization: Bearer <api.admin_token>`",
        ));
    }
    Ok(next.run(req).await)
}

/// Whether the request carries `Bearer <expected>`. Both sides are hashed first, so the
/// constant-time comparison does not even leak the token's length.
fn token_matches(headers: &HeaderMap, expected: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return false;
    };
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    given.ct_eq(&expected).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_matches() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        let token = "0123456789abcdef-operator";
        assert!(token_matches(&with(&format!("Bearer {token}")), token));
        assert!(!token_matches(&with(&format!("Bearer {token}x")), token));
        assert!(!token_matches(&with("Bearer 0123456789abcdef"), token));
        assert!(
            !token_matches(&with(token), token),
            "the scheme is required"
        );
        assert!(!token_matches(&HeaderMap::new(), token));
    }
}
