//! Settling the tool calls of one iteration. The same function serves a fresh model response,
//! a run resumed after a decision or an answer, and a run recovered after a crash: it looks at
//! the recorded status of each call and does only what is left.
//!
//! Order of a response: calls before the first terminating call (`ask`, `complete`) run; calls
//! after it are skipped. If any call before it needs confirmation, nothing runs until every
//! such call is decided: then the approved ones and the low-risk ones run, and the rejected
//! ones give the model the user's rejection. At most the run's cap of calls
//! (`worker.max_parallel_tool_calls`, lowered by `agent.max_parallel_tool_calls`) are in flight
//! at once.

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt, stream};
use serde_json::json;

use agentfleet_shared::domain::{Risk, ToolCallStatus, ToolKind};
use agentfleet_shared::events::EventType;
use agentfleet_shared::store::tool_calls::{self, ToolCallRow};
use agentfleet_shared::store::{StoreError, messages};

use super::catalog::Target;
use super::{builtin, check_arguments, http, mcp};
use crate::emitter::Written;
use crate::pause;
use crate::run_ctx::{RunCtx, RunError};

pub enum Settled {
    /// Results are recorded: call the model again.
    NextIteration,
    /// The run is waiting for a human.
    Paused,
    /// The model is done (no tool calls, or `complete`).
    Complete,
}

/// What settling one response's calls must do, decided from their recorded statuses alone.
#[derive(Debug)]
struct Plan<'c> {
    /// Unfinished calls after the first terminating call: recorded as skipped.
    skip: Vec<&'c ToolCallRow>,
    step: Step<'c>,
}

#[derive(Debug)]
enum Step<'c> {
    /// Risky calls before the terminating call wait for a decision: nothing runs yet.
    Confirm(Vec<&'c ToolCallRow>),
    /// Run these (concurrently), then end the turn as `then` says.
    Run {
        calls: Vec<&'c ToolCallRow>,
        then: Then<'c>,
    },
}

#[derive(Debug)]
enum Then<'c> {
    NextIteration,
    /// The response ended with `ask`: pause for the answer (or fail the call's arguments).
    Ask(&'c ToolCallRow),
    /// The response ended with `complete`, not yet recorded.
    Complete(&'c ToolCallRow),
    /// `complete` was recorded before (a recovered attempt).
    Completed,
    /// A planner's `plan` call: `running` when its round was created (its tasks' results are
    /// taken up now), `pending` when it was refused (the model reads why).
    Plan(&'c ToolCallRow),
}

/// The ordering rules: calls before the first terminating call (`ask`, `complete`) run, calls
/// after it are skipped; while any risky call before it is undecided nothing runs; approved,
/// low-risk and interrupted (`running`) calls run; finished and rejected ones are left alone.
#[cfg(test)]
fn plan(calls: &[ToolCallRow]) -> Plan<'_> {
    plan_of(calls, false)
}

/// [`plan`] for a run that is a `planner` or not: a planner's `plan` call terminates its
/// response too.
fn plan_of(calls: &[ToolCallRow], planner: bool) -> Plan<'_> {
    let term = calls
        .iter()
        .position(|c| builtin::is_terminating(&c.name) || (planner && c.name == builtin::PLAN));
    let (before, rest) = calls.split_at(term.unwrap_or(calls.len()));
    let skip = rest
        .iter()
        .skip(1)
        .filter(|c| !c.status.is_finished())
        .collect();
    let undecided: Vec<&ToolCallRow> = before
        .iter()
        .filter(|c| c.status == ToolCallStatus::Pending && c.risk == Risk::High)
        .collect();
    if !undecided.is_empty() {
        return Plan {
            skip,
            step: Step::Confirm(undecided),
        };
    }
    let runnable = before
        .iter()
        .filter(|c| {
            matches!(
                c.status,
                ToolCallStatus::Pending | ToolCallStatus::Approved | ToolCallStatus::Running
            )
        })
        .collect();
    let then = match rest.first().map(|c| (c, c.name.as_str(), c.status)) {
        None => Then::NextIteration,
        Some((c, builtin::ASK, ToolCallStatus::Pending | ToolCallStatus::AwaitingInput)) => {
            Then::Ask(c)
        }
        Some((c, builtin::COMPLETE, status)) if !status.is_finished() => Then::Complete(c),
        Some((_, builtin::COMPLETE, ToolCallStatus::Succeeded)) => Then::Completed,
        Some((c, builtin::PLAN, status)) if planner && !status.is_finished() => Then::Plan(c),
        Some(_) => Then::NextIteration,
    };
    Plan {
        skip,
        step: Step::Run {
            calls: runnable,
            then,
        },
    }
}

