//! Committing a model turn: the assistant message, its tool calls, the iteration counter and
//! the usage, fenced by the holder's attempt, in one statement.
//!
//! One statement instead of a transaction of six round trips (BEGIN, fence lock, message,
//! one INSERT per call, counters, COMMIT): it is the hottest write of the loop. The fence row
//! is locked first (`FOR UPDATE`); every other part selects from it, so a stale holder writes
//! nothing at all.

use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::tool_calls::NewToolCall;
use super::{Fence, StoreError};

pub struct Turn<'a> {
    pub thread_id: Uuid,
    pub iteration: i32,
    /// The assistant message as the OpenAI chat message object.
    pub message: &'a Value,
    pub tool_calls: &'a [NewToolCall<'a>],
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// The last event id the holder has appended: recorded so that ids continue past it if
    /// Redis loses the run's list and the holder dies.
    pub last_event_id: u64,
}

pub async fn record(pool: &PgPool, fence: Fence, turn: &Turn<'_>) -> Result<(), StoreError> {
    let calls: Vec<Value> = turn
        .tool_calls
        .iter()
        .map(|c| {
            let mut row = json!({
                "id": Uuid::now_v7(), "tool_call_id": c.tool_call_id, "position": c.position,
                "name": c.name, "raw_arguments": c.raw_arguments, "risk": c.risk,
            });
            if let Some(args) = c.arguments {
                row["arguments"] = args.clone();
            }
            row
        })
        .collect();
    let (held,): (i64,) = sqlx::query_as(concat!(
        "WITH ",
        fence_cte!(),
        ",
         message AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, iteration)
            SELECT $3, id, 'assistant', true, $4, $5 FROM fence),
         calls AS (
            INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name,
                                    raw_arguments, arguments, risk, status)
            SELECT c.id, fence.id, c.tool_call_id, $5, c.position, c.name, c.raw_arguments,
                   c.arguments, c.risk, 'pending'
            FROM fence, jsonb_to_recordset($6) AS c(id uuid, tool_call_id text, position int,
                 name text, raw_arguments text, arguments jsonb, risk text)),
         counters AS (
            UPDATE runs SET iteration = $5, prompt_tokens = prompt_tokens + $7,
                            completion_tokens = completion_tokens + $8, updated_at = now(),
                            last_event_id = GREATEST(last_event_id, $9),
                            handbacks = 0
            WHERE id IN (SELECT id FROM fence))
         SELECT count(*) FROM fence",
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(turn.thread_id)
    .bind(Json(turn.message))
    .bind(turn.iteration)
    .bind(Json(&calls))
    .bind(turn.prompt_tokens)
    .bind(turn.completion_tokens)
    .bind(turn.last_event_id as i64)
    .fetch_one(pool)
    .await?;
    if held == 0 {
        return Err(fence.lost());
    }
    Ok(())
}

/// What one iteration cost, for the framework-time statistics (`iterations`).
pub struct IterationTiming {
    pub run_id: Uuid,
    pub iteration: i32,
    pub attempt: i32,
    pub started: chrono::DateTime<chrono::Utc>,
    pub finished: chrono::DateTime<chrono::Utc>,
    pub model_us: i64,
    pub tools_us: i64,
    pub total_us: i64,
}

/// Records an iteration's timing once (a redone iteration keeps its first record).
pub async fn record_timing(pool: &PgPool, t: &IterationTiming) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO iterations (run_id, iteration, attempt, started_at, finished_at, model_us, tools_us, total_us)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
    )
    .bind(t.run_id)
    .bind(t.iteration)
    .bind(t.attempt)
    .bind(t.started)
    .bind(t.finished)
    .bind(t.model_us)
    .bind(t.tools_us)
    .bind(t.total_us)
    .execute(pool)
    .await?;
    Ok(())
}
