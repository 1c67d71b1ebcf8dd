//! Per-tenant quotas checked at the top of the create handlers, before anything is written:
//! the size of a batch (`limits.max_batch_size`) and the runs not yet ended
//! (`limits.max_active_runs`). The request rate is a layer of its own (`rate_limit`).
//!
//! **Active runs** are the tenant's runs `queued`, `running`, `waiting_for_input` or
//! `waiting_for_confirmation`, with the items of its batches whose runs are not created yet
//! (each will be a run), read from the counts triggers keep (`store::active_runs`) only when
//! the limit is above 0. A create that would take the count past the limit is refused with 429
//! `too_many_active_runs` and `Retry-After: 1`; nothing is written. The check is exact: it is
//! made in the transaction that inserts the runs, under the tenant's creation lock
//! (`store::active_runs::reserve`; single creates grouped together take the locks of all their
//! tenants at once), so creates of one tenant arriving at once, on one replica or several, can
//! never together pass the limit. A batch is also checked once before its runs are parsed and
//! validated, without the lock, so a tenant at its limit costs one query.

use axum::http::StatusCode;
use uuid::Uuid;

use agentfleet_shared::domain::Limits;
use agentfleet_shared::store::tenants::Principal;
use agentfleet_shared::store::{StoreError, active_runs};

use crate::error::ApiError;
use crate::state::AppState;

/// The tenant's effective limits.
pub fn limits_of(state: &AppState, principal: &Principal) -> Limits {
    principal.limits.over(&state.settings.limits)
}

/// Most runs one batch of this tenant may hold: `api.max_batch_runs`, lowered by
/// `limits.max_batch_size` when that is set.
pub fn max_batch_runs(limits: &Limits, api_max: usize) -> usize {
    match limits.max_batch_size as usize {
        0 => api_max,
        own => own.min(api_max),
    }
}

/// 422 naming `runs` unless the batch holds 1 to [`max_batch_runs`] runs.
pub fn check_batch_size(
    state: &AppState,
    principal: &Principal,
    runs: usize,
) -> Result<(), ApiError> {
    let max = max_batch_runs(
        &limits_of(state, principal),
        state.settings.api.max_batch_runs,
    );
    check_batch_len(runs, max)
}

/// 422 naming `runs` unless `runs` is within 1..=`max`.
pub fn check_batch_len(runs: usize, max: usize) -> Result<(), ApiError> {
    if runs == 0 || runs > max {
        if runs > max {
            metrics::counter!("agentfleet_requests_limited_total", "reason" => "batch_size")
                .increment(1);
        }
        return Err(ApiError::invalid(
            "runs",
            format!("must hold 1 to {max} runs"),
        ));
    }
    Ok(())
}

/// Refuses `new_runs` more runs when the tenant's active runs would exceed
/// `limits.max_active_runs` (without the creation lock: the exact check is [`reserve`]).
pub async fn check_active_runs(
    state: &AppState,
    principal: &Principal,
    new_runs: usize,
) -> Result<(), ApiError> {
    let max = limits_of(state, principal).max_active_runs;
    if max == 0 {
        return Ok(());
    }
    let active = active_runs::count(&state.pool, principal.tenant_id)
        .await
        .map_err(ApiError::unexpected)?;
    match active_runs::check(active, max, new_runs) {
        Ok(()) => Ok(()),
        Err(_) => Err(too_many_active_runs(max, active, new_runs)),
    }
}

/// The answer to a create refused by `limits.max_active_runs` (counted as limited).
pub fn too_many_active_runs(max: u32, active: i64, new_runs: usize) -> ApiError {
    metrics::counter!("agentfleet_requests_limited_total", "reason" => "active_runs").increment(1);
    ApiError {
        // Runs end on their own; a retry a moment later may fit.
        retry_after_secs: Some(1),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_active_runs",
            format!(
                "this tenant may have at most {max} runs not yet ended (queued, running or waiting); it has {active}, and this request adds {new_runs}"
            ),
        )
    }
}

/// The tenant's `max_active_runs` when it has one (0: none), for the create's transaction to
/// reserve under its lock (`store::active_runs::reserve`).
pub fn active_runs_limit(state: &AppState, principal: &Principal) -> Option<u32> {
    Some(limits_of(state, principal).max_active_runs).filter(|max| *max > 0)
}

/// `store::active_runs::reserve` in `tx`, its refusal answered as [`too_many_active_runs`].
pub async fn reserve(
    tx: &mut sqlx::PgConnection,
    tenant: Uuid,
    max: u32,
    new_runs: usize,
) -> Result<(), ApiError> {
    active_runs::reserve(tx, tenant, max, new_runs)
        .await
        .map_err(refusal)
}

/// A store error as the API answers it: [`StoreError::TooManyActiveRuns`] as
/// [`too_many_active_runs`], anything else unexpected.
pub fn refusal(e: StoreError) -> ApiError {
    match e {
        StoreError::TooManyActiveRuns {
            max,
            active,
            new_runs,
        } => too_many_active_runs(max, active, new_runs),
        e => ApiError::unexpected(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_batch_size: u32) -> Limits {
        Limits {
            requests_per_second: 0,
            request_burst: 0,
            max_active_runs: 0,
            max_running_runs: 0,
            max_batch_size,
            tokens_per_day: 0,
        }
    }

    #[test]
    fn a_tenants_batch_size_only_lowers_the_deployments() {
        assert_eq!(max_batch_runs(&limits(0), 1000), 1000);
        assert_eq!(max_batch_runs(&limits(10), 1000), 10);
        assert_eq!(max_batch_runs(&limits(5000), 1000), 1000);
    }
}