/// Marks the calls that settling will run at once (their tool exists, their arguments are
/// valid) as dispatched, with their checked arguments, before the turn that made them is
/// committed: that commit then records the dispatch too (`running`, dispatch count 1). Only
/// the first of the run's cap of calls in flight ([`parallel_cap`]) leave at once: the others
/// stay `pending` until a slot frees and they are dispatched on their own, so no call is shown
/// (or taken over) as running before it left.
pub async fn mark_dispatchable(ctx: &RunCtx, rows: &mut [ToolCallRow]) {
    let Step::Run { calls, .. } = plan_of(rows, ctx.planner()).step else {
        return;
    };
    let mut ready: Vec<(usize, serde_json::Value)> = Vec::new();
    for c in calls.iter().take(parallel_cap(ctx)) {
        let Some(spec) = ctx.catalog.get().and_then(|catalog| catalog.get(&c.name)) else {
            continue;
        };
        let max_checks = ctx.deps.settings.worker.max_argument_checks;
        if let Ok(args) = spec.parameters.check(&c.raw_arguments, max_checks).await {
            ready.push((c.position as usize, args));
        }
    }
    let now = chrono::Utc::now();
    for (position, args) in ready {
        let row = &mut rows[position];
        row.status = ToolCallStatus::Running;
        row.dispatch_count = 1;
        row.started_at = Some(now);
        row.arguments = Some(sqlx::types::Json(args));
    }
}

/// Settles the calls of `iteration`: `fresh` are the rows the holder's own turn has just
/// recorded (see [`mark_dispatchable`]); without them they are read from Postgres (a resumed
/// or recovered run), and a `running` call there was interrupted and is dispatched again.
pub async fn settle(
    ctx: &RunCtx,
    iteration: i32,
    fresh: Option<Vec<ToolCallRow>>,
) -> Result<Settled, RunError> {
    let is_fresh = fresh.is_some();
    let calls = match fresh {
        Some(rows) => rows,
        None => {
            Box::pin(tool_calls::of_iteration(
                &ctx.deps.pool,
                ctx.fence.run_id,
                iteration,
            ))
            .await?
        }
    };
    if calls.is_empty() {
        return Ok(Settled::Complete);
    }
    let Plan { skip, step } = plan_of(&calls, ctx.planner());
    for call in skip {
        let msg = "skipped: an earlier call in the same response ended the turn";
        finish(
            ctx,
            iteration,
            call,
            ToolCallStatus::Skipped,
            json!({"skipped": true}),
            msg,
        )
        .await?;
    }
    let (runnable, then) = match step {
        Step::Confirm(undecided) => {
            pause::for_confirmation(ctx, &undecided).await?;
            return Ok(Settled::Paused);
        }
        Step::Run { calls, then } => (calls, then),
    };
    if !runnable.is_empty() {
        let cap = parallel_cap(ctx);
        // Only when the model is called next may the outcomes still be committing when
        // settling returns: a pause or an end right here would write after them at once.
        let behind = matches!(then, Then::NextIteration);
        if runnable.len() == 1 {
            // The usual turn: one call, awaited in place (no stream to build and drain).
            let call = runnable.into_iter().next().expect("one call");
            execute(ctx, iteration, call, is_fresh, behind).await?;
        } else {
            // At most `cap` calls in flight; each records its own outcome as it ends.
            // Collected first: a lazily mapped iterator inside the stream trips the spawned
            // task's `Send` check (higher-ranked lifetimes).
            let calls: Vec<_> = runnable
                .into_iter()
                .map(|c| execute(ctx, iteration, c, is_fresh, behind))
                .collect();
            let results: Vec<Result<(), RunError>> =
                stream::iter(calls).buffer_unordered(cap).collect().await;
            results.into_iter().collect::<Result<Vec<()>, RunError>>()?;
        }
    }
    match then {
        Then::NextIteration => Ok(Settled::NextIteration),
        Then::Completed => Ok(Settled::Complete),
        Then::Ask(call) => match check_arguments(&call.raw_arguments, builtin::ask_schema()) {
            Ok(args) => {
                pause::for_input(ctx, call, &args).await?;
                Ok(Settled::Paused)
            }
            Err(msg) => {
                finish_failed(ctx, iteration, call, &msg).await?;
                Ok(Settled::NextIteration)
            }
        },
        Then::Plan(call) if call.status == ToolCallStatus::Running => {
            let (result, content) = crate::plan::fan_in(ctx).await?;
            // The fault suite crashes here: the round announced, its result not recorded.
            agentfleet_shared::failpoint::hit("plan:before_result");
            let completed = json!({
                "tool_call_id": call.tool_call_id, "name": call.name, "ok": true,
                "result": result, "truncated": false,
            });
            finish(
                ctx,
                iteration,
                call,
                ToolCallStatus::Succeeded,
                result,
                &content,
            )
            .await?;
            ctx.emitter
                .emit_behind(EventType::ToolCompleted, completed)
                .await?;
            Ok(Settled::NextIteration)
        }
        Then::Plan(call) => {
            let msg = crate::plan::refusal(ctx, call);
            finish_failed(ctx, iteration, call, &msg).await?;
            let completed = json!({
                "tool_call_id": call.tool_call_id, "name": call.name, "ok": false, "error": msg,
            });
            ctx.emitter
                .emit_behind(EventType::ToolCompleted, completed)
                .await?;
            Ok(Settled::NextIteration)
        }
        Then::Complete(call) => {
            let args = check_arguments(&call.raw_arguments, builtin::complete_schema())
                .unwrap_or(json!({}));
            finish(
                ctx,
                iteration,
                call,
                ToolCallStatus::Succeeded,
                args,
                "completed",
            )
            .await?;
            Ok(Settled::Complete)
        }
    }
}

