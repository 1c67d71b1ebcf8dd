//! One model turn: load the history, fit it into the context budget, call the model, and
//! commit the assistant message with its tool calls (fenced) before announcing it.

use std::collections::HashSet;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use agentfleet_shared::domain::Risk;
use agentfleet_shared::events::EventType;
use agentfleet_shared::store::tool_calls::NewToolCall;
use agentfleet_shared::store::turns::{self, Turn};
use agentfleet_shared::store::{StoreError, messages};

use crate::context_window;
use crate::model_call::{self, DeltaPolicy, ModelError, ModelRequest, ModelResponse};
use crate::run_ctx::{RunCtx, RunError};
use crate::tools;

#[tracing::instrument(name = "iteration", skip(ctx), fields(run_id = %ctx.run.id, attempt = ctx.fence.attempt))]
/// Returns whether the model called tools (if not, there is nothing to settle).
pub async fn model_turn(ctx: &RunCtx, iteration: i32) -> Result<bool, RunError> {
    let turn_started = Instant::now();
    // Announcing the turn and loading the history are independent: one wait, not two.
    let (announced, history) = tokio::join!(
        ctx.emitter
            .emit(EventType::IterationStarted, json!({"iteration": iteration})),
        messages::llm_history(&ctx.shared.pool, ctx.run.thread_id)
    );
    announced?;
    let history = history?;
    let taken = tool_call_ids(&history);
    let agent = &ctx.run.agent.0;
    let model = ctx
        .shared
        .settings
        .models
        .get(&agent.model)
        .ok_or_else(|| ModelError::UnknownModel(agent.model.clone()))?;
    let reserve = model.max_tokens.unwrap_or(4096) as usize;
    let mut prompt = Vec::with_capacity(history.len() + 1);
    if let Some(system) = agent.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        prompt.push(json!({"role": "system", "content": system}));
    }
    let system_cost: usize = prompt.iter().map(context_window::estimate_tokens).sum();
    let budget = model
        .context_tokens
        .saturating_sub(reserve + system_cost)
        .max(1024);
    prompt.extend(context_window::fit(history, budget));
    let request = ModelRequest {
        model,
        messages: prompt,
        tools: tools::definitions(agent),
    };
    let events = &ctx.shared.settings.events;
    let policy = DeltaPolicy {
        flush_after: std::time::Duration::from_millis(events.delta_flush_ms),
        flush_bytes: events.delta_flush_bytes,
    };
    let model_started = Instant::now();
    let response = model_call::call(
        &ctx.shared.http,
        &ctx.shared.settings.worker,
        &request,
        &ctx.emitter,
        &policy,
    )
    .await;
    ctx.timing.add_model(model_started.elapsed());
    let mut response = response?;
    unique_call_ids(&mut response, taken);
    persist(ctx, iteration, &response).await?;
    let calls: Vec<Value> = response
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
        .collect();
    ctx.emitter
        .emit(
            EventType::MessageCompleted,
            json!({
                "iteration": iteration,
                "content": response.content,
                "tool_calls": calls,
                "finish_reason": response.finish_reason,
                "usage": {"prompt_tokens": response.usage.prompt_tokens,
                          "completion_tokens": response.usage.completion_tokens},
            }),
        )
        .await?;
    metrics::histogram!("agentfleet_iteration_duration_seconds")
        .record(turn_started.elapsed().as_secs_f64());
    Ok(!response.tool_calls.is_empty())
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

/// The assistant message, its tool calls, the iteration counter and usage: one statement.
async fn persist(ctx: &RunCtx, iteration: i32, response: &ModelResponse) -> Result<(), RunError> {
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
    let agent = &ctx.run.agent.0;
    let parsed: Vec<Option<Value>> = response
        .tool_calls
        .iter()
        .map(|c| {
            let mut parsed = serde_json::from_str::<Value>(&c.arguments).ok()?;
            agentfleet_shared::sanitize::strip_nul_value(&mut parsed);
            Some(parsed)
        })
        .collect();
    let calls: Vec<NewToolCall> = response
        .tool_calls
        .iter()
        .zip(&parsed)
        .enumerate()
        .map(|(position, (call, parsed))| NewToolCall {
            tool_call_id: &call.id,
            position: position as i32,
            name: &call.name,
            raw_arguments: &call.arguments,
            arguments: parsed.as_ref(),
            risk: agent.tool(&call.name).map(|t| t.risk).unwrap_or(Risk::Low),
        })
        .collect();
    turns::record(
        &ctx.shared.pool,
        ctx.fence,
        &Turn {
            thread_id: ctx.run.thread_id,
            iteration,
            message: &body,
            tool_calls: &calls,
            prompt_tokens: response.usage.prompt_tokens,
            completion_tokens: response.usage.completion_tokens,
            last_event_id: ctx.emitter.last_id(),
        },
    )
    .await?;
    Ok(())
}

/// Statistics only: a failure here never affects the run.
pub async fn record_timing(
    ctx: &RunCtx,
    iteration: i32,
    started: DateTime<Utc>,
    (model_us, tools_us): (i64, i64),
) {
    let finished = Utc::now();
    let total_us = (finished - started)
        .num_microseconds()
        .unwrap_or(0)
        .max(model_us + tools_us);
    let framework = (total_us - model_us - tools_us).max(0) as f64 / 1e6;
    metrics::histogram!("agentfleet_framework_time_seconds").record(framework);
    let timing = turns::IterationTiming {
        run_id: ctx.run.id,
        iteration,
        attempt: ctx.fence.attempt,
        started,
        finished,
        model_us,
        tools_us,
        total_us,
    };
    let result = turns::record_timing(&ctx.shared.pool, &timing).await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "iteration timing not recorded");
    }
}
