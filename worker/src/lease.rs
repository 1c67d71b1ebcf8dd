//! The lease heartbeat: one task per worker renews the leases of all the runs it holds, in one
//! statement each `worker.lease_renew_ms`, independently of the runs' work. A run whose lease
//! is lost, or could not be renewed before it would expire, is stopped: by then another worker
//! may have taken it over.
//!
//! One statement a tick rather than one per run: a worker holding a thousand runs that wait on
//! their models renewed 330 leases a second, each its own statement and commit, the largest
//! share of Postgres's work at that load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::store::transitions::{self, Lease};
use agentfleet_shared::store::{Fence, StoreError};

use crate::deps::Deps;
use crate::stop::{StopReason, StopSignal};

/// The runs whose leases this worker renews.
#[derive(Clone, Default)]
pub struct Leases {
    held: Arc<Mutex<HashMap<Uuid, Held>>>,
}

struct Held {
    fence: Fence,
    stop: StopSignal,
    /// When its lease was last known to run `worker.lease_ms` from: the claim, then each
    /// renewal.
    renewed: Instant,
}

/// A run's place among the renewed leases; dropping it (the holding ended, or its task
/// panicked and unwound) stops the renewals, so the lease lapses if the run was not ended.
pub struct Holding {
    leases: Leases,
    run_id: Uuid,
    attempt: i32,
}

impl Drop for Holding {
    fn drop(&mut self) {
        // A later attempt of the same run in this worker keeps its own entry.
        self.leases.release(Fence {
            run_id: self.run_id,
            attempt: self.attempt,
        });
    }
}

impl Leases {
    /// Renews `fence`'s lease (taken just now, by the claim) until the returned holding drops;
    /// `stop` is told when the lease is lost, or a cancel or an interrupt was asked for.
    pub fn hold(&self, fence: Fence, stop: StopSignal) -> Holding {
        let held = Held {
            fence,
            stop,
            renewed: Instant::now(),
        };
        self.held
            .lock()
            .expect("leases lock")
            .insert(fence.run_id, held);
        Holding {
            leases: self.clone(),
            run_id: fence.run_id,
            attempt: fence.attempt,
        }
    }

    /// Stops renewing `fence`'s lease before the holding ends: for a write that takes the run
    /// out of `running` itself (a planner's round), after which a renewal would find the lease
    /// gone and stop the holding while it still announces what it committed.
    pub fn release(&self, fence: Fence) {
        let mut held = self.held.lock().expect("leases lock");
        if held
            .get(&fence.run_id)
            .is_some_and(|h| h.fence.attempt == fence.attempt)
        {
            held.remove(&fence.run_id);
        }
    }

    fn fences(&self) -> Vec<Fence> {
        self.held
            .lock()
            .expect("leases lock")
            .values()
            .map(|h| h.fence)
            .collect()
    }

    /// Applies one tick's outcome to the runs still held by the same attempt.
    fn settle(&self, outcomes: Vec<(Fence, Renewal)>, deps: &Deps) {
        let (lease, every) = (
            deps.settings.worker.lease(),
            deps.settings.worker.lease_renew(),
        );
        let mut lost = Vec::new();
        {
            let mut held = self.held.lock().expect("leases lock");
            for (fence, outcome) in outcomes {
                let Some(h) = held
                    .get_mut(&fence.run_id)
                    .filter(|h| h.fence.attempt == fence.attempt)
                else {
                    continue;
                };
                match outcome {
                    Renewal::Renewed(Lease::Held) => h.renewed = Instant::now(),
                    // The control hint may have been lost: the renewal carries the request too.
                    Renewal::Renewed(Lease::InterruptRequested) => {
                        h.renewed = Instant::now();
                        h.stop.request_interrupt();
                    }
                    Renewal::Renewed(Lease::CancelRequested) => h.stop.stop(StopReason::Cancelled),
                    Renewal::Lost => lost.push((fence, h.stop.clone())),
                    // Skipped (its row was busy) or not renewed (Postgres): stop before the
                    // lease can expire under us, one renewal interval early.
                    Renewal::NotRenewed => {
                        if h.renewed.elapsed() + every >= lease {
                            tracing::warn!(run_id = %fence.run_id,
                                "lease not renewed in time; stopping the run");
                            h.stop.stop(StopReason::LeaseLost);
                        }
                    }
                }
            }
        }
        for (fence, stop) in lost {
            let pool = deps.pool.clone();
            tokio::spawn(async move {
                let cancelled = agentfleet_shared::store::runs::get(&pool, fence.run_id)
                    .await
                    .is_ok_and(|r| r.status == RunStatus::Cancelled);
                stop.stop(if cancelled {
                    StopReason::Cancelled
                } else {
                    StopReason::LeaseLost
                });
            });
        }
    }
}

/// What a tick did to one run's lease.
enum Renewal {
    Renewed(Lease),
    /// Skipped (another statement held its row) or failed (Postgres): tried again next tick.
    NotRenewed,
    /// The fence no longer holds.
    Lost,
}

/// Renews the leases of `deps.leases` every `worker.lease_renew_ms` until `shutdown`.
pub fn spawn(deps: Arc<Deps>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let settings = &deps.settings.worker;
        let (lease, every) = (settings.lease(), settings.lease_renew());
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let fences = deps.leases.fences();
            if fences.is_empty() {
                continue;
            }
            let outcomes = match transitions::renew_leases(&deps.pool, &fences, lease).await {
                Ok(outcomes) => fences
                    .into_iter()
                    .zip(outcomes)
                    .map(|(fence, outcome)| {
                        let renewal = match outcome {
                            Ok(Some(lease)) => Renewal::Renewed(lease),
                            Ok(None) => Renewal::NotRenewed,
                            Err(StoreError::LeaseLost { .. }) => Renewal::Lost,
                            Err(_) => Renewal::NotRenewed,
                        };
                        (fence, renewal)
                    })
                    .collect(),
                Err(e) => {
                    tracing::warn!(runs = fences.len(), error = %e, "lease renewal failed");
                    fences
                        .into_iter()
                        .map(|f| (f, Renewal::NotRenewed))
                        .collect()
                }
            };
            deps.leases.settle(outcomes, &deps);
        }
    });
}
