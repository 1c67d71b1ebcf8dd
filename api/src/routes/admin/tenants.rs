//! Admin API, tenants: create, list, get, suspend, resume, and per-tenant limits.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use agentfleet_shared::domain::{LimitOverrides, Limits};
use agentfleet_shared::store::keys::{self, KeyInfo};
use agentfleet_shared::store::tenants::{self, TenantInfo};

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathId, QueryParams};
use crate::routes::admin::errors::{key_error, tenant_error};
use crate::state::AppState;
use crate::validate;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// 1 to 200 characters.
    pub name: String,
}

/// A tenant with the limits that apply to it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantView {
    #[serde(flatten)]
    pub tenant: TenantInfo,
    /// Its own limits over the configured `[limits]` (0 = no limit).
    #[schema(value_type = Object)]
    pub effective_limits: Limits,
}

/// A new tenant and its first key (named `default`), whose secret is shown only here.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCreated {
    pub tenant: TenantView,
    pub key: KeyInfo,
    pub api_key: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantPage {
    pub data: Vec<TenantView>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<Uuid>,
}

fn view(state: &AppState, tenant: TenantInfo) -> TenantView {
    TenantView {
        effective_limits: tenant.limits.over(&state.settings.limits),
        tenant,
    }
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

/// Read as text and checked here, so every error names its parameter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<String>,
}

#[utoipa::path(get, path = "/admin/v1/tenants", tag = "admin", operation_id = "admin_list_tenants",
    params(("after" = Option<Uuid>, Query, description = "`next_after` of the previous page"),
           ("limit" = Option<u32>, Query, minimum = 1, description = "Page size (`api.default_page_size` when absent, at most `api.max_page_size`)")),
    responses((status = 200, description = "Tenants in creation order", body = TenantPage)))]
pub async fn list_tenants(
    State(state): State<AppState>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<TenantPage>, ApiError> {
    let api = &state.settings.api;
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let after = match q.after.as_deref() {
        None => None,
        Some(a) => Some(validate::uuid("after", a)?),
    };
    let mut rows = tenants::list(&state.pool, after, limit + 1)
        .await
        .map_err(ApiError::unexpected)?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_after = more.then(|| rows.last().map(|t| t.id)).flatten();
    Ok(Json(TenantPage {
        data: rows.into_iter().map(|t| view(&state, t)).collect(),
        next_after,
    }))
}

#[utoipa::path(get, path = "/admin/v1/tenants/{id}", tag = "admin", operation_id = "admin_get_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant", body = TenantView)))]
pub async fn get_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenants::get(&state.pool, id).await.map_err(tenant_error)?;
    Ok(Json(view(&state, tenant)))
}

#[utoipa::path(post, path = "/admin/v1/tenants/{id}/suspend", tag = "admin", operation_id = "admin_suspend_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant, suspended: its keys read and cancel, nothing new starts (within `api.auth_cache_ttl_ms`)", body = TenantView)))]
pub async fn suspend_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenants::set_suspended(&state.pool, id, true)
        .await
        .map_err(tenant_error)?;
    state.announcer.announce(Invalidation::Tenant(id)).await;
    Ok(Json(view(&state, tenant)))
}

#[utoipa::path(post, path = "/admin/v1/tenants/{id}/resume", tag = "admin", operation_id = "admin_resume_tenant",
    params(("id" = Uuid, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant, active again", body = TenantView)))]
pub async fn resume_tenant(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = tenants::set_suspended(&state.pool, id, false)
        .await
        .map_err(tenant_error)?;
    state.announcer.announce(Invalidation::Tenant(id)).await;
    // Its held runs go now rather than at the next sweep.
    crate::fair_dispatch::dispatch_and_publish(&state, id).await;
    Ok(Json(view(&state, tenant)))
}

/// A JSON merge patch (RFC 7396) of the tenant's own limits: a number sets a limit (0 = no
/// limit for this tenant), `null` clears it back to the configured default, an absent field
/// is left as it is.
#[utoipa::path(patch, path = "/admin/v1/tenants/{id}/limits", tag = "admin", operation_id = "admin_update_limits",
    params(("id" = Uuid, Path, description = "The tenant")),
    request_body(content = Object, description = "e.g. `{\"max_running_runs\": 4, \"tokens_per_day\": null}`; fields: requests_per_second, request_burst, max_active_runs, max_running_runs, max_batch_size, tokens_per_day"),
    responses((status = 200, description = "The tenant with its limits", body = TenantView)))]
