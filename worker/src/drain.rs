//! Drain on shutdown: stop taking runs, let in-flight iterations finish within the grace
//! period (runs hand themselves back between iterations), then stop what is left mid-iteration
//! and hand it back as interrupted. Handing back spends no recovery.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::control::Registry;
use crate::stop::StopReason;

pub async fn drain(
    tracker: &TaskTracker,
    draining: &CancellationToken,
    active: &Registry,
    grace: Duration,
) {
    draining.cancel();
    tracker.close();
    tracing::info!(
        runs = active.len(),
        grace_ms = grace.as_millis() as u64,
        "draining"
    );
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            runs = active.len(),
            "grace period over; interrupting the remaining runs"
        );
        active.stop_all(StopReason::DrainDeadline);
        if tokio::time::timeout(Duration::from_secs(10), tracker.wait())
            .await
            .is_err()
        {
            tracing::error!("runs did not stop in time; their leases will expire");
        }
    }
    tracing::info!("drained");
}
