//! Driving one claimed run: announce the attempt, alternate model turns and tool settlement
//! until the run completes, pauses, fails, is stopped or is handed back (a drain, or a
//! quarantine emptying the worker: `handback`).
//!
//! Statements on the pool off the hot path (ends other than completion, hand-backs, reloads,
//! compaction, pauses) are awaited boxed (`Box::pin`): sqlx's pool acquire future is about
//! 14 KB, and awaited inline it sizes every future above it, the run's and its task's, which
//! every spawn and move copies whole. The hot path writes through the grouped writers, whose
//! futures are small.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use agentfleet_shared::config::OnBudgetExceeded;
use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::events::{EventType, Expiry};
use agentfleet_shared::report;
use agentfleet_shared::store::transitions::{self, Claimed, Ending};
use agentfleet_shared::store::{StoreError, double_text};

use crate::budget::{Budget, Exceeded, Spent};
use crate::deps::Deps;
use crate::emitter::Emitter;
use crate::iteration::{self, Phase, Turned};
use crate::run_ctx::{IterationTiming, RunCtx, RunError};
use crate::stop::{StopReason, StopSignal};
use crate::tools::settle::{Settled, settle};

enum Outcome {
    /// Completed at this iteration; `ended` if the final turn's commit already ended the run
    /// (with the run that end promoted), `None` if the end is still to write.
    Completed {
        iteration: i32,
        ended: Option<Option<Uuid>>,
    },
    Paused,
    /// Drain or quarantine (`handback`): handed back between iterations.
    Released,
    MaxIterations,
    /// A token budget was reached: no further model call.
    BudgetExceeded(Exceeded),
    /// `if_busy = interrupt`: a newer message on the thread; ended at a safe point.
    Interrupted,
    /// A planner committed a round of tasks and waits for them, holding nothing.
    WaitingForTasks,
}

pub async fn execute(
    deps: Arc<Deps>,
    claimed: Claimed,
    stop: StopSignal,
    handback: CancellationToken,
) {
    let fence = claimed.fence();
    let spent = Spent::read(
        claimed
            .run
            .prompt_tokens
            .saturating_add(claimed.run.completion_tokens)
            // A planner's ended tasks count towards its budget (0 for any other run).
            .saturating_add(claimed.run.task_tokens),
        claimed.tenant_tokens_today,
        claimed.tenant_tokens_per_day.as_ref(),
        deps.settings.limits.tokens_per_day,
    );
    let budget = Budget::new(claimed.run.agent.max_tokens_total, spent);
    let history = claimed
        .history
        .map(|h| std::sync::Arc::new(crate::history::History::from(h)));
    let run = claimed.run;
    if run.interrupt_requested_at.is_some() {
        // Asked before this claim (the hint went to a holder that is gone).
        stop.request_interrupt();
    }
    // Ids continue past every event a client could have seen: the durable floor, or the
    // list as it stands (the API may have appended `run_resumed` after the pause). Read here
    // rather than taken from the first append's answer: should every append of this holding
    // fail, the ids it records in Postgres (pause, end, hand-back) must still pass the list's.
    let listed = deps.bus.len(run.id).await.unwrap_or(0);
    let floor = (run.last_event_id as u64).max(listed);
    let emitter = Emitter::new(
        deps.bus.clone(),
        run.id,
        run.thread_id,
        fence.attempt,
        floor,
        deps.settings.events.compact_deltas,
    );
    let ctx = RunCtx {
        deps,
        fence,
        run,
        emitter,
        stop,
        timing: IterationTiming::default(),
        finished_timing: Default::default(),
        history: std::sync::Mutex::new(history),
        system: Default::default(),
        budget,
        catalog: Default::default(),
        compaction: Default::default(),
        outcomes: Default::default(),
        plan_refusal: Default::default(),
    };
    // Dropped with this future, also when the run's task panics: its lease must then lapse
    // for the sweeper to hand the run to another attempt.
    let holding = ctx.deps.leases.hold(fence, ctx.stop.clone());
    let result = tokio::select! {
        r = drive(&ctx, claimed.recovered, &handback) => r,
        // Every await point of `drive` is abandoned at once when the run must stop.
        _ = ctx.stop.stopped() => Err(RunError::Stopped),
    };
    drop(holding);
    finish(&ctx, result).await;
    if let Some(parent) = ctx.run.parent_run_id {
        // A task's end may have made its planner or the round's next task runnable (held
        // ones go with the dispatch below).
        publish_after_task(&ctx, parent).await;
    }
    if ctx.run.fair {
        // Its slot of the tenant's running limit may be free now (ended, paused, cancelled).
        crate::fair_dispatch::after_holding(ctx.deps.clone(), ctx.run.tenant_id);
    }
}

