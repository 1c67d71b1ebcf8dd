//! Plan-and-solve on the planner's side (docs/architecture.md "Plan and solve"): checking a
//! `plan` call, announcing its round, and taking the round's results up when the planner is
//! claimed again (the fan-in's other half is the trigger that makes it runnable).

use serde_json::{Value, json};

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::events::{EventType, Expiry, Floor, NewEvent};
use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::plans::{self, CreatedTask, NewTask};
use agentfleet_shared::store::tool_calls::ToolCallRow;

use crate::run_ctx::{RunCtx, RunError};
use crate::tools::builtin;

/// The planner's system prompt when `agent.plan.planner_prompt` is absent.
pub const PLANNER_PROMPT: &str = "You plan the work for the user's request. Split it into \
    tasks and call `plan` with them: the tasks of one call run in parallel, each done by an \
    executor agent that sees only its task's input, so make every input self-contained. The \
    result of `plan` is every task's outcome. Then call `plan` again for a next round that \
    builds on them, or call `complete` when the request is answered.";

/// The summary turn's system prompt when `agent.plan.summary_prompt` is absent.
pub const SUMMARY_PROMPT: &str = "Write the final answer to the user's request from the plan \
    and the results of its tasks above. Answer the request directly; do not describe the \
    process.";

/// Most bytes of a task's output in its `task_completed` event.
const EVENT_OUTPUT_BYTES: usize = 500;

/// The tasks of this planner's `plan` call, or why it is refused (what the model reads).
pub fn checked(ctx: &RunCtx, raw_arguments: &str) -> Result<Vec<NewTask>, String> {
    let plan = ctx.run.agent.planning().unwrap_or_default();
    builtin::check_plan(
        raw_arguments,
        plan.max_tasks,
        ctx.run.plan_round,
        plan.max_rounds,
        ctx.deps.settings.api.max_input_bytes,
    )
}

