//! One model turn: load the history, fit it into the context budget, call the model, and
//! commit the assistant message with its tool calls (fenced) before announcing it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tracing::Instrument;

use agentfleet_shared::config::ToolCalling;
use agentfleet_shared::domain::{Risk, ToolCallStatus};
use agentfleet_shared::events::{EventType, Expiry};
use agentfleet_shared::store::plans::{self, NewTask};
use agentfleet_shared::store::tool_calls::{NewToolCall, ToolCallRow};
use agentfleet_shared::store::turns::{self, Turn};
use agentfleet_shared::store::{StoreError, messages};

use crate::budget::Spent;
use crate::history::History;
use crate::model_call::{self, DeltaPolicy, Messages, ModelError, ModelRequest, ModelResponse};
use crate::run_ctx::{RunCtx, RunError};
use crate::tools;
use crate::usage::{self, TurnUsage};

/// What a committed turn leaves to do.
pub enum Turned {
    /// The calls the model made, as recorded (at least one), to settle.
    Calls(Vec<ToolCallRow>),
    /// A final answer: the statement that recorded it also ended the run `completed`
    /// ([`Turn::ends`]); `promoted` is the run waiting for the thread that the end started.
    Completed { promoted: Option<uuid::Uuid> },
    /// A planner's `plan` call: its round of tasks was committed with the turn, and the run
    /// now waits for them (`waiting_for_tasks`).
    Planned,
}

/// Which turn of the run: the agent's (or planner's) own, or a planner's summary turn,
/// which offers no tools and whose answer ends the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Turn,
    Summary,
}

/// Calls the model and commits its turn; `started` is when the iteration began (a final
/// answer's timing closes when its commit has answered).
pub async fn model_turn(
    ctx: &RunCtx,
    iteration: i32,
    started: DateTime<Utc>,
    phase: Phase,
) -> Result<Turned, RunError> {
    let turn_started = Instant::now();
    // Goes out alongside the preparation and the model call it announces (see the emitter's
    // note): an event emitted on the way (deltas, a compaction) still follows it.
    let announce = ctx
        .emitter
        .emit_ahead(EventType::IterationStarted, json!({"iteration": iteration}));
    let (announced, called) = tokio::join!(biased; announce, call_model(ctx, iteration, phase));
    announced?;
    let (mut response, usage, summary_usage) = called?;
    // Summaries made to fit this call's history are billed with it.
    let billed = usage.plus(summary_usage).bounded();
    let round = match phase {
        // The summary's text is the answer: no call of it is run.
        Phase::Summary => {
            response.tool_calls.clear();
            None
        }
        Phase::Turn if ctx.planner() => planned_round(ctx, &mut response).await?,
        Phase::Turn => None,
    };
    // A final answer ends the run in the statement that records it; a planner's answer
    // without calls is followed by its summary turn.
    let ending = response.tool_calls.is_empty() && (phase == Phase::Summary || !ctx.planner());
    let (recorded, promoted, created) =
        persist(ctx, iteration, &response, &billed, ending, round.as_ref()).await?;
    let calls: Vec<Value> = response
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
        .collect();
    let completed = json!({
        "iteration": iteration,
        "content": response.content,
        "tool_calls": calls,
        "finish_reason": response.finish_reason,
        "usage": {"prompt_tokens": usage.prompt_tokens,
                  "completion_tokens": usage.completion_tokens,
                  "estimated": usage.estimated},
    });
    metrics::histogram!("agentfleet_iteration_duration_seconds")
        .record(turn_started.elapsed().as_secs_f64());
    if ending {
        // Closed now that the commit has answered; the next turn of any run carries it.
        let timing = closed_timing(ctx, iteration, started, ctx.timing.take());
        ctx.deps
            .late_timings
            .lock()
            .expect("timings lock")
            .push(timing);
        // Goes out with `run_completed`, in one round trip (see the emitter's note).
        ctx.emitter
            .defer(EventType::MessageCompleted, completed, Expiry::Keep);
        return Ok(Turned::Completed { promoted });
    }
    ctx.emitter
        .emit(EventType::MessageCompleted, completed)
        .await?;
    if let (Some(tasks), Some(created)) = (round, created) {
        crate::plan::announce(ctx, ctx.run.plan_round + 1, &tasks, &created).await?;
        if !ctx.run.fair {
            // A `fair` planner's tasks are held: the dispatch after this holding sends them.
            let ready: Vec<uuid::Uuid> = created
                .iter()
                .filter(|c| c.status == agentfleet_shared::domain::RunStatus::Queued && !c.held)
                .map(|c| c.id)
                .collect();
            // The fault suite crashes here: the round is committed, its tasks not published
            // (the sweeper publishes them).
            agentfleet_shared::failpoint::hit("plan:before_publish");
            for id in ready {
                if let Err(e) = ctx.deps.publisher.publish_run(id).await {
                    tracing::warn!(run_id = %id, error = %e, "publish of a task failed; the sweeper will re-enqueue");
                }
            }
        }
        return Ok(Turned::Planned);
    }
    Ok(Turned::Calls(recorded))
}