pub async fn update_limits(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(patch): JsonBody<Map<String, Value>>,
) -> Result<Json<TenantView>, ApiError> {
    let (set, clear) = limits_patch(&patch)?;
    // The tenant's limits as they would be must make sense together (a burst below the rate).
    let current = tenants::get(&state.pool, id).await.map_err(tenant_error)?;
    let mut after = serde_json::to_value(current.limits).map_err(ApiError::unexpected)?;
    if let Some(own) = after.as_object_mut() {
        for field in &clear {
            own.remove(field);
        }
    }
    let after: LimitOverrides = serde_json::from_value(after).map_err(ApiError::unexpected)?;
    after
        .merged(&set)
        .over(&state.settings.limits)
        .check()
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    let tenant = tenants::update_limits(&state.pool, id, &set, &clear)
        .await
        .map_err(tenant_error)?;
    state.announcer.announce(Invalidation::Tenant(id)).await;
    Ok(Json(view(&state, tenant)))
}

/// Splits a merge patch into the limits it sets and those it clears; every error names the
/// field (an unknown one, or a value that is not a non-negative integer in range).
pub fn limits_patch(patch: &Map<String, Value>) -> Result<(LimitOverrides, Vec<String>), ApiError> {
    let known = tenants::limit_fields();
    let mut set = LimitOverrides::default();
    let mut clear = Vec::new();
    for (field, value) in patch {
        if !known.contains(field) {
            return Err(ApiError::invalid(
                field,
                format!("unknown limit; known: {}", known.join(", ")),
            ));
        }
        if value.is_null() {
            clear.push(field.clone());
            continue;
        }
        let mut one = Map::new();
        one.insert(field.clone(), whole_number(value));
        let parsed: LimitOverrides = serde_json::from_value(Value::Object(one)).map_err(|e| {
            ApiError::invalid(
                field,
                format!("must be a non-negative integer in range ({e})"),
            )
        })?;
        set = set.merged(&parsed);
    }
    Ok((set, clear))
}

/// `5.0` is the integer 5, as elsewhere in the API (`crate::extract::JsonBody`).
fn whole_number(value: &Value) -> Value {
    match value.as_f64() {
        Some(f) if value.is_f64() && f.fract() == 0.0 && (0.0..1.8e19).contains(&f) => {
            Value::from(f as u64)
        }
        _ => value.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(v: Value) -> Result<(LimitOverrides, Vec<String>), ApiError> {
        limits_patch(v.as_object().unwrap())
    }

    #[test]
    fn a_patch_sets_clears_and_names_bad_fields() {
        let (set, clear) =
            patch(json!({"max_running_runs": 4, "tokens_per_day": null, "request_burst": 2.0}))
                .unwrap();
        assert_eq!(set.max_running_runs, Some(4));
        assert_eq!(set.request_burst, Some(2));
        assert_eq!(set.tokens_per_day, None);
        assert_eq!(clear, vec!["tokens_per_day".to_owned()]);
        let err = patch(json!({"max_runing_runs": 4})).unwrap_err();
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            err.message.starts_with("max_runing_runs:"),
            "{}",
            err.message
        );
        for bad in [json!(-1), json!("4"), json!(1.5), json!(5_000_000_000u64)] {
            let err = patch(json!({"max_batch_size": bad})).unwrap_err();
            assert!(
                err.message.starts_with("max_batch_size:"),
                "{}",
                err.message
            );
        }
        let err = patch(json!({"bogus": null})).unwrap_err();
        assert!(err.message.starts_with("bogus:"), "{}", err.message);
    }
}
