//! Fair dispatch from the API (`store::fair_dispatch`): a run is created held when its tenant
//! has a running limit, or is past its fair-share window; then the tenant's held runs that fit
//! its window are dispatched and published.

use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::store::tenants::Principal;

use crate::publish::publish_bounded;
use crate::state::AppState;

/// Whether the caller's runs count against a running limit (and are so created held).
pub fn is_fair(settings: &Settings, caller: &Principal) -> bool {
    caller.limits.over(&settings.limits).max_running_runs > 0
}

/// Dispatches what fits of `tenant`'s held runs and publishes it. Failures are logged: the
/// runs stay held (or queued) in Postgres and the sweeper dispatches or re-publishes them.
pub async fn dispatch_and_publish(state: &AppState, tenant: Uuid) {
    match state.dispatches.write(tenant).await {
        Ok(ids) => publish(state, &ids).await,
        Err(e) => {
            tracing::warn!(%tenant, error = %e, "dispatch failed; the sweeper will dispatch");
        }
    }
}

/// Publishes dispatched runs, bounded like a create's publish.
pub async fn publish(state: &AppState, ids: &[Uuid]) {
    if ids.is_empty() {
        return;
    }
    metrics::counter!("agentfleet_runs_dispatched_total").increment(ids.len() as u64);
    publish_bounded(state, ids).await;
}