/// A planner's response that starts a round: its first terminating call is a `plan` whose
/// arguments hold a valid round. The response then keeps that call alone (calls after it
/// would be skipped, and the run will not be running to record them). `None` leaves the
/// response as it is: a refused `plan` (invalid, or more tasks than the tenant's
/// `max_active_runs` leaves room for) is answered with its error when settled.
async fn planned_round(
    ctx: &RunCtx,
    response: &mut ModelResponse,
) -> Result<Option<Vec<NewTask>>, RunError> {
    let Some(first) = response
        .tool_calls
        .iter()
        .position(|c| tools::builtin::is_terminating(&c.name) || c.name == tools::builtin::PLAN)
    else {
        return Ok(None);
    };
    if response.tool_calls[first].name != tools::builtin::PLAN {
        return Ok(None);
    }
    let Ok(tasks) = crate::plan::checked(ctx, &response.tool_calls[first].arguments) else {
        return Ok(None);
    };
    let Some(tasks) = crate::plan::room_for(ctx, tasks).await? else {
        return Ok(None);
    };
    let call = response.tool_calls.swap_remove(first);
    response.tool_calls = vec![call];
    Ok(Some(tasks))
}

/// Reads the history, fits it into the context budget and calls the model: the model's
/// answer (with ids of its own for its calls), its usage and that of any summaries made.
async fn call_model(
    ctx: &RunCtx,
    iteration: i32,
    phase: Phase,
) -> Result<(ModelResponse, TurnUsage, TurnUsage), RunError> {
    let history = history(ctx).await?;
    let taken = tool_call_ids(&history);
    let agent = &ctx.run.agent.0;
    let model = ctx
        .deps
        .settings
        .models
        .get(&agent.model)
        .ok_or_else(|| ModelError::UnknownModel(agent.model.clone()))?;
    let system_of = |prompt: Option<&str>| {
        let message = prompt
            .filter(|s| !s.is_empty())
            .map(|prompt| json!({"role": "system", "content": prompt}));
        Arc::new(History::from(message.into_iter().collect::<Vec<_>>()))
    };
    let plan = agent.planning();
    let system = match (phase, &plan) {
        (Phase::Summary, plan) => system_of(Some(
            plan.as_ref()
                .and_then(|p| p.summary_prompt.as_deref())
                .unwrap_or(crate::plan::SUMMARY_PROMPT),
        )),
        (Phase::Turn, Some(plan)) => Arc::clone(ctx.system.get_or_init(|| {
            system_of(Some(
                plan.planner_prompt
                    .as_deref()
                    .unwrap_or(crate::plan::PLANNER_PROMPT),
            ))
        })),
        (Phase::Turn, None) => Arc::clone(
            ctx.system
                .get_or_init(|| system_of(agent.system_prompt.as_deref())),
        ),
    };
    let catalog = ctx.catalog().await?;
    let mut tools = match phase {
        Phase::Turn => Cow::Borrowed(catalog.definitions()),
        Phase::Summary => Cow::Borrowed(&[][..]),
    };
    let xml = model.tool_calling == ToolCalling::Xml;
    // An XML-mode model reads the tools in its system prompt: that is what is counted.
    let (counted_system, counted_tools) = if xml && phase == Phase::Turn {
        let mut all = tools.to_vec();
        all.push(tools::builtin::expand_definition());
        let section = crate::xml_calls::tools_section(&all);
        let text = system
            .first()
            .and_then(|s| s["content"].as_str())
            .unwrap_or_default();
        let system = json!({"role": "system", "content": format!("{text}\n\n{section}")});
        (Arc::new(History::from(vec![system])), &[][..])
    } else {
        (Arc::clone(&system), &tools[..])
    };
    let (mut messages, summary_usage) = crate::context_summary::prompt(
        ctx,
        model,
        counted_system,
        counted_tools,
        history,
        iteration,
    )
    .await?;
    if phase == Phase::Turn && ctx.compaction.lock().expect("compaction lock").active() {
        tools.to_mut().push(tools::builtin::expand_definition());
    }
    if xml {
        // The fitted history without the counted system message, rendered with the real one
        // (a summary turn's too: such a model reads its history's calls as XML).
        let history = History::into_messages(messages.history);
        messages = Messages::from(crate::xml_calls::to_xml_history(
            system.iter().cloned().chain(history).collect(),
            &tools,
        ));
        tools = Cow::Borrowed(&[]);
    }
    // The catalog's own serialisation, unless this call offers other tools (or none).
    let as_cataloged = std::ptr::eq(tools.as_ptr(), catalog.definitions().as_ptr())
        && tools.len() == catalog.definitions().len();
    let request = ModelRequest {
        model,
        messages,
        tools_json: as_cataloged.then(|| catalog.definitions_json()),
        tools,
    };
    let events = &ctx.deps.settings.events;
    let policy = DeltaPolicy {
        flush_after: std::time::Duration::from_millis(events.delta_flush_ms),
        flush_bytes: events.delta_flush_bytes,
        waited_us: Default::default(),
    };
    let model_started = Instant::now();
    let span = model_span(&model.model, request.messages.len());
    let response = model_call::call(
        &ctx.deps.model_http,
        &ctx.deps.settings.worker,
        &request,
        &ctx.emitter,
        &policy,
    )
    .instrument(span.clone())
    .await;
    let waited = std::time::Duration::from_micros(
        policy.waited_us.load(std::sync::atomic::Ordering::Relaxed),
    );
    ctx.timing
        .add_model(model_started.elapsed().saturating_sub(waited));
    let mut response = match response {
        Ok(r) => r,
        Err(e) => {
            span.record("status", e.code());
            span.record("otel.status_code", "error");
            return Err(e.into());
        }
    };
    unique_call_ids(&mut response, taken);
    let usage = usage::of_call(&request.messages, &request.tools, &response)
        .await
        .bounded();
    span.record("status", "ok");
    span.record("prompt_tokens", usage.prompt_tokens);
    span.record("completion_tokens", usage.completion_tokens);
    span.record("tokens_estimated", usage.estimated);
    span.record("tool_calls", response.tool_calls.len());
    // The span ends here, once its figures are known (an estimate may take a moment).
    drop(span);
    Ok((response, usage, summary_usage))
}

