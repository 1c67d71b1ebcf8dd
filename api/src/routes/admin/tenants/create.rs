//! `POST /admin/v1/tenants`: a tenant and its first API key (named `default`), whose secret is
//! shown only in this answer.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentfleet_shared::store::keys::{self, KeyInfo};
use agentfleet_shared::store::tenants;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::routes::admin::errors::{key_error, tenant_error};
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// 1 to 200 characters.
    pub name: String,
}

/// A new tenant and its first key (named `default`), whose secret is shown only here.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCreated {
    pub tenant: TenantView,
    pub key: KeyInfo,
    pub api_key: String,
}

#[utoipa::path(post, path = "/admin/v1/tenants", tag = "admin", operation_id = "admin_create_tenant", request_body = CreateTenant,
    responses((status = 201, description = "The tenant and its first key (shown once)", body = TenantCreated)))]
pub async fn create_tenant(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateTenant>,
) -> Result<(StatusCode, Json<TenantCreated>), ApiError> {
    keys::check_name(&body.name).map_err(|m| ApiError::invalid("name", m))?;
    let created = tenants::create(&state.pool, &body.name)
        .await
        .map_err(ApiError::unexpected)?;
    let tenant = tenants::get(&state.pool, created.tenant_id)
        .await
        .map_err(tenant_error)?;
    let key = keys::get(&state.pool, created.key_id)
        .await
        .map_err(key_error)?;
    Ok((
        StatusCode::CREATED,
        Json(TenantCreated {
            tenant: view(&state, tenant),
            key,
            api_key: created.api_key,
        }),
    ))
}
