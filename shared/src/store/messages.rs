//! Thread messages. LLM-visible messages are stored as OpenAI chat message objects.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::StoreError;

/// The stored body of a user message: the OpenAI chat message object.
pub fn user_body(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub async fn insert_user(
    conn: &mut PgConnection,
    thread: Uuid,
    run: Uuid,
    text: &str,
) -> Result<i64, StoreError> {
    insert(conn, thread, run, "user", true, &user_body(text), None).await
}

pub async fn insert(
    conn: &mut PgConnection,
    thread: Uuid,
    run: Uuid,
    role: &str,
    is_llm: bool,
    body: &Value,
    iteration: Option<i32>,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, iteration)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(thread)
    .bind(run)
    .bind(role)
    .bind(is_llm)
    .bind(Json(body))
    .bind(iteration)
    .fetch_one(conn)
    .await?;
    Ok(id)
}

/// The tool result message the model sees for `tool_call_id`.
pub fn tool_result_body(tool_call_id: &str, content: &str) -> Value {
    json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
}

/// The history the model sees, in order.
pub async fn llm_history(pool: &PgPool, thread: Uuid) -> Result<Vec<Value>, StoreError> {
    let rows: Vec<(Json<Value>,)> = sqlx::query_as(
        "SELECT body FROM messages WHERE thread_id = $1 AND is_llm_message ORDER BY id",
    )
    .bind(thread)
    .fetch_all(pool)
    .await?;
    Ok(repair_tool_results(
        rows.into_iter().map(|(b,)| b.0).collect(),
    ))
}

/// The `type` of the status messages that record a compaction of the history sent to the
/// model (`GET /v1/threads/{id}/messages` lists them).
pub const COMPACTION: &str = "context_compacted";

/// The thread's newest summary: its text and how many messages of the thread's history (as
/// [`llm_history`] returns it) it covers, from the first.
pub async fn latest_summary(
    pool: &PgPool,
    thread: Uuid,
) -> Result<Option<(usize, String)>, StoreError> {
    let row: Option<(i64, String)> = sqlx::query_as(
        "SELECT (body->>'covers')::bigint, body->>'summary' FROM messages
         WHERE thread_id = $1 AND role = 'status' AND body->>'type' = $2
           AND body ? 'summary'
         ORDER BY id DESC LIMIT 1",
    )
    .bind(thread)
    .bind(COMPACTION)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(covers, text)| (covers.max(0) as usize, text)))
}

/// Records a compaction as a status message of the thread, fenced: a stale holder records
/// nothing and gets `LeaseLost`.
pub async fn insert_compaction(
    pool: &PgPool,
    fence: super::Fence,
    thread: Uuid,
    body: &Value,
) -> Result<(), StoreError> {
    let inserted = sqlx::query(concat!(
        "WITH ",
        fence_cte!(),
        "
         INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
         SELECT $3, id, 'status', false, $4 FROM fence",
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(thread)
    .bind(Json(body))
    .execute(pool)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(fence.lost());
    }
    Ok(())
}

/// A history a provider accepts: every assistant message with `tool_calls` is followed by one
/// tool result per call, and every tool result answers a call of the assistant message before
/// it. Threads written before runs closed their calls on cancel or failure (or by a worker
/// that died at the wrong moment) lack results: they are supplied here, saying the call never
/// ran; stray results are dropped.
pub fn repair_tool_results(history: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(history.len());
    // Ids of the last assistant message's calls that have no result yet, in order.
    let mut open: Vec<String> = Vec::new();
    let close = |open: &mut Vec<String>, out: &mut Vec<Value>| {
        for id in open.drain(..) {
            let content = json!({"error": "this call never ran: its run ended first"}).to_string();
            out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
        }
    };
    for message in history {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        if role == "tool" {
            let id = message.get("tool_call_id").and_then(Value::as_str);
            // A result that answers no open call is dropped: the provider would refuse it.
            if let Some(i) = id.and_then(|id| open.iter().position(|o| o == id)) {
                open.remove(i);
                out.push(message);
            }
            continue;
        }
        close(&mut open, &mut out);
        if role == "assistant" {
            open = message
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect();
        }
        out.push(message);
    }
    close(&mut open, &mut out);
    out
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MessageRow {
    pub id: i64,
    pub run_id: Option<Uuid>,
    pub role: String,
    pub is_llm_message: bool,
    pub body: Json<Value>,
    pub created_at: DateTime<Utc>,
}

/// Messages of a thread after message `after`, oldest first.
pub async fn list(
    pool: &PgPool,
    thread: Uuid,
    after: i64,
    limit: i64,
) -> Result<Vec<MessageRow>, StoreError> {
    Ok(sqlx::query_as::<_, MessageRow>(
        "SELECT id, run_id, role, is_llm_message, body, created_at FROM messages
         WHERE thread_id = $1 AND id > $2 ORDER BY id LIMIT $3",
    )
    .bind(thread)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Every message a run wrote, oldest first, as `(id, role, body)`: what a coarse
/// `stream_rebuilt` event carries.
pub async fn of_run(pool: &PgPool, run: Uuid) -> Result<Vec<(i64, String, Value)>, StoreError> {
    let rows: Vec<(i64, String, Json<Value>)> =
        sqlx::query_as("SELECT id, role, body FROM messages WHERE run_id = $1 ORDER BY id")
            .bind(run)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(id, role, body)| (id, role, body.0))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assistant(ids: &[&str]) -> Value {
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}))
            .collect();
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    }

    fn tool(id: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": "ok"})
    }

    fn shape(history: &[Value]) -> Vec<String> {
        history
            .iter()
            .map(|m| match m["role"].as_str().unwrap() {
                "tool" => format!("tool:{}", m["tool_call_id"].as_str().unwrap()),
                r => r.to_owned(),
            })
            .collect()
    }

    #[test]
    fn missing_results_are_supplied_and_stray_ones_dropped() {
        let history = vec![
            user_body("hi"),
            assistant(&["a", "b"]),
            tool("b"),
            user_body("again"),
            tool("zombie"),
            assistant(&["c"]),
        ];
        let repaired = repair_tool_results(history);
        assert_eq!(
            shape(&repaired),
            [
                "user",
                "assistant",
                "tool:b",
                "tool:a",
                "user",
                "assistant",
                "tool:c"
            ]
        );
        assert!(
            repaired[3]["content"]
                .as_str()
                .unwrap()
                .contains("never ran")
        );
    }

    #[test]
    fn a_valid_history_is_unchanged() {
        let history = vec![
            user_body("hi"),
            assistant(&["a"]),
            tool("a"),
            json!({"role": "assistant", "content": "done"}),
        ];
        assert_eq!(repair_tool_results(history.clone()), history);
    }
}
