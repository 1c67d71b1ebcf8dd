//! Why a run's execution must stop early, shared between the run task and its helpers (lease
//! heartbeat, control-channel listener, drain).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The run was cancelled (Postgres already says so).
    Cancelled,
    /// Another attempt holds the run, or the lease could not be renewed in time.
    LeaseLost,
    /// The drain grace period ran out mid-iteration: hand the run back, marked interrupted.
    DrainDeadline,
}

/// A one-shot stop signal; the first reason wins.
#[derive(Clone, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Arc<AtomicU8>,
    /// `if_busy = interrupt`: end the run at its next safe point (not a stop: the tool call
    /// in flight finishes and is recorded first).
    interrupt: Arc<AtomicBool>,
}

impl StopSignal {
    pub fn stop(&self, reason: StopReason) {
        let code = match reason {
            StopReason::Cancelled => 1,
            StopReason::LeaseLost => 2,
            StopReason::DrainDeadline => 3,
        };
        let _ = self
            .reason
            .compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
        self.token.cancel();
    }

    pub fn request_interrupt(&self) {
        self.interrupt.store(true, Ordering::SeqCst);
    }

    pub fn interrupt_requested(&self) -> bool {
        self.interrupt.load(Ordering::SeqCst)
    }

    pub fn reason(&self) -> Option<StopReason> {
        match self.reason.load(Ordering::SeqCst) {
            1 => Some(StopReason::Cancelled),
            2 => Some(StopReason::LeaseLost),
            3 => Some(StopReason::DrainDeadline),
            _ => None,
        }
    }

    pub async fn stopped(&self) {
        self.token.cancelled().await;
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }
}
