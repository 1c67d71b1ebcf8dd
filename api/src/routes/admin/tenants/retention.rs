//! `PATCH /admin/v1/tenants/{id}/retention`: a JSON merge patch of the tenant's own retention
//! windows (docs/operations.md, "Retention").

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value};

use agentfleet_shared::domain::RetentionOverrides;
use agentfleet_shared::store::tenants;

use crate::error::ApiError;
use crate::extract::{JsonBody, PathId};
use crate::routes::admin::errors::tenant_error;
use crate::routes::admin::tenants::limits::overrides_patch;
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

/// A JSON merge patch (RFC 7396) of the tenant's own retention windows, in days: a number sets
/// a window (0 = kept for ever for this tenant), `null` clears it back to the configured
/// `[retention]`, an absent field is left as it is. The workers' removal reads them at its next
/// batch.
#[utoipa::path(patch, path = "/admin/v1/tenants/{id}/retention", tag = "admin", operation_id = "admin_update_retention",
    params(("id" = Uuid, Path, description = "The tenant")),
    request_body(content = Object, description = "e.g. `{\"finished_runs_days\": 7, \"waiting_runs_days\": null}`; fields: finished_runs_days, waiting_runs_days (0–36500)"),
    responses((status = 200, description = "The tenant with its retention", body = TenantView)))]
pub async fn update_retention(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(patch): JsonBody<Map<String, Value>>,
) -> Result<Json<TenantView>, ApiError> {
    let (set, clear) = retention_patch(&patch)?;
    // Checked on the values set: a cleared window falls back to the configured one, which the
    // configuration's own checks passed.
    set.over(&state.settings.retention.windows())
        .check()
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    let tenant = tenants::update_retention(&state.pool, id, &set, &clear)
        .await
        .map_err(tenant_error)?;
    Ok(Json(view(&state, tenant)))
}

/// Splits a merge patch into the windows it sets and those it clears; every error names the
/// field.
pub fn retention_patch(
    patch: &Map<String, Value>,
) -> Result<(RetentionOverrides, Vec<String>), ApiError> {
    overrides_patch(
        patch,
        &RetentionOverrides::fields(),
        "retention window",
        RetentionOverrides::merged,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_patch_sets_clears_and_names_bad_fields() {
        let (set, clear) = retention_patch(
            json!({"finished_runs_days": 7, "waiting_runs_days": null})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(set.finished_runs_days, Some(7));
        assert_eq!(clear, vec!["waiting_runs_days".to_owned()]);
        for bad in [
            json!({"finished_run_days": 1}),
            json!({"waiting_runs_days": -1}),
        ] {
            let err = retention_patch(bad.as_object().unwrap()).unwrap_err();
            assert!(
                err.message.starts_with("finished_run_days:")
                    || err.message.starts_with("waiting_runs_days:"),
                "{}",
                err.message
            );
        }
    }
}
