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
    Ok(rows.into_iter().map(|(b,)| b.0).collect())
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