/// Publishes what a task's end made runnable and not held: its planner, the round's next
/// task. The sweeper re-publishes them if this is lost.
async fn publish_after_task(ctx: &RunCtx, parent: Uuid) {
    // The fault suite crashes here: the task's end is committed, its planner not published.
    agentfleet_shared::failpoint::hit("task:before_publish");
    let runnable = match Box::pin(agentfleet_shared::store::plans::runnable_after_task(
        &ctx.deps.pool,
        parent,
        ctx.run.plan_round,
    ))
    .await
    {
        Ok(ids) => ids,
        Err(e) => {
            tracing::debug!(error = %e, "runs made runnable by a task's end not looked up; the sweeper publishes them");
            return;
        }
    };
    for id in runnable {
        if let Err(e) = ctx.deps.publisher.publish_run(id).await {
            tracing::warn!(run_id = %id, error = %e, "publish failed; the sweeper will re-enqueue");
        }
    }
}

async fn drive(
    ctx: &RunCtx,
    recovered: bool,
    handback: &CancellationToken,
) -> Result<Outcome, RunError> {
    let (kind, mut data) = if recovered {
        (
            EventType::RunRecovered,
            json!({"attempt": ctx.fence.attempt, "worker": ctx.deps.worker_id,
            "iteration": ctx.run.iteration}),
        )
    } else {
        (
            EventType::RunStarted,
            json!({"attempt": ctx.fence.attempt, "worker": ctx.deps.worker_id}),
        )
    };
    if ctx.run.quarantine_attempt == Some(ctx.fence.attempt) {
        // Said to the run's clients too: the attempt that decides whether the run is poison.
        data["quarantined"] = json!(true);
    }
    // Goes out with the holding's first step (its `iteration_started`, or whatever comes first).
    ctx.emitter.defer(kind, data, Expiry::Persist);
    let mut iteration = ctx.run.iteration;
    let mut started = chrono::Utc::now();
    // The calls of the turn just taken in this loop; unknown (so: read them) after a claim.
    let mut fresh_calls = None;
    // An iteration's span covers its model turn and the settling of its calls; a claim that
    // continues an iteration (after a pause or a take-over) settles it in a span of its own.
    let mut span = if iteration > 0 {
        iteration_span(iteration, true)
    } else {
        tracing::Span::none()
    };
    // A planner that is done (`complete`, or an answer without calls) writes its answer in a
    // summary turn.
    let mut phase = Phase::Turn;
    loop {
        if iteration > 0 {
            let settled = settle(ctx, iteration, fresh_calls.take())
                .instrument(span.clone())
                .await?;
            iteration::finish_timing(ctx, iteration, started, ctx.timing.take());
            match settled {
                Settled::Paused => return Ok(Outcome::Paused),
                Settled::Complete if ctx.planner() => phase = Phase::Summary,
                // An iteration an earlier holding committed without calls.
                Settled::Complete => {
                    let ended = None;
                    return Ok(Outcome::Completed { iteration, ended });
                }
                Settled::NextIteration => {}
            }
        }
        // A safe point: the last turn's calls all have their results recorded, and the next
        // model call has not started.
        if ctx.stop.interrupt_requested() {
            return Ok(Outcome::Interrupted);
        }
        if handback.is_cancelled() {
            return Ok(Outcome::Released);
        }
        if iteration >= ctx.run.max_iterations {
            return Ok(Outcome::MaxIterations);
        }
        // Between iterations only: the last turn's calls are settled above.
        if let Err(exceeded) = ctx.budget.check(chrono::Utc::now().date_naive()) {
            let on = ctx.deps.settings.worker.on_budget_exceeded;
            // Only the tenant's daily budget can change while the run waits (an operator
            // raises it, or the UTC day turns); the run's own is part of its agent and a
            // resume cannot raise it, so that pause could only end in another.
            if let (OnBudgetExceeded::Pause, Exceeded::Tenant { used, limit }) = (on, &exceeded) {
                ctx.outcomes_committed().await?;
                tracing::info!(run_id = %ctx.fence.run_id, used, limit,
                    "tenant token budget reached; pausing the run");
                crate::pause::for_budget(ctx, *used, *limit).await?;
                return Ok(Outcome::Paused);
            }
            return Ok(Outcome::BudgetExceeded(exceeded));
        }
        iteration += 1;
        started = chrono::Utc::now();
        span = iteration_span(iteration, false);
        match iteration::model_turn(ctx, iteration, started, phase)
            .instrument(span.clone())
            .await?
        {
            Turned::Calls(calls) => fresh_calls = Some(calls),
            Turned::Completed { promoted } => {
                let ended = Some(promoted);
                return Ok(Outcome::Completed { iteration, ended });
            }
            Turned::Planned => return Ok(Outcome::WaitingForTasks),
        }
    }
}

