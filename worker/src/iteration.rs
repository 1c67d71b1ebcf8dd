//! One model turn: load the history, fit it into the context budget, call the model, and
//! commit the assistant message with its tool calls (fenced) before announcing it.

use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use agentfleet_shared::domain::Risk;
use agentfleet_shared::events::EventType;
use agentfleet_shared::store::messages;
use agentfleet_shared::store::tool_calls::NewToolCall;
use agentfleet_shared::store::turns::{self, Turn};

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
    let response = response?;
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

/// The assistant message, its tool calls, the iteration counter and usage: one statement.
async fn persist(ctx: &RunCtx, iteration: i32, response: &ModelResponse) -> Result<(), RunError> {
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
        .map(|c| serde_json::from_str(&c.arguments).ok())
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