/// Tool calls of one response that run at once: the agent's `max_parallel_tool_calls`, never
/// more than `worker.max_parallel_tool_calls`.
fn parallel_cap(ctx: &RunCtx) -> usize {
    let most = ctx.deps.settings.worker.max_parallel_tool_calls.get();
    ctx.run
        .agent
        .max_parallel_tool_calls
        .map_or(most, |n| (n as usize).clamp(1, most))
}

/// Records a call's outcome and waits for the commit.
async fn finish(
    ctx: &RunCtx,
    iteration: i32,
    call: &ToolCallRow,
    status: ToolCallStatus,
    result: serde_json::Value,
    model_content: &str,
) -> Result<(), RunError> {
    let settled = (status, result, model_content);
    let (outcome, message) = outcome_of(ctx, iteration, call, settled);
    if !ctx.deps.writes.outcomes.write(outcome).await? {
        return Err(ctx.fence.lost().into());
    }
    ctx.remember(message);
    Ok(())
}

/// Records a call's outcome without waiting for the commit, and announces it with
/// `completed` once committed: the next model call (which reads the result from the history
/// kept here) starts meanwhile. The run's next write waits for the answer
/// ([`RunCtx::outcomes_committed`]), and the next event (that call's `iteration_started`, its
/// deltas) follows the announcement. A crash meanwhile loses what it would lose during an
/// awaited commit: the call is `running` for the next holder, which dispatches it again.
async fn finish_behind(
    ctx: &RunCtx,
    iteration: i32,
    call: &ToolCallRow,
    settled: (ToolCallStatus, serde_json::Value, &str),
    completed: serde_json::Value,
) -> Result<(), RunError> {
    let (outcome, message) = outcome_of(ctx, iteration, call, settled);
    let write = send_outcome(ctx, outcome);
    // The answer goes to the run (whose next write waits for it) and to the announcement, from
    // a task of its own: neither can lose it by being dropped.
    let (answer, answered) = tokio::sync::oneshot::channel();
    let (held, committed) = tokio::sync::oneshot::channel();
    ctx.outcomes.lock().expect("outcomes lock").push(answered);
    tokio::spawn(async move {
        let written = write.await;
        let _ = held.send(match written {
            Ok(true) => Written::Held,
            Ok(false) => Written::Refused,
            Err(_) => Written::Failed,
        });
        let _ = answer.send(written);
    });
    ctx.remember(message);
    let committed = async move { committed.await.unwrap_or(Written::Failed) };
    ctx.emitter
        .emit_behind_when(committed, EventType::ToolCompleted, completed)
        .await?;
    Ok(())
}

