//! The sweeper: in every worker, one active at a time. Each tick, whoever takes a
//! transaction-scoped Postgres advisory lock sweeps; the lock is never held between ticks, so
//! a worker that is stopped or partitioned cannot block sweeping. It re-enqueues runs whose
//! lease expired and queued runs whose message seems lost, and dispatches held runs of
//! tenants with room in their running limit (`crate::dispatch`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentfleet_shared::store::runs;

use crate::shared::Shared;

/// Runs re-enqueued per tick at most; the next tick takes the rest.
const SWEEP_LIMIT: i64 = 500;

pub fn spawn(shared: Arc<Shared>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let every = Duration::from_millis(shared.settings.worker.sweep_interval_ms);
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            if let Err(e) = sweep_if_elected(&shared).await {
                tracing::warn!(error = %agentfleet_shared::report::one_line(&e), "sweep failed");
            }
            crate::iteration::write_late_timings(&shared).await;
            if let Err(e) = crate::dispatch::export_backlog(&shared).await {
                tracing::debug!(error = %agentfleet_shared::report::one_line(&e), "backlog not exported");
            }
        }
    });
}

async fn sweep_if_elected(shared: &Shared) -> anyhow::Result<()> {
    // Publishing happens after the election's transaction (two sweepers publishing the same
    // run is harmless: claims are idempotent).
    let requeue_after = Duration::from_millis(shared.settings.worker.requeue_after_ms);
    let Some(ids) = runs::stale_if_elected(&shared.pool, requeue_after, SWEEP_LIMIT).await? else {
        return Ok(());
    };
    publish(shared, &ids).await?;
    crate::dispatch::heal(shared).await?;
    Ok(())
}

async fn publish(shared: &Shared, ids: &[uuid::Uuid]) -> anyhow::Result<()> {
    for id in ids {
        shared.publisher.publish_run(*id).await?;
        metrics::counter!("agentfleet_sweeper_requeued_total").increment(1);
    }
    if !ids.is_empty() {
        tracing::info!(count = ids.len(), "sweeper re-enqueued stale runs");
    }
    Ok(())
}

/// One sweep regardless of the election (tests and tools).
pub async fn sweep_once(shared: &Shared) -> anyhow::Result<usize> {
    let requeue_after = Duration::from_millis(shared.settings.worker.requeue_after_ms);
    let mut conn = shared.pool.acquire().await?;
    let ids = runs::stale(&mut conn, requeue_after, SWEEP_LIMIT).await?;
    drop(conn);
    publish(shared, &ids).await?;
    let dispatched = crate::dispatch::heal(shared).await?;
    Ok(ids.len() + dispatched)
}
