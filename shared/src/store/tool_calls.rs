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

/// A call as the turn that made it records it: `pending`, or already `running` (dispatch
/// count 1) when the worker dispatches it right after the commit.
pub struct NewToolCall<'a> {
    pub id: Uuid,
    pub tool_call_id: &'a str,
    pub position: i32,
    pub name: &'a str,
    pub raw_arguments: &'a str,
    pub arguments: Option<&'a Value>,
    pub risk: Risk,
    pub status: ToolCallStatus,
    pub dispatch_count: i32,
}

impl NewToolCall<'_> {
    /// The call as a row of the turn's statement (`turns::record_many`).
    pub fn row(&self) -> Value {
        let mut row = serde_json::json!({
            "id": self.id, "tool_call_id": self.tool_call_id, "position": self.position,
            "name": self.name, "raw_arguments": self.raw_arguments, "risk": self.risk,
            "status": self.status, "dispatch_count": self.dispatch_count,
        });
        if let Some(args) = self.arguments {
            row["arguments"] = args.clone();
        }
        row
    }
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

/// A call's outcome and the tool message the model will see. Owned: it may wait to be
/// written with other calls' outcomes (see [`super::group_commit`]).
pub struct Outcome {
    pub fence: Fence,
    pub thread_id: Uuid,
    pub iteration: i32,
    pub tool_call_id: String,
    pub status: ToolCallStatus,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// The tool message's body (`messages::tool_result_body`).
    pub message: Value,
}

/// Records the outcomes of calls of several runs, each with its tool message, in one
/// statement (fenced per run: the held runs' rows are locked first, and the writes join
/// them); per outcome, whether its run's fence held.
pub async fn finish_many<'e>(
    db: impl sqlx::PgExecutor<'e>,
    outcomes: &[Outcome],
) -> Result<Vec<bool>, StoreError> {
    let held: Vec<(Uuid,)> = sqlx::query_as(
        "WITH input AS (
            SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::uuid[], $4::int[], $5::text[],
                                 $6::text[], $7::jsonb[], $8::text[], $9::jsonb[])
                AS t(run_id, attempt, thread_id, iteration, tool_call_id, status, result,
                     error, message)),
         held AS (
            SELECT r.id FROM runs r
            WHERE r.id = ANY($1) AND (r.id, r.attempt) IN (SELECT run_id, attempt FROM input)
              AND r.status = $10
            FOR UPDATE),
         call AS (
            UPDATE tool_calls c SET status = t.status, result = t.result, error = t.error,
                                    finished_at = now()
            FROM input t JOIN held ON held.id = t.run_id
            WHERE c.run_id = t.run_id AND c.tool_call_id = t.tool_call_id),
         message AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, iteration)
            SELECT t.thread_id, t.run_id, 'tool', true, t.message, t.iteration
            FROM input t JOIN held ON held.id = t.run_id)
         SELECT id FROM held",
    )
    .bind(outcomes.iter().map(|o| o.fence.run_id).collect::<Vec<_>>())
    .bind(outcomes.iter().map(|o| o.fence.attempt).collect::<Vec<_>>())
    .bind(outcomes.iter().map(|o| o.thread_id).collect::<Vec<_>>())
    .bind(outcomes.iter().map(|o| o.iteration).collect::<Vec<_>>())
    .bind(
        outcomes
            .iter()
            .map(|o| o.tool_call_id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        outcomes
            .iter()
            .map(|o| o.status.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        outcomes
            .iter()
            .map(|o| o.result.as_ref().map(Json))
            .collect::<Vec<_>>(),
    )
    .bind(
        outcomes
            .iter()
            .map(|o| o.error.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(
        outcomes
            .iter()
            .map(|o| Json(&o.message))
            .collect::<Vec<_>>(),
    )
    .bind(super::RUNNING)
    .fetch_all(db)
    .await?;
    Ok(super::held_flags(
        outcomes.iter().map(|o| o.fence.run_id),
        &held,
    ))
}

/// As [`finish_many`] for one call, inside a transaction the caller holds (and has fenced or locked).
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