/// Hands the outcome to its grouped writer now; its answer, to await later. The fault suite
/// fails the write as a database that keeps timing out would (`error:store:outcome`), or holds
/// it back as a slow one would (`delay:store:outcome@MS`).
fn send_outcome(
    ctx: &RunCtx,
    outcome: tool_calls::Outcome,
) -> BoxFuture<'static, Result<bool, StoreError>> {
    use agentfleet_shared::failpoint;
    if failpoint::error("store:outcome") {
        return std::future::ready(Err(StoreError::Db(sqlx::Error::PoolTimedOut))).boxed();
    }
    let writes = ctx.deps.writes.outcomes.clone();
    match failpoint::delay("store:outcome") {
        Some(delay) => async move {
            tokio::time::sleep(delay).await;
            writes.write(outcome).await
        }
        .boxed(),
        None => writes.send(outcome).boxed(),
    }
}

/// A call's outcome as written, and its result message as the model reads it.
fn outcome_of(
    ctx: &RunCtx,
    iteration: i32,
    call: &ToolCallRow,
    (status, result, model_content): (ToolCallStatus, serde_json::Value, &str),
) -> (tool_calls::Outcome, serde_json::Value) {
    let error = (status == ToolCallStatus::Failed).then_some(model_content);
    let message = messages::tool_result_body(&call.tool_call_id, model_content);
    let outcome = tool_calls::Outcome {
        fence: ctx.fence,
        thread_id: ctx.run.thread_id,
        iteration,
        tool_call_id: call.tool_call_id.clone(),
        status,
        result: Some(result),
        error: error.map(str::to_owned),
        message: message.clone(),
    };
    (outcome, message)
}

/// Records a call that failed before it could run (bad arguments, unknown tool): the model
/// sees `{"error": msg}`.
async fn finish_failed(
    ctx: &RunCtx,
    iteration: i32,
    call: &ToolCallRow,
    msg: &str,
) -> Result<(), RunError> {
    let result = json!({"error": msg});
    let content = result.to_string();
    finish(
        ctx,
        iteration,
        call,
        ToolCallStatus::Failed,
        result,
        &content,
    )
    .await
}

