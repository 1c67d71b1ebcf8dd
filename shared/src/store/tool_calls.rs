//! Tool-call rows: recorded before dispatch and after completion, so a finished call is never
//! dispatched again and an interrupted one is dispatched again with the same idempotency key.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Fence, StoreError};
use crate::domain::{Risk, ToolCallStatus};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ToolCallRow {
    pub id: Uuid,
    pub run_id: Uuid,
    pub tool_call_id: String,
    pub iteration: i32,
    pub position: i32,
    pub name: String,
    pub raw_arguments: String,
    pub arguments: Option<Json<Value>>,
    pub risk: Risk,
    pub status: ToolCallStatus,
    pub result: Option<Json<Value>>,
    pub error: Option<String>,
    pub dispatch_count: i32,
    pub decided_by: Option<Uuid>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decision_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

pub struct NewToolCall<'a> {
    pub tool_call_id: &'a str,
    pub position: i32,
    pub name: &'a str,
    pub raw_arguments: &'a str,
    pub arguments: Option<&'a Value>,
    pub risk: Risk,
}

pub async fn insert(
    conn: &mut PgConnection,
    run: Uuid,
    iteration: i32,
    call: &NewToolCall<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name,
                                 raw_arguments, arguments, risk, status)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending')",
    )
    .bind(Uuid::now_v7())
    .bind(run)
    .bind(call.tool_call_id)
    .bind(iteration)
    .bind(call.position)
    .bind(call.name)
    .bind(call.raw_arguments)
    .bind(call.arguments.map(Json))
    .bind(call.risk)
    .execute(conn)
    .await?;
    Ok(())
}

/// The calls of one iteration, in the order the model made them.
pub async fn of_iteration(
    pool: &PgPool,
    run: Uuid,
    iteration: i32,
) -> Result<Vec<ToolCallRow>, StoreError> {
    Ok(sqlx::query_as::<_, ToolCallRow>(
        "SELECT * FROM tool_calls WHERE run_id = $1 AND iteration = $2 ORDER BY position",
    )
    .bind(run)
    .bind(iteration)
    .fetch_all(pool)
    .await?)
}

pub async fn of_run(pool: &PgPool, run: Uuid) -> Result<Vec<ToolCallRow>, StoreError> {
    Ok(sqlx::query_as::<_, ToolCallRow>(
        "SELECT * FROM tool_calls WHERE run_id = $1 ORDER BY iteration, position",
    )
    .bind(run)
    .fetch_all(pool)
    .await?)
}

/// Sets the status of calls (fenced), e.g. to `awaiting_confirmation`.
pub async fn set_status(
    conn: &mut PgConnection,
    run: Uuid,
    tool_call_ids: &[String],
    status: ToolCallStatus,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE tool_calls SET status = $3 WHERE run_id = $1 AND tool_call_id = ANY($2)")
        .bind(run)
        .bind(tool_call_ids)
        .bind(status.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Records the dispatch before the call leaves the worker. One fenced statement (the run row
/// is locked `FOR UPDATE` first, as in a transaction): a stale holder records nothing.
pub async fn mark_dispatched(
    pool: &PgPool,
    fence: Fence,
    tool_call_id: &str,
) -> Result<i32, StoreError> {
    let count: Option<(i32,)> = sqlx::query_as(concat!(
        "WITH ",
        fence_cte!(),
        "
         UPDATE tool_calls SET status = 'running', dispatch_count = dispatch_count + 1,
                               started_at = coalesce(started_at, now())
         WHERE run_id = (SELECT id FROM fence) AND tool_call_id = $3
         RETURNING dispatch_count",
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(tool_call_id)
    .fetch_optional(pool)
    .await?;
    count.map(|(c,)| c).ok_or(fence.lost())
}

/// Records a call's outcome and the tool message the model will see, atomically (fenced), in
/// one statement.
#[allow(clippy::too_many_arguments)]
pub async fn finish(
    pool: &PgPool,
    fence: Fence,
    thread: Uuid,
    iteration: i32,
    tool_call_id: &str,
    status: ToolCallStatus,
    result: Option<&Value>,
    error: Option<&str>,
    model_content: &str,
) -> Result<(), StoreError> {
    let (held,): (i64,) = sqlx::query_as(concat!(
        "WITH ",
        fence_cte!(),
        ",
         call AS (
            UPDATE tool_calls SET status = $4, result = $5, error = $6, finished_at = now()
            WHERE run_id = (SELECT id FROM fence) AND tool_call_id = $3),
         message AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, iteration)
            SELECT $7, id, 'tool', true, $8, $9 FROM fence)
         SELECT count(*) FROM fence",
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(tool_call_id)
    .bind(status.as_str())
    .bind(result.map(Json))
    .bind(error)
    .bind(thread)
    .bind(Json(super::messages::tool_result_body(
        tool_call_id,
        model_content,
    )))
    .bind(iteration)
    .fetch_one(pool)
    .await?;
    if held == 0 {
        return Err(fence.lost());
    }
    Ok(())
}

/// As [`finish`], inside a transaction the caller holds (and has fenced or locked).
#[allow(clippy::too_many_arguments)]
pub async fn finish_in(
    conn: &mut PgConnection,
    run: Uuid,
    thread: Uuid,
    iteration: i32,
    tool_call_id: &str,
    status: ToolCallStatus,
    result: Option<&Value>,
    error: Option<&str>,
    model_content: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE tool_calls SET status = $3, result = $4, error = $5, finished_at = now()
         WHERE run_id = $1 AND tool_call_id = $2",
    )
    .bind(run)
    .bind(tool_call_id)
    .bind(status.as_str())
    .bind(result.map(Json))
    .bind(error)
    .execute(&mut *conn)
    .await?;
    super::messages::insert(
        conn,
        thread,
        run,
        "tool",
        true,
        &super::messages::tool_result_body(tool_call_id, model_content),
        Some(iteration),
    )
    .await?;
    Ok(())
}
