//! `PATCH /admin/v1/tenants/{id}/retention`: a JSON merge patch of the tenant's own retention
//! windows (docs/operations.md, "Retention").

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value};

use agentfleet_shared::domain::{LEGACY_RETENTION_FIELDS, RetentionOverrides};
use agentfleet_shared::store::tenants;

use crate::error::ApiError;
use crate::extract::{JsonBody, PathId};
use crate::routes::admin::errors::tenant_error;
use crate::routes::admin::tenants::limits::overrides_patch;
use crate::routes::admin::tenants::view::{TenantView, view};
use crate::state::AppState;

/// A JSON merge patch (RFC 7396) of the tenant's own retention windows, in seconds: a number
/// sets a window (0 = kept for ever for this tenant), `null` clears it back to the configured
/// `[retention]`, an absent field is left as it is. The workers' removal reads them at its next
/// batch. The former fields in whole days (`finished_runs_days`, `waiting_runs_days`) are still
/// taken, as that many days.
#[utoipa::path(patch, path = "/admin/v1/tenants/{id}/retention", tag = "admin", operation_id = "admin_update_retention",
    params(("id" = Uuid, Path, description = "The tenant")),
    request_body(content = Object, description = "e.g. `{\"finished_runs_secs\": 604800, \"waiting_runs_secs\": null}`; fields: finished_runs_secs, waiting_runs_secs (seconds, 0–3153600000; 0 keeps for ever); deprecated: finished_runs_days, waiting_runs_days (whole days, 0–36500)"),
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
/// field. A legacy field in days sets (or clears) its window in seconds.
pub fn retention_patch(
    patch: &Map<String, Value>,
) -> Result<(RetentionOverrides, Vec<String>), ApiError> {
    let mut known = RetentionOverrides::fields();
    for (legacy, now) in LEGACY_RETENTION_FIELDS {
        if patch.contains_key(legacy) && patch.contains_key(now) {
            return Err(ApiError::invalid(
                legacy,
                format!("give the window once: {now} (seconds) or {legacy} (days), not both"),
            ));
        }
        // Named as given: past 36500 days, the window in seconds would be refused by a name
        // the caller did not write.
        if patch
            .get(legacy)
            .and_then(Value::as_f64)
            .is_some_and(|d| d > 36_500.0)
        {
            return Err(ApiError::invalid(
                legacy,
                "must be at most 36500 days (0 keeps for ever)",
            ));
        }
        known.push(legacy.to_owned());
    }
    let (set, clear): (RetentionOverrides, Vec<String>) = overrides_patch(
        patch,
        &known,
        "retention window",
        RetentionOverrides::merged,
    )?;
    let clear = clear
        .into_iter()
        .map(|field| {
            LEGACY_RETENTION_FIELDS
                .iter()
                .find(|(legacy, _)| *legacy == field)
                .map_or(field, |(_, now)| (*now).to_owned())
        })
        .collect();
    Ok((set, clear))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_patch_sets_clears_and_names_bad_fields() {
        let (set, clear) = retention_patch(
            json!({"finished_runs_secs": 60, "waiting_runs_secs": null})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(set.finished_runs_secs, Some(60));
        assert_eq!(clear, vec!["waiting_runs_secs".to_owned()]);
        for (bad, field) in [
            (json!({"finished_run_secs": 1}), "finished_run_secs"),
            (json!({"waiting_runs_secs": -1}), "waiting_runs_secs"),
            (json!({"waiting_runs_secs": 1.5}), "waiting_runs_secs"),
            (
                json!({"finished_runs_days": 1, "finished_runs_secs": 60}),
                "finished_runs_days",
            ),
            (json!({"finished_runs_days": 36_501}), "finished_runs_days"),
        ] {
            let err = retention_patch(bad.as_object().unwrap()).unwrap_err();
            assert!(
                err.message.starts_with(&format!("{field}:")),
                "{bad}: {}",
                err.message
            );
        }
    }

    #[test]
    fn a_window_in_days_is_taken_as_seconds() {
        let (set, clear) = retention_patch(
            json!({"finished_runs_days": 7, "waiting_runs_days": null})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(set.finished_runs_secs, Some(7 * 86_400));
        assert_eq!(clear, vec!["waiting_runs_secs".to_owned()]);
    }
}
