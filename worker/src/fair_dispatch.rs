//! Fair dispatch from the worker (`store::fair_dispatch`): when a run under the fair share or a
//! running limit leaves its slot (ends, pauses, is cancelled), the tenant's next held runs are
//! dispatched and published; the sweeper dispatches whatever that missed.
//!
//! Dispatches of one tenant are spaced (`fair_share.dispatch_spacing_ms`): the first end
//! dispatches at once, and ends that come while a dispatch of the same tenant runs, or within
//! the spacing after it, are served by one more dispatch at the spacing's end. A tenant draining a
//! backlog ends hundreds of runs a second, and a dispatch for each (a statement that counts the
//! tenant's runs in flight, and most often finds less than a chunk free) cost more Postgres CPU
//! than the runs' own ends; spaced, it costs one statement per tenant and spacing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use agentfleet_shared::store::fair_dispatch;

use crate::deps::Deps;

/// Tenants whose held runs one sweep dispatches at most; the next sweep takes the rest.
const HEAL_TENANTS: i64 = 200;
/// Tenants whose backlog is exported as a metric, largest first.
const BACKLOG_TENANTS: i64 = 20;

/// The tenants whose backlog gauge was last set.
static EXPORTED: std::sync::Mutex<Vec<Uuid>> = std::sync::Mutex::new(Vec::new());

/// The tenants with a dispatch running or spaced on this worker, each with whether another
/// end asked for one meanwhile.
#[derive(Default)]
pub struct Spacing(Mutex<HashMap<Uuid, bool>>);

impl Spacing {
    /// Whether the caller should start the tenant's dispatches (none runs); otherwise the
    /// running one is told to dispatch once more.
    fn start(&self, tenant: Uuid) -> bool {
        let mut tenants = self.0.lock().expect("dispatch spacing lock");
        match tenants.get_mut(&tenant) {
            Some(again) => {
                *again = true;
                false
            }
            None => {
                tenants.insert(tenant, false);
                true
            }
        }
    }

    /// After a dispatch and its spacing: whether to dispatch again (an end asked meanwhile);
    /// if not, the tenant's dispatches stop.
    fn again(&self, tenant: Uuid) -> bool {
        let mut tenants = self.0.lock().expect("dispatch spacing lock");
        match tenants.get_mut(&tenant) {
            Some(again) if *again => {
                *again = false;
                true
            }
            _ => {
                tenants.remove(&tenant);
                false
            }
        }
    }
}

/// After a fair run's holding ended: dispatch the next of its tenant, without holding the
/// run's slot while it is written, spaced from the tenant's other dispatches (see the module).
pub fn after_holding(deps: Arc<Deps>, tenant: Uuid) {
    if !deps.dispatch_spacing.start(tenant) {
        return;
    }
    let spacing = Duration::from_millis(deps.settings.fair_share.dispatch_spacing_ms);
    tokio::spawn(async move {
        loop {
            match deps.writes.dispatches.write(tenant).await {
                Ok(ids) => publish(&deps, &ids).await,
                Err(e) => {
                    tracing::warn!(%tenant, error = %e, "dispatch failed; the sweeper will dispatch");
                }
            }
            if !spacing.is_zero() {
                tokio::time::sleep(spacing).await;
            }
            if !deps.dispatch_spacing.again(tenant) {
                return;
            }
        }
    });
}

async fn publish(deps: &Deps, ids: &[Uuid]) {
    if ids.is_empty() {
        return;
    }
    metrics::counter!("agentfleet_runs_dispatched_total").increment(ids.len() as u64);
    if let Err(e) = deps.publisher.publish_runs(ids).await {
        tracing::warn!(run_ids = ?e.failed, error = %e, "publish failed; the sweeper will re-enqueue");
    }
}

/// The sweeper's part: dispatch the held runs of every tenant that has room (a dispatch
/// missed by a process that died, a raised limit, a lifted suspension). Returns how many runs
/// were dispatched.
pub async fn heal(deps: &Deps) -> anyhow::Result<usize> {
    let tenants = fair_dispatch::tenants_with_held(&deps.pool, HEAL_TENANTS).await?;
    if tenants.is_empty() {
        return Ok(0);
    }
    let done = fair_dispatch::next(
        &deps.pool,
        &tenants,
        deps.settings.limits.max_running_runs,
        deps.settings.fair_share.share(),
        fair_dispatch::MAX_PER_TENANT,
    )
    .await?;
    publish(deps, &done.ids()).await;
    Ok(done.runs.len())
}

/// Registers this worker's slots for the fair share's windows (at start and every sweep tick, so
/// the registration stays younger than `fair_share.worker_ttl_ms`), and exports the window.
pub async fn register(deps: &Deps) -> anyhow::Result<()> {
    fair_dispatch::register_worker(
        &deps.pool,
        &deps.worker_id,
        deps.settings.worker.concurrency.get(),
    )
    .await?;
    let window = fair_dispatch::window(&deps.pool, deps.settings.fair_share.share()).await?;
    metrics::gauge!("agentfleet_fair_share_window_runs").set(window as f64);
    Ok(())
}

/// This worker's goodbye as it stops taking runs: its slots leave the windows at once.
pub async fn unregister(deps: &Deps) {
    if let Err(e) = fair_dispatch::forget_worker(&deps.pool, &deps.worker_id).await {
        tracing::warn!(error = %e, "could not remove this worker's slots; they expire with fair_share.worker_ttl_ms");
    }
}

/// Exports the backlog (every worker, each sweep tick, so no worker shows a stale figure):
/// `agentfleet_runnable_runs` (what workers may take now: the autoscaling signal),
/// `agentfleet_held_runs` and, for the tenants holding most,
/// `agentfleet_tenant_held_runs{tenant}`.
pub async fn export_backlog(deps: &Deps) -> anyhow::Result<()> {
    let backlog = fair_dispatch::backlog(&deps.pool, BACKLOG_TENANTS).await?;
    metrics::gauge!("agentfleet_runnable_runs").set(backlog.runnable as f64);
    metrics::gauge!("agentfleet_oldest_runnable_age_seconds").set(backlog.oldest_runnable_secs);
    metrics::gauge!("agentfleet_held_runs").set(backlog.held as f64);
    // A tenant that left the largest backlogs (or drained) reads 0, not its last figure.
    let mut exported = EXPORTED.lock().expect("backlog gauge lock");
    for tenant in std::mem::take(&mut *exported) {
        if !backlog.held_by_tenant.iter().any(|(t, _)| *t == tenant) {
            metrics::gauge!("agentfleet_tenant_held_runs", "tenant" => tenant.to_string()).set(0.0);
        }
    }
    for (tenant, n) in backlog.held_by_tenant {
        metrics::gauge!("agentfleet_tenant_held_runs", "tenant" => tenant.to_string())
            .set(n as f64);
        exported.push(tenant);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_during_a_dispatch_make_one_more_then_the_tenant_stops() {
        let spacing = Spacing::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        assert!(spacing.start(a), "the first end dispatches");
        assert!(spacing.start(b), "tenants are spaced apart from each other");
        assert!(!spacing.start(a));
        assert!(!spacing.start(a));
        assert!(spacing.again(a), "the ends meanwhile: one more dispatch");
        assert!(!spacing.again(a), "nothing asked since: stop");
        assert!(spacing.start(a), "a later end dispatches at once");
        assert!(!spacing.again(b));
    }
}