/// `run.iteration`: `continued` when this attempt settles an iteration an earlier one began.
fn iteration_span(iteration: i32, continued: bool) -> tracing::Span {
    tracing::info_span!("run.iteration", iteration, continued)
}

/// Commits the end of this holding and announces it.
async fn finish(ctx: &RunCtx, result: Result<Outcome, RunError>) {
    // The last results come first in Postgres; if one did not commit, that is the end.
    let result = match (ctx.outcomes_committed().await, result) {
        (_, Err(e @ (RunError::Stopped | RunError::LeaseLost))) | (Err(e), _) => Err(e),
        (Ok(()), result) => result,
    };
    if !matches!(result, Ok(Outcome::Completed { .. })) {
        // A completed run's deferred events go out with `run_completed`; any other end
        // appends them now, before it records its ids or hands the run on.
        let _ = ctx.emitter.flush().await;
        iteration::flush_timing(ctx).await;
    }
    let next_id = ctx.emitter.next_id().await;
    let run_id = ctx.fence.run_id;
    let outcome = match result {
        Ok(Outcome::Paused | Outcome::WaitingForTasks) => return,
        Ok(Outcome::Completed { iteration, ended }) => {
            let ended = match ended {
                Some(promoted) => Ok(promoted),
                None => complete(ctx, next_id).await,
            };
            match ended {
                Ok(promoted) => {
                    publish_promoted(ctx, promoted).await;
                    Ok((
                        EventType::RunCompleted,
                        json!({"iteration": iteration}),
                        "completed",
                    ))
                }
                Err(e) => Err(e),
            }
        }
        Ok(Outcome::Interrupted) | Err(RunError::Interrupted) => {
            match Box::pin(double_text::interrupt(&ctx.deps.pool, ctx.fence, next_id)).await {
                Ok(promoted) => {
                    publish_promoted(ctx, promoted).await;
                    Ok((
                        EventType::RunCancelled,
                        agentfleet_shared::events::cancelled_data(
                            Some(RunStatus::Running),
                            Some(&double_text::interrupted_error()),
                        ),
                        "cancelled",
                    ))
                }
                Err(e) => Err(e),
            }
        }
        Ok(Outcome::MaxIterations) => {
            let msg = format!(
                "the run reached max_iterations ({})",
                ctx.run.max_iterations
            );
            fail(ctx, "max_iterations_reached", msg, next_id).await
        }
        Ok(Outcome::BudgetExceeded(exceeded)) => {
            tracing::info!(%run_id, ?exceeded, "token budget reached; failing the run");
            fail(ctx, "budget_exceeded", exceeded.message(), next_id).await
        }
        Err(RunError::Tools { code, message }) => {
            tracing::info!(%run_id, code, message, "the agent's tools cannot be offered; failing the run");
            fail(ctx, code, message, next_id).await
        }
        Err(RunError::Model(e)) => {
            tracing::warn!(%run_id, error = %e, "the model call failed; failing the run");
            fail(ctx, e.code(), e.tenant_message(), next_id).await
        }
        Ok(Outcome::Released) => return hand_back(ctx, false).await,
        Err(RunError::Stopped) if ctx.stop.reason() == Some(StopReason::DrainDeadline) => {
            return hand_back(ctx, true).await;
        }
        Err(RunError::Stopped) | Err(RunError::LeaseLost) => {
            tracing::info!(%run_id, attempt = ctx.fence.attempt, reason = ?ctx.stop.reason(),
                "stopped: the run was cancelled or is held by another attempt");
            return;
        }
        // A plan's round lost the race for the tenant's last active-run slots to a concurrent
        // create: the next holding takes the turn again, and tells the model.
        Err(RunError::Store(e))
            if e.is_transient() || matches!(e, StoreError::TooManyActiveRuns { .. }) =>
        {
            let max = ctx.deps.settings.worker.max_handbacks;
            if ctx.run.handbacks < max {
                tracing::warn!(%run_id, error = %report::error_line(&e),
                    "database error; handing the run back");
                return hand_back_after_failure(ctx).await;
            }
            tracing::error!(%run_id, error = %report::error_line(&e), handbacks = ctx.run.handbacks,
                "database error again; failing the run");
            let msg = format!(
                "the run was interrupted by internal errors {} times and was stopped",
                max + 1
            );
            fail(ctx, "internal_error_repeated", msg, next_id).await
        }
        Err(RunError::Store(e)) => {
            // The same write would fail the same way on every attempt (invalid data, a
            // constraint): retrying would only burn model calls.
            tracing::error!(%run_id, error = %report::error_line(&e),
                "the database refused the run's data; failing the run");
            let msg = "the run's data could not be recorded (internal error)".to_owned();
            fail(ctx, "internal_error", msg, next_id).await
        }
    };
    match outcome {
        Ok((kind, data, status)) => {
            metrics::counter!("agentfleet_runs_total", "status" => status).increment(1);
            let _ = ctx.emitter.emit_with(kind, data, Expiry::Expire).await;
        }
        Err(e) => {
            tracing::info!(%run_id, error = %e, "could not record the run's end; another holder owns it");
        }
    }
}

