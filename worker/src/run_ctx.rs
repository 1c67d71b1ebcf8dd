//! What one run's execution carries from step to step, and how a step can fail. Shared by the
//! driver (`run`), the model turn (`iteration`), tool settlement (`tools::settle`) and pausing
//! (`pause`), which therefore depend on this module and not on each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentfleet_shared::store::runs::RunRow;
use agentfleet_shared::store::turns;
use agentfleet_shared::store::{Fence, StoreError};

use crate::budget::Budget;
use crate::deps::Deps;
use crate::emitter::{Emitter, Fenced};
use crate::history::History;
use crate::model_call::ModelError;
use crate::stop::StopSignal;
use crate::tools::catalog::{self, Catalog};
use crate::tools::offer;

/// Everything one run's execution needs.
pub struct RunCtx {
    pub deps: Arc<Deps>,
    pub fence: Fence,
    pub run: RunRow,
    pub emitter: Emitter,
    pub stop: StopSignal,
    pub timing: IterationTiming,
    /// The finished iteration's timing, written by the next statement that commits anyway
    /// (the next turn, or the run's end) instead of one of its own.
    pub finished_timing: Mutex<Option<turns::IterationTiming>>,
    /// The messages the model sees, read once per holding (by the claim of a fresh run, else
    /// by the first turn) and kept up to date by this holder's own writes (it is the only
    /// writer while it holds the run).
    /// Shared with the model request that sends it as it is (`model_call::Messages`).
    pub history: Mutex<Option<Arc<History>>>,
    /// The agent's system prompt as every request of the holding sends it (no message, or
    /// one), serialised once.
    pub system: std::sync::OnceLock<Arc<History>>,
    /// Token budgets, with the figures of the claim and then of each turn commit.
    pub budget: Budget,
    /// The tools offered to the model (MCP servers listed), built once per holding.
    pub catalog: tokio::sync::OnceCell<Arc<Catalog>>,
    /// What compaction did to the history so far in this holding (`context_summary`).
    pub compaction: Mutex<crate::context_window::Compaction>,
    /// Tool outcomes sent to Postgres whose answers are still to be awaited: the next model
    /// call starts while they commit (`tools::settle`), and every write of the run after them
    /// waits for them first ([`RunCtx::outcomes_committed`]).
    pub outcomes: Mutex<Vec<PendingOutcome>>,
    /// Why this holding's last `plan` call started no round although its arguments were valid
    /// (the tenant's `max_active_runs`): the call's error, told to the model when it settles.
    pub plan_refusal: Mutex<Option<String>>,
}

/// The answer of a tool outcome's grouped write: whether its fence held.
pub type PendingOutcome = tokio::sync::oneshot::Receiver<Result<bool, StoreError>>;

impl RunCtx {
    /// The run's tools: on first use, shared with the holdings of the same agent
    /// (`catalog::Catalogs`) or built (listing its MCP servers), then reused.
    pub async fn catalog(&self) -> Result<Arc<Catalog>, RunError> {
        self.catalog
            .get_or_try_init(|| async {
                if self.planner() {
                    return Ok(Catalog::planner());
                }
                let (tenant, agent) = (self.run.tenant_id, &self.run.agent.0);
                let build = offer::build(&self.deps, tenant, agent);
                self.deps
                    .catalogs
                    .get_or_build(tenant, agent, build)
                    .await
                    .map_err(|e| RunError::Tools {
                        code: catalog::MCP_UNAVAILABLE,
                        message: e.0,
                    })
            })
            .await
            .cloned()
    }

