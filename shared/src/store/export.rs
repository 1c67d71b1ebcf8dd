//! A tenant's export (`GET /v1/export`, `api/src/routes/export.rs`): its threads, runs,
//! messages and tool calls, read page by page with keyset conditions (never `OFFSET`), each
//! page at most `export.page_size` rows, so an export of any size holds one page at a time.
//!
//! Threads are read through the tenant's runs (`runs_tenant_created`; no index holds
//! `threads.tenant_id`): a thread is listed at its first run. Then, for a page of threads, their
//! runs (`runs_thread_created`), the runs' tool calls (`tool_calls_unique_position`) and the
//! threads' messages (`messages_thread`). Every query names the tenant.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use super::messages::MessageRow;
use super::runs::RunRow;
use super::tool_calls::ToolCallRow;

/// Earlier than any row's creation (and within what Postgres holds, as `MIN_UTC` is not): the
/// first page's cursor.
const BEFORE_ANY_RUN: DateTime<Utc> = DateTime::<Utc>::UNIX_EPOCH;

/// A thread, and its first run's place in the tenant's runs (the threads' keyset).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ThreadRow {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub first_run_at: DateTime<Utc>,
    pub first_run_id: Uuid,
}

/// Where the threads' pages are: after this first run (`None`: from the start).
pub type ThreadCursor = Option<(DateTime<Utc>, Uuid)>;

/// The next `limit` threads of the tenant, in the order of their first runs, after `after`:
/// the tenant's runs read in order from the cursor (`runs_tenant_created`, backwards), each
/// probed for an earlier run of its thread (`runs_thread_created`), until `limit` first runs
/// are found; only then their threads. Joined inside the scan, a planner without statistics
/// (a new table) chose to join every thread with every run.
pub async fn threads(
    pool: &PgPool,
    tenant: Uuid,
    after: ThreadCursor,
    limit: i64,
) -> Result<Vec<ThreadRow>, StoreError> {
    let (at, id) = after.unwrap_or((BEFORE_ANY_RUN, Uuid::nil()));
    Ok(sqlx::query_as(
        "SELECT t.id, t.created_at, f.created_at AS first_run_at, f.id AS first_run_id
           FROM (SELECT r.thread_id, r.created_at, r.id FROM runs r
                  WHERE r.tenant_id = $1 AND (r.created_at, r.id) > ($2, $3)
                    AND NOT EXISTS (
                        SELECT 1 FROM runs p
                         WHERE p.thread_id = r.thread_id
                           AND (p.created_at, p.id) < (r.created_at, r.id))
                  ORDER BY r.created_at, r.id
                  LIMIT $4) f
           JOIN threads t ON t.id = f.thread_id AND t.tenant_id = $1
          ORDER BY f.created_at, f.id",
    )
    .bind(tenant)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Where a page of threads' runs are: after this run (thread, created, id).
pub type RunCursor = Option<(Uuid, DateTime<Utc>, Uuid)>;

/// A run with the user message it holds while it waits for its thread (`queued_input`: the
/// thread's messages have it only once it is promoted).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExportRun {
    #[sqlx(flatten)]
    pub run: RunRow,
    pub queued_input: Option<sqlx::types::Json<serde_json::Value>>,
}

/// The next `limit` runs of `threads` (the tenant's), by thread then creation.
pub async fn runs(
    pool: &PgPool,
    tenant: Uuid,
    threads: &[Uuid],
    after: RunCursor,
    limit: i64,
) -> Result<Vec<ExportRun>, StoreError> {
    let (thread, at, id) = after.unwrap_or((Uuid::nil(), BEFORE_ANY_RUN, Uuid::nil()));
    Ok(sqlx::query_as(
        "SELECT * FROM runs
          WHERE tenant_id = $1 AND thread_id = ANY($2)
            AND (thread_id, created_at, id) > ($3, $4, $5)
          ORDER BY thread_id, created_at, id
          LIMIT $6",
    )
    .bind(tenant)
    .bind(threads)
    .bind(thread)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Where a page of threads' tool calls are: after this call (run, iteration, position).
pub type ToolCallCursor = Option<(Uuid, i32, i32)>;

/// The next `limit` tool calls of the runs of `threads` (the tenant's), by run, iteration and
/// position.
pub async fn tool_calls(
    pool: &PgPool,
    tenant: Uuid,
    threads: &[Uuid],
    after: ToolCallCursor,
    limit: i64,
) -> Result<Vec<ToolCallRow>, StoreError> {
    let (run, iteration, position) = after.unwrap_or((Uuid::nil(), i32::MIN, i32::MIN));
    Ok(sqlx::query_as(
        "SELECT c.* FROM tool_calls c
          WHERE c.run_id IN (SELECT id FROM runs WHERE tenant_id = $1 AND thread_id = ANY($2))
            AND (c.run_id, c.iteration, c.position) > ($3, $4, $5)
          ORDER BY c.run_id, c.iteration, c.position
          LIMIT $6",
    )
    .bind(tenant)
    .bind(threads)
    .bind(run)
    .bind(iteration)
    .bind(position)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// A message with its thread (a page of messages spans threads).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ThreadMessage {
    pub thread_id: Uuid,
    #[sqlx(flatten)]
    pub message: MessageRow,
}

/// Where a page of threads' messages are: after this message (thread, id).
pub type MessageCursor = Option<(Uuid, i64)>;

/// The next `limit` messages of `threads` (the tenant's), by thread, oldest first.
pub async fn messages(
    pool: &PgPool,
    tenant: Uuid,
    threads: &[Uuid],
    after: MessageCursor,
    limit: i64,
) -> Result<Vec<ThreadMessage>, StoreError> {
    let (thread, id) = after.unwrap_or((Uuid::nil(), i64::MIN));
    Ok(sqlx::query_as(
        "SELECT m.thread_id, m.id, m.run_id, m.role, m.is_llm_message, m.body, m.created_at
           FROM messages m
          WHERE m.thread_id IN (SELECT id FROM threads WHERE id = ANY($2) AND tenant_id = $1)
            AND (m.thread_id, m.id) > ($3, $4)
          ORDER BY m.thread_id, m.id
          LIMIT $5",
    )
    .bind(tenant)
    .bind(threads)
    .bind(thread)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}
