//! Pausing a run for a human: the question, the calls to confirm or the reached budget are
//! committed as the run's pending item, the lease is released, and then the pausing event is appended with the
//! retention expiry. Nothing about the paused run stays in this worker.

use serde_json::{Value, json};

use agentfleet_shared::domain::{RunStatus, ToolCallStatus};
use agentfleet_shared::events::{EventType, Expiry, pending_event};
use agentfleet_shared::store::tool_calls::{self, ToolCallRow};
use agentfleet_shared::store::{StoreError, double_text, lock_fenced, transitions};

use crate::run_ctx::{RunCtx, RunError};

pub async fn for_confirmation(ctx: &RunCtx, calls: &[&ToolCallRow]) -> Result<(), RunError> {
    let listed: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({
                "tool_call_id": c.tool_call_id,
                "name": c.name,
                "arguments": c.arguments.as_ref().map(|a| a.0.clone())
                    .unwrap_or(Value::String(c.raw_arguments.clone())),
                "risk": c.risk,
            })
        })
        .collect();
    let pending = json!({"kind": "confirmation", "tool_calls": listed});
    let ids: Vec<String> = calls.iter().map(|c| c.tool_call_id.clone()).collect();
    pause(
        ctx,
        &ids,
        ToolCallStatus::AwaitingConfirmation,
        RunStatus::WaitingForConfirmation,
        &pending,
    )
    .await
}

pub async fn for_input(ctx: &RunCtx, call: &ToolCallRow, args: &Value) -> Result<(), RunError> {
    let pending = json!({
        "kind": "input",
        "tool_call_id": call.tool_call_id,
        "question": args.get("text").cloned().unwrap_or(Value::Null),
        "attachments": args.get("attachments").cloned().unwrap_or(json!([])),
    });
    let ids = std::slice::from_ref(&call.tool_call_id);
    pause(
        ctx,
        ids,
        ToolCallStatus::AwaitingInput,
        RunStatus::WaitingForInput,
        &pending,
    )
    .await
}

/// The tenant's daily token budget is reached and `worker.on_budget_exceeded = "pause"`: the
/// run waits for input between iterations (no tool call is left open). A resume queues it
/// again; its next holding checks the budget before any model call, so a resume while the
/// budget is still exhausted only pauses again.
pub async fn for_budget(ctx: &RunCtx, used: i64, limit: u64) -> Result<(), RunError> {
    let question = format!(
        "The tenant's daily token budget is used up: {used} tokens today (UTC), budget \
         tokens_per_day = {limit}. Raise the tenant's tokens_per_day or wait for the next UTC \
         day, then resume the run with POST /v1/runs/{}/resume {{\"input\": \"...\"}}; the \
         input becomes the next user message.",
        ctx.fence.run_id
    );
    let pending = json!({
        "kind": "budget",
        "budget": "tenant",
        "used": used,
        "limit": limit,
        "question": question,
    });
    pause(
        ctx,
        &[],
        ToolCallStatus::AwaitingInput,
        RunStatus::WaitingForInput,
        &pending,
    )
    .await
}

/// Commits the pause (fenced), then announces it. The run records the id its pausing event
/// will get, so the API can tell whether the event made it to the stream.
async fn pause(
    ctx: &RunCtx,
    call_ids: &[String],
    call_status: ToolCallStatus,
    run_status: RunStatus,
    pending: &Value,
) -> Result<(), RunError> {
    // Read before the transaction: it waits for the holder's appends still in flight.
    let next_id = ctx.emitter.next_id().await;
    let mut tx = Box::pin(ctx.deps.pool.begin())
        .await
        .map_err(StoreError::from)?;
    lock_fenced(&mut tx, ctx.fence).await?;
    // Under the run's lock: an interrupt committed before it must end the run, not pause it
    // (a paused run would keep the newer message waiting for a human). One committed after
    // it finds the run paused and cancels it itself.
    if ctx.stop.interrupt_requested()
        || double_text::interrupt_requested(&mut tx, ctx.fence.run_id).await?
    {
        return Err(RunError::Interrupted);
    }
    if !call_ids.is_empty() {
        tool_calls::set_status(&mut tx, ctx.fence.run_id, call_ids, call_status).await?;
    }
    transitions::wait(&mut tx, ctx.fence, run_status, pending, next_id).await?;
    // The commit ends the lease: renewals stop first, or one landing after it would stop
    // this holding before the pausing event is appended.
    ctx.deps.leases.release(ctx.fence);
    tx.commit().await.map_err(StoreError::from)?;
    // The lease suite holds the holder here past a lease renewal.
    if let Some(hold) = agentfleet_shared::failpoint::delay("pause:after_commit") {
        tokio::time::sleep(hold).await;
    }
    metrics::counter!("agentfleet_runs_total", "status" => run_status.as_str()).increment(1);
    let (kind, data) = pending_event(pending);
    debug_assert!(matches!(
        kind,
        EventType::InputRequired | EventType::ConfirmationRequired
    ));
    ctx.emitter.emit_with(kind, data, Expiry::Expire).await?;
    Ok(())
}