    /// Waits for the tool outcomes still in flight. Called before any other write of the run,
    /// so that nothing the run records later (its next turn, a compaction, a pause, its end or
    /// hand-back) can commit before the results it follows: a next holder must never find a
    /// call still `running` that this one finished, and dispatch it again.
    pub async fn outcomes_committed(&self) -> Result<(), RunError> {
        let pending = std::mem::take(&mut *self.outcomes.lock().expect("outcomes lock"));
        // Every answer is awaited, also after a failure: what the run writes next (its end, a
        // hand-back) must still follow all of them.
        let mut first_error = None;
        for answer in pending {
            let error = match answer.await {
                Ok(Ok(true)) => continue,
                Ok(Ok(false)) => self.fence.lost().into(),
                Ok(Err(e)) => e.into(),
                // The task forwarding the answer is gone (a panic, or the runtime shutting
                // down): unknown.
                Err(_) => StoreError::Db(sqlx::Error::WorkerCrashed).into(),
            };
            first_error.get_or_insert(error);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The run is a plan-and-solve planner.
    pub fn planner(&self) -> bool {
        !self.run.agent.mode.is_react()
    }

    pub fn take_finished_timing(&self) -> Option<turns::IterationTiming> {
        self.finished_timing.lock().expect("timing lock").take()
    }

    /// Appends a message this holder has just committed to the thread.
    pub fn remember(&self, message: serde_json::Value) {
        if let Some(history) = self.history.lock().expect("history lock").as_mut() {
            // The request that shared it is over by now, so this copies nothing; were one
            // still out, it would keep the history it was sent.
            Arc::make_mut(history).push(message);
        }
    }
}

/// Time spent in the model and in tools during the current iteration, so the framework's own
/// share can be recorded. Tool time is the time at least one tool call was out of the worker
/// (calls in parallel count once); recording a call and announcing it are the framework's.
#[derive(Default)]
pub struct IterationTiming {
    model_us: AtomicU64,
    tools_us: AtomicU64,
    /// Tool calls out now, and since when at least one has been.
    tools_out: Mutex<(usize, Option<Instant>)>,
}

impl IterationTiming {
    pub fn add_model(&self, d: Duration) {
        self.model_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts tool time while the guard lives (also when the call is abandoned).
    pub fn tool_out(&self) -> ToolOut<'_> {
        self.left(Instant::now());
        ToolOut(self)
    }

    fn left(&self, at: Instant) {
        let mut out = self.tools_out.lock().expect("tools lock");
        if out.0 == 0 {
            out.1 = Some(at);
        }
        out.0 += 1;
    }

    fn back(&self, at: Instant) {
        let mut out = self.tools_out.lock().expect("tools lock");
        out.0 = out.0.saturating_sub(1);
        if out.0 == 0
            && let Some(since) = out.1.take()
        {
            let us = at.saturating_duration_since(since).as_micros() as u64;
            self.tools_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    pub fn take(&self) -> (i64, i64) {
        (
            self.model_us.swap(0, Ordering::Relaxed) as i64,
            self.tools_us.swap(0, Ordering::Relaxed) as i64,
        )
    }
}

/// One tool call out of the worker ([`IterationTiming::tool_out`]).
pub struct ToolOut<'a>(&'a IterationTiming);

impl Drop for ToolOut<'_> {
    fn drop(&mut self) {
        self.0.back(Instant::now());
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("stopped")]
    Stopped,
    #[error("lease lost")]
    LeaseLost,
    #[error("model call failed: {0}")]
    Model(ModelError),
    #[error("store: {0}")]
    Store(StoreError),
    /// `if_busy = interrupt` arrived before the run could pause: it ends instead of waiting.
    #[error("interrupted by a newer message")]
    Interrupted,
    /// The agent's tools cannot be offered (an MCP server refused, unreachable, unknown):
    /// the run fails with this code and tenant-visible message.
    #[error("{code}: {message}")]
    Tools { code: &'static str, message: String },
}

impl From<StoreError> for RunError {
    fn from(e: StoreError) -> RunError {
        match e {
            StoreError::LeaseLost { .. } => RunError::LeaseLost,
            other => RunError::Store(other),
        }
    }
}

impl From<Fenced> for RunError {
    fn from(_: Fenced) -> RunError {
        RunError::LeaseLost
    }
}

impl From<ModelError> for RunError {
    fn from(e: ModelError) -> RunError {
        match e {
            ModelError::Fenced(_) => RunError::LeaseLost,
            other => RunError::Model(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_time_counts_calls_in_parallel_once_and_calls_in_turn_each() {
        let timing = IterationTiming::default();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Two calls overlapping: out from 0 to 4 ms.
        timing.left(ms(0));
        timing.left(ms(1));
        timing.back(ms(3));
        timing.back(ms(4));
        // Framework work between calls is not tool time; then one call of 2 ms.
        timing.left(ms(10));
        timing.back(ms(12));
        timing.add_model(Duration::from_millis(7));
        assert_eq!(timing.take(), (7_000, 6_000));
        assert_eq!(timing.take(), (0, 0), "taken once");
    }
}
