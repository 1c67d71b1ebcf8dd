//! The lease heartbeat: a task of its own renews the lease independently of the agent's work.
//! If the lease is lost, or cannot be renewed before it would expire, the run is stopped: by
//! then another worker may have taken it over.

use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::store::transitions::{self, Lease};
use agentfleet_shared::store::{Fence, StoreError};

use crate::deps::Deps;
use crate::stop::{StopReason, StopSignal};

pub fn spawn(deps: Arc<Deps>, fence: Fence, stop: StopSignal) -> JoinHandle<()> {
    tokio::spawn(async move {
        let settings = &deps.settings.worker;
        let (lease, every) = (settings.lease(), settings.lease_renew());
        let mut last_renewed = Instant::now();
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            ticker.tick().await;
            match transitions::renew_lease(&deps.pool, fence, lease).await {
                Ok(Lease::Held) => last_renewed = Instant::now(),
                // The control hint may have been lost: the renewal carries the request too.
                Ok(Lease::InterruptRequested) => {
                    last_renewed = Instant::now();
                    stop.request_interrupt();
                }
                Ok(Lease::CancelRequested) => return stop.stop(StopReason::Cancelled),
                Err(StoreError::LeaseLost { .. }) => {
                    let cancelled = agentfleet_shared::store::runs::get(&deps.pool, fence.run_id)
                        .await
                        .is_ok_and(|r| r.status == RunStatus::Cancelled);
                    return stop.stop(if cancelled {
                        StopReason::Cancelled
                    } else {
                        StopReason::LeaseLost
                    });
                }
                Err(e) => {
                    tracing::warn!(run_id = %fence.run_id, error = %e, "lease renewal failed");
                    // Stop before the lease can expire under us (one renewal interval early).
                    if last_renewed.elapsed() + every >= lease {
                        return stop.stop(StopReason::LeaseLost);
                    }
                }
            }
        }
    })
}