/// Runs one call: recorded as dispatched before it leaves (by the turn's commit when `fresh`
/// and already `running`), and its outcome after.
///
/// Its span, `tool.call`: the tool, its kind, the call's id, risk and dispatch count, and the
/// outcome; no arguments or result (bodies stay out of traces).
#[tracing::instrument(name = "tool.call", skip(ctx, iteration, call, fresh, behind), fields(
    tool = %call.name,
    tool_call_id = %call.tool_call_id,
    risk = call.risk.as_str(),
    kind = tracing::field::Empty,
    dispatch = tracing::field::Empty,
    outcome = tracing::field::Empty,
    otel.status_code = tracing::field::Empty,
))]
async fn execute(
    ctx: &RunCtx,
    iteration: i32,
    call: &ToolCallRow,
    fresh: bool,
    behind: bool,
) -> Result<(), RunError> {
    let fail = |msg: String| async move {
        let span = tracing::Span::current();
        span.record("outcome", "rejected_arguments");
        span.record("otel.status_code", "error");
        let completed = json!({
            "tool_call_id": call.tool_call_id, "name": call.name, "ok": false, "error": msg,
        });
        if behind {
            let result = json!({"error": msg});
            let content = result.to_string();
            let failed = (ToolCallStatus::Failed, result, content.as_str());
            finish_behind(ctx, iteration, call, failed, completed).await?;
        } else {
            finish_failed(ctx, iteration, call, &msg).await?;
            ctx.emitter
                .emit(EventType::ToolCompleted, completed)
                .await?;
        }
        metrics::counter!("agentfleet_tool_calls_total", "outcome" => "rejected_arguments")
            .increment(1);
        Ok::<(), RunError>(())
    };
    let catalog = ctx.catalog().await?;
    let Some(spec) = catalog.get(&call.name) else {
        return fail(format!("unknown tool `{}`", call.name)).await;
    };
    let (args, dispatch) = match &call.arguments {
        Some(checked) if fresh && call.status == ToolCallStatus::Running => {
            (checked.0.clone(), call.dispatch_count)
        }
        _ => match spec
            .parameters
            .check(
                &call.raw_arguments,
                ctx.deps.settings.worker.max_argument_checks,
            )
            .await
        {
            Ok(args) => {
                let dispatch = Box::pin(tool_calls::mark_dispatched(
                    &ctx.deps.pool,
                    ctx.fence,
                    &call.tool_call_id,
                ))
                .await?;
                (args, dispatch)
            }
            Err(msg) => return fail(msg).await,
        },
    };
    let span = tracing::Span::current();
    let kind = match spec.target {
        Target::Http { .. } => ToolKind::Http.as_str(),
        Target::Mcp { .. } => ToolKind::Mcp.as_str(),
        Target::ExpandMessage => "builtin",
    };
    span.record("kind", kind);
    span.record("dispatch", dispatch);
    agentfleet_shared::failpoint::hit(&format!("tool:{}", call.name));
    // Goes out alongside the call it announces (see the emitter's note): a call retried by
    // the next holder announces itself again, and `tool_completed` still follows it.
    let announce = ctx
        .emitter
        .emit_ahead(EventType::ToolStarted, json!({
            "tool_call_id": call.tool_call_id, "name": call.name, "arguments": args, "dispatch": dispatch,
        }));
    let settings = &ctx.deps.settings.worker;
    let timeout =
        std::time::Duration::from_millis(spec.timeout_ms.unwrap_or(settings.tool_timeout_ms));
    let started = std::time::Instant::now();
    let call_fut = async {
        let _out = ctx.timing.tool_out();
        match &spec.target {
            Target::Http { url } => {
                http::call(
                    &ctx.deps.tools_http,
                    &ctx.deps.egress,
                    url,
                    ctx.fence.run_id,
                    &call.tool_call_id,
                    &args,
                    timeout,
                    settings.max_tool_result_bytes,
                )
                .await
            }
            // Boxed: an MCP call's future (session set-up, listing, the call) is several
            // times an HTTP call's, and inline it would size every tool call's future.
            Target::Mcp { server, tool } => {
                Box::pin(mcp::call(
                    &ctx.deps.tools_http,
                    &ctx.deps.egress,
                    server,
                    tool,
                    ctx.fence.run_id,
                    &call.tool_call_id,
                    &args,
                    timeout,
                    settings.max_tool_result_bytes,
                ))
                .await
            }
            Target::ExpandMessage => {
                let history = ctx.history.lock().expect("history lock");
                builtin::expand(
                    history.as_deref().map_or(&[][..], |h| h),
                    &args,
                    ctx.deps.settings.context.expand_max_bytes,
                )
            }
        }
    };
    let (announced, outcome) = tokio::select! {
        both = async { tokio::join!(biased; announce, call_fut) } => both,
        _ = ctx.stop.stopped() => return Err(RunError::Stopped),
    };
    announced?;
    metrics::histogram!("agentfleet_tool_call_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    let status = if outcome.ok {
        ToolCallStatus::Succeeded
    } else {
        ToolCallStatus::Failed
    };
    metrics::counter!("agentfleet_tool_calls_total", "outcome" => status.as_str()).increment(1);
    span.record("outcome", status.as_str());
    if !outcome.ok {
        span.record("otel.status_code", "error");
    }
    let completed = json!({
        "tool_call_id": call.tool_call_id, "name": call.name, "ok": outcome.ok,
        "result": outcome.result, "truncated": outcome.truncated,
    });
    if behind {
        let settled = (status, outcome.result, outcome.model_content.as_str());
        finish_behind(ctx, iteration, call, settled, completed).await?;
        return Ok(());
    }
    finish(
        ctx,
        iteration,
        call,
        status,
        outcome.result.clone(),
        &outcome.model_content,
    )
    .await?;
    // The result is committed; the holder goes on while it is announced (see the emitter's
    // note): the next event (a pause, the end) follows it.
    ctx.emitter
        .emit_behind(EventType::ToolCompleted, completed)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ToolCallStatus::*;

    fn call(name: &str, status: ToolCallStatus, risk: Risk) -> ToolCallRow {
        ToolCallRow {
            id: uuid::Uuid::now_v7(),
            run_id: uuid::Uuid::nil(),
            tool_call_id: format!("call_{name}"),
            iteration: 1,
            position: 0,
            name: name.to_owned(),
            raw_arguments: "{}".to_owned(),
            arguments: None,
            risk,
            status,
            result: None,
            error: None,
            dispatch_count: 0,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            created_at: chrono::Utc::now(),
            started_at: None,
            finished_at: None,
        }
    }

    fn names(calls: &[&ToolCallRow]) -> Vec<String> {
        calls.iter().map(|c| c.name.clone()).collect()
    }

    fn run_step(p: &Plan<'_>) -> (Vec<String>, String) {
        match &p.step {
            Step::Run { calls, then } => (
                names(calls),
                format!("{then:?}").split('(').next().unwrap().to_owned(),
            ),
            Step::Confirm(c) => panic!("expected to run, got a confirmation of {:?}", names(c)),
        }
    }

    #[test]
    fn low_risk_calls_run_and_the_loop_goes_on() {
        let calls = [call("a", Pending, Risk::Low), call("b", Pending, Risk::Low)];
        let p = plan(&calls);
        assert!(p.skip.is_empty());
        assert_eq!(
            run_step(&p),
            (vec!["a".into(), "b".into()], "NextIteration".into())
        );
    }

    #[test]
    fn calls_after_a_terminating_call_are_skipped_and_the_ones_before_run() {
        let calls = [
            call("a", Pending, Risk::Low),
            call(builtin::COMPLETE, Pending, Risk::Low),
            call("late", Pending, Risk::High),
            call("done_late", Skipped, Risk::Low),
        ];
        let p = plan(&calls);
        assert_eq!(
            names(&p.skip),
            ["late"],
            "finished calls are not skipped again"
        );
        assert_eq!(run_step(&p), (vec!["a".into()], "Complete".into()));
    }

    #[test]
    fn an_undecided_risky_call_holds_back_every_call_of_the_response() {
        let calls = [
            call("safe", Pending, Risk::Low),
            call("pay", Pending, Risk::High),
            call(builtin::ASK, Pending, Risk::Low),
            call("after_ask", Pending, Risk::Low),
        ];
        let p = plan(&calls);
        let Step::Confirm(undecided) = &p.step else {
            panic!("ran calls while one awaits a decision: {:?}", p.step);
        };
        assert_eq!(names(undecided), ["pay"]);
        assert_eq!(
            names(&p.skip),
            ["after_ask"],
            "skips are recorded even while pausing"
        );
    }

    #[test]
    fn after_the_decision_approved_and_low_risk_calls_run_and_rejected_ones_do_not() {
        let calls = [
            call("safe", Pending, Risk::Low),
            call("pay", Approved, Risk::High),
            call("refund", Rejected, Risk::High),
        ];
        assert_eq!(
            run_step(&plan(&calls)),
            (vec!["safe".into(), "pay".into()], "NextIteration".into())
        );
    }

    #[test]
    fn a_recovered_attempt_redoes_only_what_is_left() {
        let calls = [
            call("finished", Succeeded, Risk::Low),
            call("interrupted", Running, Risk::Low),
            call("failed", Failed, Risk::Low),
            call(builtin::COMPLETE, Succeeded, Risk::Low),
        ];
        assert_eq!(
            run_step(&plan(&calls)),
            (vec!["interrupted".into()], "Completed".into())
        );
    }

    #[test]
    fn ask_pauses_once_and_an_answered_ask_goes_on() {
        let waiting = [call(builtin::ASK, AwaitingInput, Risk::Low)];
        assert_eq!(run_step(&plan(&waiting)), (vec![], "Ask".into()));
        let answered = [call(builtin::ASK, Succeeded, Risk::Low)];
        assert_eq!(run_step(&plan(&answered)), (vec![], "NextIteration".into()));
    }

    #[test]
    fn only_the_first_terminating_call_counts() {
        let calls = [
            call(builtin::ASK, Pending, Risk::Low),
            call(builtin::COMPLETE, Pending, Risk::Low),
        ];
        let p = plan(&calls);
        assert_eq!(names(&p.skip), [builtin::COMPLETE]);
        assert_eq!(run_step(&p), (vec![], "Ask".into()));
    }
}