/// The tasks of a valid `plan` call if the tenant has room for them under its
/// `max_active_runs`, else why not (kept for [`refusal`]).
pub async fn room_for(ctx: &RunCtx, tasks: Vec<NewTask>) -> Result<Option<Vec<NewTask>>, RunError> {
    let default = ctx.deps.settings.limits.max_active_runs;
    match plans::room_for_tasks(&ctx.deps.pool, ctx.run.id, default, tasks.len()).await {
        Ok(()) => Ok(Some(tasks)),
        Err(StoreError::TooManyActiveRuns {
            max,
            active,
            new_runs,
        }) => {
            let why = format!(
                "the tenant has {active} runs not yet ended, and {new_runs} tasks more would \
                 pass its limit of {max} (limits.max_active_runs): plan fewer tasks, or \
                 complete"
            );
            *ctx.plan_refusal.lock().expect("plan refusal lock") = Some(why);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why a `plan` call that created no round was refused.
pub fn refusal(ctx: &RunCtx, call: &ToolCallRow) -> String {
    if let Some(why) = ctx.plan_refusal.lock().expect("plan refusal lock").take() {
        return why;
    }
    checked(ctx, &call.raw_arguments)
        .err()
        .unwrap_or_else(|| "the round was not started; call `plan` again".to_owned())
}

/// Announces a round just committed: each task's `run_queued` (event 1 of its stream, as the
/// API writes it for the runs it creates, before any worker can claim the task), then
/// `plan_created` with the tasks' run ids. A task whose `run_queued` is lost (Redis down, a
/// crash before this) starts its stream with `stream_rebuilt`, as any run.
pub async fn announce(
    ctx: &RunCtx,
    round: i32,
    tasks: &[NewTask],
    created: &[CreatedTask],
) -> Result<(), RunError> {
    let queued = json!({"status": "queued"});
    let waiting = json!({"status": RunStatus::WaitingForSlot});
    let events: Vec<NewEvent<'_>> = created
        .iter()
        .map(|c| NewEvent {
            run_id: c.id,
            thread_id: c.thread_id,
            kind: EventType::RunQueued,
            data: if c.status == RunStatus::WaitingForSlot {
                &waiting
            } else {
                &queued
            },
        })
        .collect();
    match ctx
        .deps
        .bus
        .append_many(&events, 0, Floor::Exact(0), Expiry::Persist)
        .await
    {
        Ok(outcomes) => {
            for (c, outcome) in created.iter().zip(outcomes) {
                if let Err(e) = outcome {
                    tracing::warn!(run_id = %c.id, error = %e, "could not append a task's run_queued");
                }
            }
        }
        Err(e) => {
            tracing::warn!(tasks = created.len(), error = %e, "could not append the tasks' run_queued");
        }
    }
    let listed: Vec<Value> = created
        .iter()
        .map(|c| {
            json!({
                "task_index": c.task_index,
                "title": tasks.get(c.task_index as usize).map(|t| t.title.as_str()),
                "run_id": c.id,
                "status": c.status,
            })
        })
        .collect();
    ctx.emitter
        .emit(
            EventType::PlanCreated,
            json!({"round": round, "tasks": listed}),
        )
        .await?;
    Ok(())
}

/// The planner's round is over (its claim follows the end of the round's last task): each
/// task's outcome is announced (`task_completed`, then `round_completed`) and becomes the
/// `plan` call's result, bounded by `worker.max_tool_result_bytes`. A holding that takes over
/// before that result is committed announces them again.
pub async fn fan_in(ctx: &RunCtx) -> Result<(Value, String), RunError> {
    let round = ctx.run.plan_round;
    let results = Box::pin(plans::round_results(
        &ctx.deps.pool,
        ctx.fence.run_id,
        round,
    ))
    .await?;
    let limit = ctx.deps.settings.worker.max_tool_result_bytes;
    // What the result takes without the outputs; each completed task's output gets an equal
    // share of the rest (as JSON text: escapes count).
    let bare: Vec<Value> = results
        .iter()
        .map(|t| {
            let mut bare = json!({"task_index": t.task_index, "title": t.title,
                                  "run_id": t.id, "status": t.status});
            match t.status {
                RunStatus::Completed => bare["output"] = json!(""),
                _ => bare["error"] = error_of(t),
            }
            bare
        })
        .collect();
    let envelope = json!({"round": round, "tasks": bare}).to_string().len();
    let outputs = results
        .iter()
        .filter(|t| t.status == RunStatus::Completed)
        .count()
        .max(1);
    // (`"truncated":true,` takes 18 bytes more where an output is cut.)
    let share = limit.saturating_sub(envelope + 18 * outputs) / outputs;
    let mut listed = Vec::with_capacity(results.len());
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for task in &results {
        *counts.entry(task.status.as_str()).or_default() += 1;
        let mut entry = json!({
            "task_index": task.task_index,
            "title": task.title,
            "run_id": task.id,
            "status": task.status,
        });
        let mut event = entry.clone();
        event["round"] = json!(round);
        if task.status == RunStatus::Completed {
            let output = task.output.as_deref().unwrap_or_default();
            let (kept, cut) = cut_encoded(output, share);
            entry["output"] = json!(kept);
            if cut {
                entry["truncated"] = json!(true);
            }
            event["output"] = json!(cut_text(output, EVENT_OUTPUT_BYTES));
        } else {
            let error = error_of(task);
            entry["error"] = error.clone();
            event["error"] = error;
        }
        ctx.emitter.emit(EventType::TaskCompleted, event).await?;
        listed.push(entry);
    }
    ctx.emitter
        .emit(
            EventType::RoundCompleted,
            json!({"round": round, "tasks": results.len(), "statuses": counts}),
        )
        .await?;
    let result = json!({"round": round, "tasks": listed});
    let content = result.to_string();
    Ok((result, content))
}

/// A task's error as the planner reads it: the run's, else its status said.
fn error_of(task: &plans::TaskResult) -> Value {
    task.error.as_ref().map(|e| e.0.clone()).unwrap_or_else(|| {
        json!({"code": task.status.as_str(), "message": format!("the task was {}", task.status)})
    })
}

/// `text` cut to at most `max` bytes (on a character boundary), and whether it was cut.
fn cut(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

/// `text` cut so that its JSON string (quotes and escapes included) takes at most `max` bytes.
fn cut_encoded(text: &str, max: usize) -> (&str, bool) {
    let encoded = |t: &str| serde_json::to_string(t).map_or(usize::MAX, |e| e.len());
    let (mut kept, mut was_cut) = cut(text, max);
    while !kept.is_empty() && encoded(kept) > max {
        let excess = encoded(kept) - max;
        kept = cut(kept, kept.len().saturating_sub(excess.max(1))).0;
        was_cut = true;
    }
    (kept, was_cut)
}

fn cut_text(text: &str, max: usize) -> &str {
    cut(text, max).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_cut_on_character_boundaries() {
        assert_eq!(cut("abc", 5), ("abc", false));
        assert_eq!(cut("abcdef", 3), ("abc", true));
        assert_eq!(cut("ééé", 3), ("é", true));
    }

    #[test]
    fn encoded_outputs_fit_their_share() {
        assert_eq!(cut_encoded("abc", 5), ("abc", false));
        let (kept, cut) = cut_encoded("\"\"\"\"", 6);
        assert!(
            cut && serde_json::to_string(kept).unwrap().len() <= 6,
            "{kept}"
        );
        assert_eq!(cut_encoded("abc", 1), ("", true));
    }
}
