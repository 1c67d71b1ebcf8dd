//! The sweeper: in every worker, one active at a time. Each tick, whoever takes a
//! transaction-scoped Postgres advisory lock sweeps; the lock is never held between ticks, so
//! a worker that is stopped or partitioned cannot block sweeping. It re-enqueues runs whose
//! lease expired and queued runs whose message seems lost, dispatches held runs of
//! tenants with room in their running limit (`crate::fair_dispatch`), and folds the
//! active-run counts (`store::active_runs`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentfleet_shared::store::{active_runs, runs};

use crate::deps::Deps;

/// Runs re-enqueued per tick at most; the next tick takes the rest.
const SWEEP_LIMIT: i64 = 500;
/// Tenants whose active-run deltas one tick folds at most; the next tick takes the rest.
const FOLD_TENANTS: i64 = 1000;

pub fn spawn(deps: Arc<Deps>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let every = Duration::from_millis(deps.settings.worker.sweep_interval_ms);
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            if let Err(e) = crate::fair_dispatch::register(&deps).await {
                tracing::warn!(error = %agentfleet_shared::report::one_line(&e), "could not refresh this worker's slots");
            }
            if let Err(e) = sweep_if_elected(&deps).await {
                tracing::warn!(error = %agentfleet_shared::report::one_line(&e), "sweep failed");
            }
            crate::iteration::write_late_timings(&deps).await;
            if let Err(e) = crate::fair_dispatch::export_backlog(&deps).await {
                tracing::debug!(error = %agentfleet_shared::report::one_line(&e), "backlog not exported");
            }
        }
    });
}

async fn sweep_if_elected(deps: &Deps) -> anyhow::Result<()> {
    // Publishing happens after the election's transaction (two sweepers publishing the same
    // run is harmless: claims are idempotent).
    let requeue_after = Duration::from_millis(deps.settings.worker.requeue_after_ms);
    let Some(ids) = runs::stale_if_elected(&deps.pool, requeue_after, SWEEP_LIMIT).await? else {
        return Ok(());
    };
    publish(deps, &ids).await?;
    agentfleet_shared::store::fair_dispatch::prune_workers(&deps.pool).await?;
    crate::fair_dispatch::heal(deps).await?;
    active_runs::fold(&deps.pool, FOLD_TENANTS).await?;
    Ok(())
}

async fn publish(deps: &Deps, ids: &[uuid::Uuid]) -> anyhow::Result<()> {
    for id in ids {
        deps.publisher.publish_run(*id).await?;
        metrics::counter!("agentfleet_sweeper_requeued_total").increment(1);
    }
    if !ids.is_empty() {
        tracing::info!(count = ids.len(), "sweeper re-enqueued stale runs");
    }
    Ok(())
}

/// One sweep regardless of the election (tests and tools).
pub async fn sweep_once(deps: &Deps) -> anyhow::Result<usize> {
    let requeue_after = Duration::from_millis(deps.settings.worker.requeue_after_ms);
    let mut conn = deps.pool.acquire().await?;
    let ids = runs::stale(&mut conn, requeue_after, SWEEP_LIMIT).await?;
    drop(conn);
    publish(deps, &ids).await?;
    let dispatched = crate::fair_dispatch::heal(deps).await?;
    Ok(ids.len() + dispatched)
}
