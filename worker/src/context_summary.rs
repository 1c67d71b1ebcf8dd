//! Keeps every request within the model's context budget: `context_window` decides what to
//! compress; this module counts off the run's task, asks the model for summaries, records each
//! compaction in the thread (a `status` message, which `GET /v1/threads/{id}/messages` lists
//! and which carries the summary later runs reuse) and announces it (`context_compacted`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_shared::config::ModelSettings;
use agentfleet_shared::events::EventType;
use agentfleet_shared::sanitize::strip_nul_in;
use agentfleet_shared::store::messages;

use crate::bounded;
use crate::context_window::{Fit, Limits, Summary};
use crate::history::History;
use crate::model_call::Messages;
use crate::model_stream::truncate;
use crate::run_ctx::{RunCtx, RunError};
use crate::tokens::{self, Tokenizer};
use crate::tools::builtin;
use crate::usage::TurnUsage;

/// Largest summarising response read.
const MAX_SUMMARY_RESPONSE_BYTES: usize = 256 * 1024;

/// The request's messages: the system prompt (no message, or one), then the history fitted to
/// the budget; and what the summarising calls made for it used (billed with the iteration).
/// `tools` are the request's tool definitions; `expand_message`'s is reserved for whether or
/// not it is offered.
pub async fn prompt(
    ctx: &RunCtx,
    model: &ModelSettings,
    system: Arc<History>,
    tools: &[Value],
    history: Arc<History>,
    iteration: i32,
) -> Result<(Messages, TurnUsage), RunError> {
    let tokenizer = model.tokenizer;
    let reserve = model.max_tokens.unwrap_or(4096) as usize;
    let window = model.context_tokens.saturating_sub(reserve);
    let fixed_tools = || {
        let mut all = tools.to_vec();
        all.push(builtin::expand_definition());
        all
    };
    let mut state = std::mem::take(&mut *ctx.compaction.lock().expect("compaction lock"));

    // The common case, without tokenizing: everything fits by its byte count alone.
    let fixed_upper = *state.fixed_upper.get_or_insert_with(|| {
        system
            .first()
            .map_or(0, |s| tokens::message_upper_bound(tokenizer, s))
            + tokens::upper_bound_of_len(
                tokenizer,
                tokens::array_json_len(tools.iter().chain([&builtin::expand_definition()])),
            )
            + tokens::REPLY_PRIMING
    });
    if window > fixed_upper
        && state.fits_as_is(&history, &limits(ctx, tokenizer, window - fixed_upper))
    {
        *ctx.compaction.lock().expect("compaction lock") = state;
        return Ok((Messages { system, history }, TurnUsage::ZERO));
    }

    let (fixed, system) = {
        let fixed_tools = fixed_tools();
        tokio::task::spawn_blocking(move || {
            let fixed = system.first().map_or(0, |s| tokens::message(tokenizer, s))
                + tokens::tools(tokenizer, &fixed_tools)
                + tokens::REPLY_PRIMING;
            (fixed, system)
        })
        .await
        .map_err(panicked)?
    };
    // Room for at least a minimal history, whatever the system prompt and tools take.
    let limits = limits(ctx, tokenizer, window.saturating_sub(fixed).max(256));
    if !state.summary_loaded {
        state.summary = Box::pin(messages::latest_summary(&ctx.deps.pool, ctx.run.thread_id))
            .await?
            .map(|(covers, text)| Summary { covers, text });
        state.summary_loaded = true;
    }
    let settings = &ctx.deps.settings.context;
    let mut history = history;
    let mut rounds = 0u8;
    let mut summary_failed = false;
    let mut summarised = false;
    let mut used = TurnUsage::ZERO;
    let view = loop {
        let may_summarise = rounds < settings.max_summary_rounds && !summary_failed;
        let (s, h, fit) = tokio::task::spawn_blocking(move || {
            let mut state = state;
            let fit = state.fit(&history, &limits, may_summarise);
            (state, history, fit)
        })
        .await
        .map_err(panicked)?;
        (state, history) = (s, h);
        let (from, upto) = match fit {
            Fit::Ready(view) => break view,
            Fit::Summarise { from, upto } => (from, upto),
        };
        rounds += 1;
        let before = state.cost_of(&history, from, upto, &limits)
            + state
                .summary
                .as_ref()
                .map_or(0, |s| tokens::message(tokenizer, &s.message()));
        let part = state.part(&history, from, upto, limits.keep_head_bytes);
        match summarise(ctx, model, state.summary.as_ref(), &part, &limits).await {
            Ok((text, usage)) => {
                used = used.plus(usage.bounded());
                state.summarised(Summary { covers: upto, text }, upto - from, &limits, before);
                summarised = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "summarising the history failed; dropping the oldest turns instead");
                metrics::counter!("agentfleet_context_summary_failures_total").increment(1);
                summary_failed = true;
            }
        }
    };
    let steps = std::mem::take(&mut state.steps);
    let summary = state.summary.clone();
    *ctx.compaction.lock().expect("compaction lock") = state;
    if !steps.is_empty() {
        let steps: Vec<Value> = steps
            .iter()
            .map(|s| {
                metrics::counter!("agentfleet_context_compactions_total", "tier" => s.tier)
                    .increment(1);
                json!({"tier": s.tier, "messages": s.messages,
                       "tokens_before": s.tokens_before, "tokens_after": s.tokens_after})
            })
            .collect();
        let mut record = json!({
            "type": messages::COMPACTION,
            "iteration": iteration,
            "budget_tokens": limits.budget,
            "steps": steps,
        });
        if let Some(s) = summary.as_ref().filter(|_| summarised) {
            record["covers"] = json!(s.covers);
            record["summary"] = json!(s.text);
            record["usage"] = json!({"prompt_tokens": used.prompt_tokens,
                                     "completion_tokens": used.completion_tokens,
                                     "estimated": used.estimated});
        }
        ctx.outcomes_committed().await?;
        Box::pin(messages::insert_compaction(
            &ctx.deps.pool,
            ctx.fence,
            ctx.run.thread_id,
            &record,
        ))
        .await?;
        let mut event = record.clone();
        if let Some(obj) = event.as_object_mut() {
            obj.remove("type");
            obj.remove("summary");
        }
        ctx.emitter.emit(EventType::ContextCompacted, event).await?;
    }
    let history = Arc::new(History::for_one_request(view));
    Ok((Messages { system, history }, used))
}