/// `model.call`: the model, how many messages it was sent, and after the call its status,
/// tokens and tool calls. No prompt or answer text (bodies stay out of traces).
fn model_span(model: &str, messages: usize) -> tracing::Span {
    tracing::info_span!(
        "model.call",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        model,
        messages,
        status = tracing::field::Empty,
        prompt_tokens = tracing::field::Empty,
        completion_tokens = tracing::field::Empty,
        tokens_estimated = tracing::field::Empty,
        tool_calls = tracing::field::Empty,
    )
}

/// The history the model sees: read by the claim of a fresh run, else from Postgres on the
/// holding's first turn, then kept in memory.
async fn history(ctx: &RunCtx) -> Result<Arc<History>, RunError> {
    let cached = ctx.history.lock().expect("history lock").clone();
    if let Some(history) = cached {
        return Ok(history);
    }
    // Read once the results this holding settled are committed: read before, their calls
    // would look unanswered (and be "repaired" as never run).
    ctx.outcomes_committed().await?;
    let loaded = Box::pin(messages::llm_history(&ctx.deps.pool, ctx.run.thread_id)).await?;
    let loaded = Arc::new(History::from(loaded));
    *ctx.history.lock().expect("history lock") = Some(Arc::clone(&loaded));
    Ok(loaded)
}

