//! Retention: runs past their tenant's window are removed in the background, in every worker,
//! one batch at a time by whichever worker wins the election for it (`store::retention::attempt`,
//! a transaction-scoped advisory lock, as the sweeper's). The schedule is the fleet's, kept in
//! Postgres: after a batch the next waits to keep removal within `retention.duty_percent` of the
//! time, longer after a slow batch or while runnable runs wait for workers
//! (`retention.yield_pause_ms`), and `retention.interval_ms` once a pass found nothing left.
//! Every worker exports the schedule's gauges, so any of them shows the fleet's figures.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentfleet_shared::store::retention::{self, Attempt, Removed, Schedule};

use crate::deps::Deps;

/// How long a worker waits at least before its next attempt when the schedule's next batch is
/// due at once.
const MIN_WAIT: Duration = Duration::from_millis(50);
/// How long a worker that lost the election waits at least: the winner is running a batch and
/// will be the first to know when the next is due; the others only stand by for it.
const STANDBY_WAIT: Duration = Duration::from_secs(1);

pub fn spawn(deps: Arc<Deps>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let settings = &deps.settings.retention;
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return,
            }
            wait = match retention::attempt(&deps.pool, settings).await {
                Ok(attempt) => after(&attempt, settings.interval()),
                Err(e) => {
                    metrics::counter!("agentfleet_retention_failures_total").increment(1);
                    tracing::warn!(
                        error = %e,
                        "a retention batch failed; tried again after retention.yield_pause_ms"
                    );
                    settings.yield_pause()
                }
            };
        }
    });
}

/// Records what an attempt did; how long to wait before the next one.
fn after(attempt: &Attempt, interval: Duration) -> Duration {
    match attempt {
        Attempt::NotElected(s) => {
            export(s);
            // Another worker's batch: it sets the next time; look again then, or in a while if
            // the batch is still running (the schedule read is the one before it).
            s.wait().clamp(STANDBY_WAIT, interval.max(STANDBY_WAIT))
        }
        Attempt::NotDue(s) => {
            export(s);
            s.wait().clamp(MIN_WAIT, interval.max(MIN_WAIT))
        }
        Attempt::Yielded(s) => {
            export(s);
            metrics::counter!("agentfleet_retention_yields_total").increment(1);
            s.wait().clamp(MIN_WAIT, interval.max(MIN_WAIT))
        }
        Attempt::Batch {
            removed,
            took,
            schedule,
        } => {
            record(removed);
            metrics::histogram!("agentfleet_retention_batch_seconds").record(took.as_secs_f64());
            export(schedule);
            if removed.runs + removed.threads + removed.webhook_deliveries + removed.batches > 0 {
                tracing::debug!(
                    ?removed,
                    took_ms = took.as_millis() as u64,
                    "retention batch"
                );
            }
            schedule.wait().max(MIN_WAIT)
        }
    }
}

fn record(removed: &Removed) {
    for (what, n) in removed.counts() {
        if n > 0 {
            metrics::counter!("agentfleet_retention_removed_total", "what" => what).increment(n);
        }
    }
}

fn export(s: &Schedule) {
    metrics::gauge!("agentfleet_retention_backlog").set(s.backlog as f64);
    metrics::gauge!("agentfleet_retention_last_pass_timestamp")
        .set(s.last_pass_at.timestamp_millis() as f64 / 1000.0);
}

/// Everything due now, regardless of the election and the pacing (tests and tools); counted in
/// the metrics like the background's batches.
pub async fn remove_due(deps: &Deps) -> anyhow::Result<Removed> {
    let removed = retention::remove_due(&deps.pool, &deps.settings.retention).await?;
    record(&removed);
    Ok(removed)
}

/// The counters the alert and the dashboard compute `rate()` on, at 0 from the start.
pub fn register_metrics() {
    for what in Removed::default().counts().map(|(what, _)| what) {
        metrics::counter!("agentfleet_retention_removed_total", "what" => what).absolute(0);
    }
    metrics::counter!("agentfleet_retention_yields_total").absolute(0);
    metrics::counter!("agentfleet_retention_failures_total").absolute(0);
}
