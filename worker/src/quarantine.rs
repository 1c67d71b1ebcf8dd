//! Quarantine: a run taken over more than `worker.max_recoveries` times after its worker
//! vanished may be the cause, or it may only have shared its workers with the cause (a run
//! that crashes its worker takes every run of that worker down with it) or have been unlucky
//! (workers killed from outside). It is not failed on suspicion: its next attempt runs alone
//! in a worker, and only if that worker dies holding it is the run failed as poison (the claim
//! that takes the quarantine attempt over, `claim`). Otherwise it ends, pauses or fails as any
//! run does.
//!
//! Alone: the quarantine's slot takes every slot of the worker (the intake takes no delivery
//! while none is free, and resumes once they all are again), and the worker's other runs hand
//! themselves back at their next safe point, as in a drain (no recovery spent, no call
//! repeated). Only then is the quarantine recorded (`transitions::quarantine`) and the run
//! started. One quarantine at a time per worker: another run at the limit claimed meanwhile
//! is handed straight back, for another worker. A drain hands the quarantined run back like
//! any run: leaving cleanly is not a crash.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::transitions::{self, Claimed};

use crate::deps::Deps;
use crate::run;
use crate::stop::StopSignal;

/// This worker's quarantine: whether a run holds (or is emptying) it alone, and the signal
/// the other runs hand themselves back on.
pub struct Quarantine {
    busy: AtomicBool,
    /// Cancelled by a drain, and by the start of a quarantine; a fresh one replaces it then.
    handback: Mutex<CancellationToken>,
    draining: CancellationToken,
}

impl Quarantine {
    pub fn new(draining: CancellationToken) -> Quarantine {
        Quarantine {
            busy: AtomicBool::new(false),
            handback: Mutex::new(draining.child_token()),
            draining,
        }
    }

    /// What a run starting now hands itself back on, between iterations: the worker's drain,
    /// or a quarantine beginning here.
    pub fn handback(&self) -> CancellationToken {
        self.handback.lock().expect("quarantine lock").clone()
    }

    /// Takes this worker's quarantine, and tells the runs already here to hand themselves
    /// back; `None` if another run holds it.
    fn begin(&self) -> Option<Begun<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        let mut handback = self.handback.lock().expect("quarantine lock");
        handback.cancel();
        *handback = self.draining.child_token();
        metrics::gauge!("agentfleet_quarantined_runs_in_flight").set(1.0);
        Some(Begun(self))
    }
}

/// Held while a run has this worker's quarantine; let go when dropped (also by a panic).
struct Begun<'a>(&'a Quarantine);

impl Drop for Begun<'_> {
    fn drop(&mut self) {
        metrics::gauge!("agentfleet_quarantined_runs_in_flight").set(0.0);
        self.0.busy.store(false, Ordering::SeqCst);
    }
}

/// Runs `claimed` (at the limit of take-overs) alone in this worker: waits for every other
/// slot of `slots` (the claim's own slot is held by the caller), records the quarantine, and
/// executes the run. Hands it back instead when another quarantine holds the worker or the
/// worker drains meanwhile; stops when the run is cancelled or its lease lost.
pub async fn run_alone(
    deps: Arc<Deps>,
    claimed: Claimed,
    stop: StopSignal,
    quarantine: Arc<Quarantine>,
    slots: Arc<Semaphore>,
) {
    let fence = claimed.fence();
    let Some(begun) = quarantine.begin() else {
        tracing::info!(run_id = %fence.run_id,
            "run at the limit of take-overs; another quarantine holds this worker: handed back");
        hand_back(&deps, &claimed).await;
        return;
    };
    tracing::warn!(run_id = %fence.run_id, recoveries = claimed.run.recoveries,
        "run at the limit of take-overs: emptying this worker to run it alone in quarantine");
    // Emptying the worker takes as long as its runs' current iterations: the lease is renewed
    // meanwhile, and dropped before the run's own holding takes over.
    let holding = deps.leases.hold(fence, stop.clone());
    let others = u32::from(deps.settings.worker.concurrency.get()) - 1;
    let alone: OwnedSemaphorePermit = tokio::select! {
        all = slots.acquire_many_owned(others) => all.expect("the slots are never closed"),
        () = quarantine.draining.cancelled() => {
            drop(holding);
            hand_back(&deps, &claimed).await;
            return;
        }
        // Cancelled, or the lease lost: nothing of the run to do here.
        () = stop.stopped() => return,
    };
    match Box::pin(transitions::quarantine(&deps.pool, fence)).await {
        Ok(()) => {}
        Err(StoreError::LeaseLost { .. }) => return,
        Err(e) => {
            // Not recorded, not run: some worker quarantines it again.
            tracing::warn!(run_id = %fence.run_id, error = %e, "quarantine not recorded; handing the run back");
            drop(holding);
            hand_back(&deps, &claimed).await;
            return;
        }
    }
    metrics::counter!("agentfleet_quarantined_runs_total").increment(1);
    tracing::warn!(run_id = %fence.run_id, attempt = fence.attempt,
        "running the run alone in quarantine: should this worker die now, the run is poison");
    // The fault suite watches the worker hold nothing else here.
    if let Some(pause) = agentfleet_shared::failpoint::delay("quarantine:alone") {
        tokio::time::sleep(pause).await;
    }
    drop(holding);
    let mut claimed = claimed;
    claimed.run.quarantine_attempt = Some(fence.attempt);
    let handback = quarantine.handback();
    run::execute(deps, claimed, stop, handback).await;
    drop(alone);
    drop(begun);
}

/// `running -> queued` for a run this worker claimed but did not start, and its message
/// again: spends no recovery (the run did nothing here), so it is quarantined again by the
/// worker that takes it.
async fn hand_back(deps: &Deps, claimed: &Claimed) {
    let fence = claimed.fence();
    let last_id = claimed.run.last_event_id as u64;
    // Interrupted if the holder before died mid-iteration: the next claim must still say so.
    let released = Box::pin(transitions::release(
        &deps.pool,
        fence,
        claimed.recovered,
        last_id,
    ))
    .await;
    match released {
        Ok(()) => {
            if let Err(e) = deps.publisher.publish_run(fence.run_id).await {
                tracing::warn!(run_id = %fence.run_id, error = %e, "re-publish failed; the sweeper will re-enqueue");
            }
        }
        Err(e) => {
            tracing::warn!(run_id = %fence.run_id, error = %e, "could not hand the run back; its lease will expire");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantine_sends_the_other_runs_back_and_is_held_by_one_run_at_a_time() {
        let draining = CancellationToken::new();
        let quarantine = Quarantine::new(draining.clone());
        let already_here = quarantine.handback();
        let begun = quarantine.begin().expect("free");
        assert!(
            already_here.is_cancelled(),
            "the runs already here hand back"
        );
        let alone = quarantine.handback();
        assert!(!alone.is_cancelled(), "not the quarantined run");
        assert!(quarantine.begin().is_none(), "one quarantine at a time");
        drop(begun);
        assert!(quarantine.begin().is_some(), "free again once it ends");
        draining.cancel();
        assert!(
            alone.is_cancelled() && quarantine.handback().is_cancelled(),
            "a drain reaches every run"
        );
    }
}
