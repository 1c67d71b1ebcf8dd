//! Settling the tool calls of one iteration. The same function serves a fresh model response,
//! a run resumed after a decision or an answer, and a run recovered after a crash: it looks at
//! the recorded status of each call and does only what is left.
//!
//! Order of a response: calls before the first terminating call (`ask`, `complete`) run; calls
//! after it are skipped. If any call before it needs confirmation, nothing runs until every
//! such call is decided: then the approved ones and the low-risk ones run, and the rejected
//! ones give the model the user's rejection.

use futures_util::future::join_all;
use serde_json::json;

use agentfleet_shared::domain::{Risk, ToolCallStatus};
use agentfleet_shared::events::EventType;
use agentfleet_shared::store::tool_calls::{self, ToolCallRow};

use super::{builtin, check_arguments, http};
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

pub async fn settle(ctx: &RunCtx, iteration: i32) -> Result<Settled, RunError> {
    let calls = tool_calls::of_iteration(&ctx.shared.pool, ctx.fence.run_id, iteration).await?;
    if calls.is_empty() {
        return Ok(Settled::Complete);
    }
    let term = calls.iter().position(|c| builtin::is_terminating(&c.name));
    let (before, rest) = calls.split_at(term.unwrap_or(calls.len()));
    if let Some((_, after)) = rest.split_first() {
        for call in after.iter().filter(|c| !c.status.is_finished()) {
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
    }
    let needs_decision: Vec<&ToolCallRow> = before
        .iter()
        .filter(|c| c.status == ToolCallStatus::Pending && c.risk == Risk::High)
        .collect();
    if !needs_decision.is_empty() {
        pause::for_confirmation(ctx, &needs_decision).await?;
        return Ok(Settled::Paused);
    }
    let runnable: Vec<&ToolCallRow> = before
        .iter()
        .filter(|c| {
            matches!(
                c.status,
                ToolCallStatus::Pending | ToolCallStatus::Approved | ToolCallStatus::Running
            )
        })
        .collect();
    if !runnable.is_empty() {
        let started = std::time::Instant::now();
        let results = join_all(runnable.into_iter().map(|c| execute(ctx, iteration, c))).await;
        ctx.timing.add_tools(started.elapsed());
        results.into_iter().collect::<Result<Vec<()>, RunError>>()?;
    }
    let Some(call) = rest.first() else {
        return Ok(Settled::NextIteration);
    };
    match (call.name.as_str(), call.status) {
        (builtin::ASK, ToolCallStatus::Pending | ToolCallStatus::AwaitingInput) => {
            match check_arguments(&call.raw_arguments, &builtin::ask_schema()) {
                Ok(args) => {
                    pause::for_input(ctx, call, &args).await?;
                    Ok(Settled::Paused)
                }
                Err(msg) => {
                    let content = json!({"error": msg}).to_string();
                    finish(
                        ctx,
                        iteration,
                        call,
                        ToolCallStatus::Failed,
                        json!({"error": msg}),
                        &content,
                    )
                    .await?;
                    Ok(Settled::NextIteration)
                }
            }
        }
        (builtin::COMPLETE, status) if !status.is_finished() => {
            let args = check_arguments(&call.raw_arguments, &builtin::complete_schema())
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
        (builtin::COMPLETE, ToolCallStatus::Succeeded) => Ok(Settled::Complete),
        _ => Ok(Settled::NextIteration),
    }
}

async fn finish(
    ctx: &RunCtx,
    iteration: i32,
    call: &ToolCallRow,
    status: ToolCallStatus,
    result: serde_json::Value,
    model_content: &str,
) -> Result<(), RunError> {
    let error = (status == ToolCallStatus::Failed).then_some(model_content);
    tool_calls::finish(
        &ctx.shared.pool,
        ctx.fence,
        ctx.run.thread_id,
        iteration,
        &call.tool_call_id,
        status,
        Some(&result),
        error,
        model_content,
    )
    .await?;
    Ok(())
}

/// Runs one call: recorded as dispatched before it leaves, and its outcome after.
#[tracing::instrument(name = "tool_call", skip(ctx, call), fields(tool = %call.name, tool_call_id = %call.tool_call_id))]
async fn execute(ctx: &RunCtx, iteration: i32, call: &ToolCallRow) -> Result<(), RunError> {
    let fail =
        |msg: String| async move {
            let content = json!({"error": msg}).to_string();
            finish(
                ctx,
                iteration,
                call,
                ToolCallStatus::Failed,
                json!({"error": msg}),
                &content,
            )
            .await?;
            ctx.emitter
            .emit(EventType::ToolCompleted, json!({
                "tool_call_id": call.tool_call_id, "name": call.name, "ok": false, "error": msg,
            }))
            .await?;
            metrics::counter!("agentfleet_tool_calls_total", "outcome" => "rejected_arguments")
                .increment(1);
            Ok::<(), RunError>(())
        };
    let Some(spec) = ctx.run.agent.tool(&call.name) else {
        return fail(format!("unknown tool `{}`", call.name)).await;
    };
    let args = match check_arguments(&call.raw_arguments, &spec.parameters) {
        Ok(a) => a,
        Err(msg) => return fail(msg).await,
    };
    let dispatch =
        tool_calls::mark_dispatched(&ctx.shared.pool, ctx.fence, &call.tool_call_id).await?;
    agentfleet_shared::failpoint::hit(&format!("tool:{}", call.name));
    ctx.emitter
        .emit(EventType::ToolStarted, json!({
            "tool_call_id": call.tool_call_id, "name": call.name, "arguments": args, "dispatch": dispatch,
        }))
        .await?;
    let settings = &ctx.shared.settings.worker;
    let timeout =
        std::time::Duration::from_millis(spec.timeout_ms.unwrap_or(settings.tool_timeout_ms));
    let started = std::time::Instant::now();
    let outcome = match spec.kind {
        agentfleet_shared::domain::ToolKind::Http => {
            let call_fut = http::call(
                &ctx.shared.http,
                &spec.url,
                ctx.fence.run_id,
                &call.tool_call_id,
                &args,
                timeout,
                settings.max_tool_result_bytes,
            );
            tokio::select! {
                o = call_fut => o,
                _ = ctx.stop.stopped() => return Err(RunError::Stopped),
            }
        }
    };
    metrics::histogram!("agentfleet_tool_call_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    let status = if outcome.ok {
        ToolCallStatus::Succeeded
    } else {
        ToolCallStatus::Failed
    };
    metrics::counter!("agentfleet_tool_calls_total", "outcome" => status.as_str()).increment(1);
    finish(
        ctx,
        iteration,
        call,
        status,
        outcome.result.clone(),
        &outcome.model_content,
    )
    .await?;
    ctx.emitter
        .emit(EventType::ToolCompleted, json!({
            "tool_call_id": call.tool_call_id, "name": call.name, "ok": outcome.ok, "result": outcome.result,
        }))
        .await?;
    Ok(())
}