/// `running -> completed` by a statement of its own (the final turn was committed by an
/// earlier holding); the run the end promoted, if any.
async fn complete(ctx: &RunCtx, next_id: u64) -> Result<Option<Uuid>, StoreError> {
    let ending = Ending {
        fence: ctx.fence,
        status: RunStatus::Completed,
        last_event_id: next_id,
        timing: ctx.take_finished_timing(),
    };
    match ctx.deps.writes.endings.write(ending).await? {
        ended if ended.held => Ok(ended.promoted),
        _ => Err(ctx.fence.lost()),
    }
}

/// `running -> failed` with a code and a message, ready to be announced.
async fn fail(
    ctx: &RunCtx,
    code: &'static str,
    msg: String,
    next_id: u64,
) -> Result<(EventType, serde_json::Value, &'static str), StoreError> {
    Box::pin(transitions::fail(
        &ctx.deps.pool,
        ctx.fence,
        code,
        &msg,
        next_id,
    ))
    .await?;
    // Off the hot path: a failed run's end may have promoted a run waiting for its thread.
    match Box::pin(ctx.deps.pool.acquire()).await {
        Ok(mut conn) => {
            let promoted = double_text::runnable_on_thread(&mut conn, ctx.run.thread_id).await;
            drop(conn);
            publish_promoted(ctx, promoted.ok().flatten()).await;
        }
        Err(e) => {
            tracing::debug!(error = %e, "promoted run not looked up; the sweeper publishes it");
        }
    }
    Ok((
        EventType::RunFailed,
        json!({"code": code, "message": msg}),
        "failed",
    ))
}

/// Publishes the run the end promoted (double-texting); the sweeper re-publishes it if lost.
async fn publish_promoted(ctx: &RunCtx, promoted: Option<uuid::Uuid>) {
    let Some(id) = promoted else { return };
    // The fault suite crashes here: the promotion is committed, its message not sent.
    agentfleet_shared::failpoint::hit("promoted:before_publish");
    if let Err(e) = ctx.deps.publisher.publish_run(id).await {
        tracing::warn!(run_id = %id, error = %e, "publish of a promoted run failed; the sweeper will re-enqueue");
    }
}

/// A counted hand-back after a transient failure: released at once (so nothing holds the
/// run), published again after a back-off that grows with each hand-back.
async fn hand_back_after_failure(ctx: &RunCtx) {
    let run_id = ctx.fence.run_id;
    let settings = &ctx.deps.settings.worker;
    let last_id = ctx.emitter.last_id().await;
    match Box::pin(transitions::hand_back_after_failure(
        &ctx.deps.pool,
        ctx.fence,
        last_id,
    ))
    .await
    {
        Ok(handbacks) => {
            metrics::counter!("agentfleet_run_handbacks_total").increment(1);
            let doublings = (handbacks - 1).clamp(0, 16) as u32;
            // Below the sweeper's re-publish age, which would otherwise cut the wait short.
            let cap =
                Duration::from_secs(30).min(Duration::from_millis(settings.requeue_after_ms / 2));
            let delay = Duration::from_millis(settings.handback_backoff_ms)
                .saturating_mul(1 << doublings)
                .min(cap);
            tracing::info!(%run_id, handbacks, delay_ms = delay.as_millis() as u64,
                "run handed back after a failure");
            tokio::time::sleep(delay).await;
            if let Err(e) = ctx.deps.publisher.publish_run(run_id).await {
                tracing::warn!(%run_id, error = %e, "re-publish failed; the sweeper will re-enqueue");
            }
        }
        Err(e) => {
            tracing::warn!(%run_id, error = %e, "could not hand the run back; its lease will expire");
        }
    }
}

/// `running -> queued` and a new message, so another worker continues the run.
async fn hand_back(ctx: &RunCtx, interrupted: bool) {
    let run_id = ctx.fence.run_id;
    let last_id = ctx.emitter.last_id().await;
    match Box::pin(transitions::release(
        &ctx.deps.pool,
        ctx.fence,
        interrupted,
        last_id,
    ))
    .await
    {
        Ok(()) => {
            if let Err(e) = ctx.deps.publisher.publish_run(run_id).await {
                tracing::warn!(%run_id, error = %e, "re-publish failed; the sweeper will re-enqueue");
            }
            tracing::info!(%run_id, interrupted, "run handed back to the queue");
        }
        Err(e) => {
            tracing::warn!(%run_id, error = %e, "could not hand the run back; its lease will expire");
        }
    }
}
