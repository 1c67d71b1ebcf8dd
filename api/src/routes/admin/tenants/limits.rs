//! `PATCH /admin/v1/tenants/{id}/limits`: a JSON merge patch of the tenant's own limits.

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value};

use agentfleet_shared::domain::LimitOverrides;
use agentfleet_shared::store::tenants;

use crate::auth::invalidation::Invalidation;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathId};
use crate::routes::admin::errors::{tenant_change_error, tenant_error};
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

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
    if current.erased_at.is_some() {
        return Err(crate::routes::admin::errors::tenant_erased(id));
    }
    let tenant = match tenants::update_limits(&state.pool, id, &set, &clear).await {
        Ok(t) => t,
        Err(e) => return Err(tenant_change_error(&state.pool, id, e).await),
    };
    state.announcer.announce(Invalidation::Tenant(id)).await;
    Ok(Json(view(&state, tenant)))
}

/// Splits a merge patch into the limits it sets and those it clears; every error names the
/// field (an unknown one, or a value that is not a non-negative integer in range).
pub fn limits_patch(patch: &Map<String, Value>) -> Result<(LimitOverrides, Vec<String>), ApiError> {
    overrides_patch(
        patch,
        &tenants::limit_fields(),
        "limit",
        LimitOverrides::merged,
    )
}

/// A merge patch of a tenant's overrides of type `T` (limits, retention windows), whose fields
/// are `known`, split into the values it sets and the fields it clears (`null`); every error
/// names the field (`what` says what kind of field is unknown).
pub fn overrides_patch<T: serde::de::DeserializeOwned + Default>(
    patch: &Map<String, Value>,
    known: &[String],
    what: &str,
    merged: fn(&T, &T) -> T,
) -> Result<(T, Vec<String>), ApiError> {
    let mut set = T::default();
    let mut clear = Vec::new();
    for (field, value) in patch {
        if !known.contains(field) {
            return Err(ApiError::invalid(
                field,
                format!("unknown {what}; known: {}", known.join(", ")),
            ));
        }
        if value.is_null() {
            clear.push(field.clone());
            continue;
        }
        let mut one = Map::new();
        one.insert(field.clone(), whole_number(value));
        let parsed: T = serde_json::from_value(Value::Object(one)).map_err(|e| {
            ApiError::invalid(
                field,
                format!("must be a non-negative integer in range ({e})"),
            )
        })?;
        set = merged(&set, &parsed);
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
    use axum::http::StatusCode;
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