fn limits(ctx: &RunCtx, tokenizer: Tokenizer, budget: usize) -> Limits {
    let c = &ctx.deps.settings.context;
    Limits {
        tokenizer,
        budget,
        keep_head_bytes: c.keep_head_bytes,
        target_percent: c.summary_target_percent,
        summary_tokens: c.summary_max_tokens as usize,
    }
}

#[derive(Debug, thiserror::Error)]
enum SummaryError {
    #[error("could not reach the model: {0}")]
    Connect(String),
    #[error("the model answered HTTP {0}")]
    Status(u16),
    #[error("no summary within {0:?}")]
    Timeout(Duration),
    #[error("the summary response was unusable: {0}")]
    Malformed(String),
}

/// Asks the model for a summary of `part`, continuing `previous`. One attempt, bounded in
/// time and size: a failure makes the caller drop the oldest turns instead (the run goes on).
/// Answers the summary and what the call used: the provider's figures, else an estimate.
async fn summarise(
    ctx: &RunCtx,
    model: &ModelSettings,
    previous: Option<&Summary>,
    part: &[Value],
    limits: &Limits,
) -> Result<(String, TurnUsage), SummaryError> {
    let settings = &ctx.deps.settings;
    let mut transcript = String::new();
    if let Some(p) = previous {
        transcript.push_str("Summary so far:\n");
        transcript.push_str(&p.text);
        transcript.push_str("\n\nThe conversation that follows it:\n");
    }
    for m in part {
        transcript.push_str(&render(m));
        transcript.push('\n');
    }
    // What one call can read: the budget less the summary's own room (a token is at least a
    // byte, so a cut to that many bytes always fits).
    let room = limits.budget.saturating_sub(limits.summary_tokens).max(256);
    let tokenizer = limits.tokenizer;
    let (transcript, transcript_tokens) = tokio::task::spawn_blocking(move || {
        let n = tokens::count(tokenizer, &transcript);
        if n > room {
            (truncate(&transcript, room), room)
        } else {
            (transcript, n)
        }
    })
    .await
    .map_err(|e| SummaryError::Malformed(e.to_string()))?;
    let body = json!({
        "model": model.model,
        "stream": false,
        "max_tokens": settings.context.summary_max_tokens,
        "messages": [
            {"role": "system", "content": settings.context.summary_prompt},
            {"role": "user", "content": transcript},
        ],
    });
    let url = model.chat_completions_text();
    let lease = ctx.deps.model_http.lease(model);
    let mut request = lease.client().post(url).json(&body);
    if !model.api_key.is_empty() {
        request = request.bearer_auth(&model.api_key);
    }
    let total = Duration::from_millis(settings.worker.model_total_timeout_ms);
    let answer = async {
        let response = request
            .send()
            .await
            .map_err(|e| SummaryError::Connect(e.to_string()))?;
        if !response.status().is_success() {
            return Err(SummaryError::Status(response.status().as_u16()));
        }
        let capped = bounded::read(response, MAX_SUMMARY_RESPONSE_BYTES)
            .await
            .map_err(|e| SummaryError::Connect(e.to_string()))?;
        if capped.truncated {
            return Err(SummaryError::Malformed("response too large".into()));
        }
        let value: Value = serde_json::from_slice(&capped.bytes)
            .map_err(|e| SummaryError::Malformed(e.to_string()))?;
        let text = value["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| SummaryError::Malformed("no message content".into()))?;
        Ok((text, TurnUsage::reported(&value)))
    };
    let (mut text, reported) = tokio::time::timeout(total, answer)
        .await
        .map_err(|_| SummaryError::Timeout(total))??;
    strip_nul_in(&mut text);
    let text = text.trim();
    if text.is_empty() {
        return Err(SummaryError::Malformed("an empty summary".into()));
    }
    let usage = match reported {
        Some(usage) => usage,
        // The estimate counts the summary as answered, before it is cut to size below.
        None => {
            let prompt = settings.context.summary_prompt.clone();
            let answer = text.to_owned();
            let (prompt, answer) = tokio::task::spawn_blocking(move || {
                (
                    tokens::count(tokenizer, &prompt),
                    tokens::count(tokenizer, &answer),
                )
            })
            .await
            .map_err(|e| SummaryError::Malformed(e.to_string()))?;
            TurnUsage {
                prompt_tokens: (transcript_tokens + prompt) as i64 + crate::usage::chat_overhead(2),
                completion_tokens: answer as i64,
                estimated: true,
            }
        }
    };
    // A model that ignores `max_tokens` does not get to fill the window with its summary.
    Ok((
        truncate(text, limits.summary_tokens.saturating_mul(4)),
        usage,
    ))
}

/// One message as a line of the transcript a summary is written from.
fn render(message: &Value) -> String {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("?");
    let content = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(other) if !other.is_null() => other.to_string(),
        _ => String::new(),
    };
    let mut line = format!("{role}: {content}");
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            line.push_str(&format!(
                "\n  (called {} with {})",
                c["function"]["name"].as_str().unwrap_or("?"),
                c["function"]["arguments"].as_str().unwrap_or("{}")
            ));
        }
    }
    line
}

/// A panic while counting (a tokenizer bug, say) is handled like a store failure: the run is
/// handed back a bounded number of times (`worker.max_handbacks`), then dead-lettered.
fn panicked(e: tokio::task::JoinError) -> RunError {
    tracing::error!(error = %e, "counting the history's tokens panicked");
    RunError::Store(agentfleet_shared::store::StoreError::Db(
        sqlx::Error::Protocol(format!("context compaction: {e}")),
    ))
}