/// The tool call ids the thread's history already holds.
fn tool_call_ids(history: &[Value]) -> HashSet<String> {
    history
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Longest tool call id kept as the model sent it (the column allows 200).
const MAX_CALL_ID: usize = 64;

/// Gives every call an id no other call of the thread has: a model that reuses an id (in one
/// response, or from an earlier turn) or sends an unusable one would otherwise make the turn
/// impossible to record, on every attempt. The assistant message carries the new ids, so the
/// history stays consistent for the provider.
fn unique_call_ids(response: &mut ModelResponse, mut taken: HashSet<String>) {
    for call in &mut response.tool_calls {
        let usable = !call.id.is_empty()
            && call.id.len() <= MAX_CALL_ID
            && call.id.chars().all(|c| c.is_ascii_graphic());
        if !usable || taken.contains(&call.id) {
            let fresh = format!("call_{}", uuid::Uuid::new_v4().simple());
            tracing::debug!(model_id = %call.id.chars().take(80).collect::<String>(), id = %fresh,
                "the model's tool call id was reused or unusable; renamed");
            call.id = fresh;
        }
        taken.insert(call.id.clone());
    }
}

/// The assistant message, its tool calls, the iteration counter, usage and the previous
/// iteration's timing: one statement. Calls that will run at once are recorded as dispatched
/// by the same statement, so a call still costs no write of its own before it leaves; a
/// final answer (`ending`) ends the run in it, and the run it promoted comes back.
async fn persist(
    ctx: &RunCtx,
    iteration: i32,
    response: &ModelResponse,
    usage: &TurnUsage,
    ending: bool,
    round: Option<&Vec<NewTask>>,
) -> Result<Persisted, RunError> {
    if agentfleet_shared::failpoint::error("store:turn") {
        return Err(StoreError::Db(sqlx::Error::PoolTimedOut).into());
    }
    let content = if response.content.is_empty() {
        Value::Null
    } else {
        Value::String(response.content.clone())
    };
    let mut body = json!({"role": "assistant", "content": content});
    if !response.tool_calls.is_empty() {
        body["tool_calls"] = response
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    let mut rows = new_rows(ctx, iteration, response);
    if round.is_some() {
        // The round's creation is the call's dispatch: `running` until its results are in.
        let row = &mut rows[0];
        row.status = ToolCallStatus::Running;
        row.dispatch_count = 1;
        row.started_at = Some(Utc::now());
    } else {
        tools::settle::mark_dispatchable(ctx, &mut rows).await;
    }
    let tool_calls = rows
        .iter()
        .map(|row| {
            NewToolCall {
                id: row.id,
                tool_call_id: &row.tool_call_id,
                position: row.position,
                name: &row.name,
                raw_arguments: &row.raw_arguments,
                arguments: row.arguments.as_ref().map(|a| &a.0),
                risk: row.risk,
                status: row.status,
                dispatch_count: row.dispatch_count,
            }
            .row()
        })
        .collect();
    let (prompt_tokens, completion_tokens, estimated_tokens) = Turn::usage(
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.estimated,
    );
    // The turn follows the last iteration's results in Postgres as it does in the history.
    ctx.outcomes_committed().await?;
    let turn = Turn {
        fence: ctx.fence,
        thread_id: ctx.run.thread_id,
        iteration,
        message: body.clone(),
        tool_calls,
        prompt_tokens,
        completion_tokens,
        estimated_tokens,
        // An ending records the id its `run_completed` will get (after `message_completed`),
        // as a separate end would.
        // (A round records the id of its `plan_created`, which follows `message_completed`.)
        last_event_id: match ending || round.is_some() {
            true => ctx.emitter.next_id().await + 1,
            false => ctx.emitter.last_id().await,
        },
        timing: ctx.take_finished_timing(),
        carried: std::mem::take(&mut *ctx.deps.late_timings.lock().expect("timings lock")),
        ends: ending,
    };
    let (committed, created) = match round {
        None => match ctx.deps.writes.turns.write(turn).await? {
            Some(committed) => (committed, None),
            None => return Err(ctx.fence.lost().into()),
        },
        Some(tasks) => {
            let plan = ctx.run.agent.planning().unwrap_or_default();
            let executor = ctx.run.agent.executor();
            let new = plans::NewRound {
                round: ctx.run.plan_round + 1,
                tasks: tasks.clone(),
                max_iterations: executor
                    .max_iterations
                    .unwrap_or(ctx.deps.settings.worker.default_max_iterations),
                executor,
                max_parallel: plan.max_parallel as i32,
                max_active_runs: ctx.deps.settings.limits.max_active_runs,
            };
            // The commit ends the lease (the planner waits, holding nothing): renewals stop
            // first, or one landing after it would stop this holding before the round is
            // announced (`plan_created`) and its tasks published. A commit that fails ends the
            // holding too, within the lease it has.
            ctx.deps.leases.release(ctx.fence);
            match Box::pin(plans::commit_round(&ctx.deps.pool, turn, new)).await? {
                Some((committed, created)) => (committed, Some(created)),
                None => return Err(ctx.fence.lost().into()),
            }
        }
    };
    // The fault suite crashes here: the round is committed, nothing announced.
    if created.is_some() {
        agentfleet_shared::failpoint::hit("plan:after_commit");
        // The lease suite holds the holder here past a lease renewal.
        if let Some(hold) = agentfleet_shared::failpoint::delay("plan:after_commit") {
            tokio::time::sleep(hold).await;
        }
    }
    ctx.budget.update(Spent::read(
        // A planner's ended tasks count towards its budget.
        committed.run_tokens + ctx.run.task_tokens,
        committed.tenant_tokens_today,
        committed.tenant_tokens_per_day.as_ref(),
        ctx.deps.settings.limits.tokens_per_day,
    ));
    let kind = if usage.estimated {
        "estimated"
    } else {
        "reported"
    };
    metrics::counter!("agentfleet_tokens_total", "kind" => "prompt", "source" => kind)
        .increment(prompt_tokens as u64);
    metrics::counter!("agentfleet_tokens_total", "kind" => "completion", "source" => kind)
        .increment(completion_tokens as u64);
    ctx.remember(body);
    Ok((rows, committed.promoted, created))
}

/// What [`persist`] committed: the calls as recorded, the run an ending promoted, and the
/// tasks of a round.
type Persisted = (
    Vec<ToolCallRow>,
    Option<uuid::Uuid>,
    Option<Vec<plans::CreatedTask>>,
);

/// The response's calls as rows, `pending`, before anything is decided about them.
fn new_rows(ctx: &RunCtx, iteration: i32, response: &ModelResponse) -> Vec<ToolCallRow> {
    let now = Utc::now();
    response
        .tool_calls
        .iter()
        .enumerate()
        .map(|(position, call)| {
            let arguments =
                serde_json::from_str::<Value>(&call.arguments)
                    .ok()
                    .map(|mut parsed| {
                        agentfleet_shared::sanitize::strip_nul_value(&mut parsed);
                        sqlx::types::Json(parsed)
                    });
            ToolCallRow {
                id: uuid::Uuid::now_v7(),
                run_id: ctx.run.id,
                tool_call_id: call.id.clone(),
                iteration,
                position: position as i32,
                name: call.name.clone(),
                raw_arguments: call.arguments.clone(),
                arguments,
                // The catalog was built for this turn's request.
                risk: ctx
                    .catalog
                    .get()
                    .and_then(|c| c.get(&call.name))
                    .map(|t| t.risk)
                    .unwrap_or(Risk::Low),
                status: ToolCallStatus::Pending,
                result: None,
                error: None,
                dispatch_count: 0,
                decided_by: None,
                decided_at: None,
                decision_reason: None,
                created_at: now,
                started_at: None,
                finished_at: None,
            }
        })
        .collect()
}

/// Keeps a finished iteration's timing for the next statement the run commits anyway.
/// Statistics only: a failure to write it never affects the run.
pub fn finish_timing(ctx: &RunCtx, iteration: i32, started: DateTime<Utc>, spent: (i64, i64)) {
    let timing = closed_timing(ctx, iteration, started, spent);
    *ctx.finished_timing.lock().expect("timing lock") = Some(timing);
}

/// An iteration's timing, closed now (its metric recorded).
fn closed_timing(
    ctx: &RunCtx,
    iteration: i32,
    started: DateTime<Utc>,
    (model_us, tools_us): (i64, i64),
) -> turns::IterationTiming {
    let finished = Utc::now();
    let total_us = (finished - started)
        .num_microseconds()
        .unwrap_or(0)
        .max(model_us + tools_us);
    record_framework_time(total_us, model_us, tools_us);
    turns::IterationTiming {
        run_id: ctx.run.id,
        iteration,
        attempt: ctx.fence.attempt,
        started,
        finished,
        model_us,
        tools_us,
        total_us,
    }
}

/// Writes the final iterations' timings that no turn carried (the sweeper's tick, shutdown).
pub async fn write_late_timings(deps: &crate::deps::Deps) {
    let late = std::mem::take(&mut *deps.late_timings.lock().expect("timings lock"));
    if late.is_empty() {
        return;
    }
    if let Err(e) = Box::pin(turns::record_timings(&deps.pool, &late)).await {
        tracing::debug!(error = %e, timings = late.len(), "iteration timings not recorded");
    }
}

fn record_framework_time(total_us: i64, model_us: i64, tools_us: i64) {
    let framework = (total_us - model_us - tools_us).max(0) as f64 / 1e6;
    metrics::histogram!("agentfleet_framework_time_seconds").record(framework);
}

/// Writes a kept timing on its own, when the holding ends without a statement to carry it.
pub async fn flush_timing(ctx: &RunCtx) {
    let Some(timing) = ctx.take_finished_timing() else {
        return;
    };
    if let Err(e) = Box::pin(turns::record_timing(&ctx.deps.pool, &timing)).await {
        tracing::debug!(error = %e, "iteration timing not recorded");
    }
}
