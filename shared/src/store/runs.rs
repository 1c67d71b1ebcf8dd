//! Reading runs.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::StoreError;
use crate::domain::RunStatus;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub thread_id: Uuid,
    pub status: RunStatus,
    pub agent: crate::store::agents::Agent,
    pub metadata: Json<Value>,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<Vec<u8>>,
    pub iteration: i32,
    pub max_iterations: i32,
    pub attempt: i32,
    pub recoveries: i32,
    /// Hand-backs after failures so far (see `transitions::hand_back_after_failure`).
    pub handbacks: i32,
    /// Queued but not dispatched: waiting for a slot of its tenant's running limit.
    pub held: bool,
    /// Counts against its tenant's running limit (see `store::fair_dispatch`).
    pub fair: bool,
    pub interrupted: bool,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub pending: Option<Json<Value>>,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// The part of prompt + completion the worker estimated (no usage from the provider).
    pub estimated_tokens: i64,
    /// Tool calls the model made in this run's turns.
    pub tool_calls: i32,
    pub error: Option<Json<Value>>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// For a cancelled run: the status it was cancelled from (migration 0024; `None` for runs
    /// cancelled before it). Absent from statements that list their columns.
    #[sqlx(default)]
    pub cancelled_from: Option<RunStatus>,
    /// `if_busy = interrupt` asked for the run to end at its next safe point.
    pub interrupt_requested_at: Option<DateTime<Utc>>,
    pub last_event_id: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// W3C `traceparent` of the request that created the run (trace export on), which every
    /// attempt's span joins. Absent from statements that list their columns.
    #[sqlx(default)]
    pub traceparent: Option<String>,
    /// When the run first ran alone in quarantine (taken over more than
    /// `worker.max_recoveries` times); `None` if never. Absent from statements that list
    /// their columns.
    #[sqlx(default)]
    pub quarantined_at: Option<DateTime<Utc>>,
    /// The attempt that holds (or last held) the run alone in quarantine.
    #[sqlx(default)]
    pub quarantine_attempt: Option<i32>,
    /// A plan's task: the planner run that created it (migration 0034).
    #[sqlx(default)]
    pub parent_run_id: Option<Uuid>,
    /// A task: its round. A planner: the rounds created so far.
    #[sqlx(default)]
    pub plan_round: i32,
    /// A task: its place in its round.
    #[sqlx(default)]
    pub task_index: Option<i32>,
    #[sqlx(default)]
    pub task_title: Option<String>,
    /// A planner: prompt + completion tokens of its ended tasks.
    #[sqlx(default)]
    pub task_tokens: i64,
}

pub async fn get(pool: &PgPool, id: Uuid) -> Result<RunRow, StoreError> {
    sqlx::query_as::<_, RunRow>("SELECT * FROM runs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(StoreError::NotFound)
}

/// A run as its tenant may see it; another tenant's run is simply not found.
pub async fn get_for_tenant(pool: &PgPool, tenant: Uuid, id: Uuid) -> Result<RunRow, StoreError> {
    sqlx::query_as::<_, RunRow>("SELECT * FROM runs WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant)
        .fetch_optional(pool)
        .await?
        .ok_or(StoreError::NotFound)
}

pub async fn by_idempotency_key(
    pool: &PgPool,
    tenant: Uuid,
    key: &str,
) -> Result<Option<RunRow>, StoreError> {
    Ok(sqlx::query_as::<_, RunRow>(
        "SELECT * FROM runs WHERE tenant_id = $1 AND idempotency_key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_optional(pool)
    .await?)
}

/// A thread's runs from `from` on (`from` itself included), oldest first, at most `limit`:
/// what a thread stream follows next. From the thread's first run when `from` is `None` or
/// not a run of this thread. One page from where the stream is, through `runs_thread_created`,
/// however long the thread.
pub async fn thread_runs_from(
    pool: &PgPool,
    tenant: Uuid,
    thread: Uuid,
    from: Option<Uuid>,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT r.id FROM runs r
         LEFT JOIN runs f ON f.id = $3 AND f.thread_id = $2
         WHERE r.tenant_id = $1 AND r.thread_id = $2
           AND (f.id IS NULL OR (r.created_at, r.id) >= (f.created_at, f.id))
         ORDER BY r.created_at, r.id
         LIMIT $4",
    )
    .bind(tenant)
    .bind(thread)
    .bind(from)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

pub struct ListFilter {
    pub tenant: Uuid,
    pub status: Option<RunStatus>,
    pub thread_id: Option<Uuid>,
    pub batch_id: Option<Uuid>,
    /// Keyset cursor: runs strictly older than this (created_at, id).
    pub before: Option<(DateTime<Utc>, Uuid)>,
    pub limit: i64,
}

/// Newest first, keyset-paginated.
pub async fn list(pool: &PgPool, f: &ListFilter) -> Result<Vec<RunRow>, StoreError> {
    let (before_at, before_id) = match f.before {
        Some((at, id)) => (Some(at), Some(id)),
        None => (None, None),
    };
    Ok(sqlx::query_as::<_, RunRow>(
        "SELECT * FROM runs
         WHERE tenant_id = $1
           AND ($2::text IS NULL OR status = $2)
           AND ($3::uuid IS NULL OR thread_id = $3)
           AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5))
           AND ($7::uuid IS NULL OR batch_id = $7)
         ORDER BY created_at DESC, id DESC
         LIMIT $6",
    )
    .bind(f.tenant)
    .bind(f.status.map(|s| s.as_str()))
    .bind(f.thread_id)
    .bind(before_at)
    .bind(before_id)
    .bind(f.limit)
    .bind(f.batch_id)
    .fetch_all(pool)
    .await?)
}

/// Runs per status among the tenant's newest `window` runs that match the thread and batch
/// filters (newest by `created_at`, through `runs_tenant_created`), so the cost is bounded by
/// the window, never by the tenant's history. `matched` is how many runs were counted: equal
/// to `window` means older runs exist that were not.
pub async fn count_by_status(
    pool: &PgPool,
    tenant: Uuid,
    thread_id: Option<Uuid>,
    batch_id: Option<Uuid>,
    window: i64,
) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT status, count(*) FROM (
             SELECT status FROM runs
             WHERE tenant_id = $1
               AND ($2::uuid IS NULL OR thread_id = $2)
               AND ($3::uuid IS NULL OR batch_id = $3)
             ORDER BY created_at DESC, id DESC
             LIMIT $4
         ) newest GROUP BY status",
    )
    .bind(tenant)
    .bind(thread_id)
    .bind(batch_id)
    .bind(window)
    .fetch_all(pool)
    .await?)
}

pub async fn thread_belongs_to(
    pool: &PgPool,
    tenant: Uuid,
    thread: Uuid,
) -> Result<bool, StoreError> {
    let row: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM threads WHERE id = $1 AND tenant_id = $2")
            .bind(thread)
            .bind(tenant)
            .fetch_optional(pool)
            .await?;
    Ok(row.is_some())
}

/// Runs whose holder is presumed dead (expired lease), and queued runs untouched for
/// `requeue_after` (their message was probably lost). Queued ones are touched so the next sweep
/// leaves them alone for another period.
/// Advisory lock key of the sweeper election (advisory locks are per database).
const SWEEPER_LOCK: i64 = 0x6167_656e_7466_6c74; // "agentflt"

/// The stale runs, if this caller wins the sweeper election: of all workers, the one that
/// takes a transaction-scoped advisory lock reads them; the lock ends with the read, so a
/// stopped or partitioned worker never blocks sweeping. `None`: another worker sweeps now.
pub async fn stale_if_elected(
    pool: &PgPool,
    requeue_after: std::time::Duration,
    limit: i64,
) -> Result<Option<Vec<Uuid>>, StoreError> {
    let mut tx = pool.begin().await?;
    let (elected,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1)")
        .bind(SWEEPER_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    let ids = if elected {
        Some(stale(&mut tx, requeue_after, limit).await?)
    } else {
        None
    };
    tx.commit().await?;
    Ok(ids)
}

/// Queued runs published `requeue_after` ago or earlier (their message may be lost; each is touched so it is
/// not picked again at once) and running runs whose lease expired.
pub async fn stale(
    conn: &mut sqlx::PgConnection,
    requeue_after: std::time::Duration,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let mut ids: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE runs SET enqueued_at = now()
         WHERE id IN (SELECT id FROM runs WHERE status = 'queued' AND NOT held
                        AND enqueued_at < now() - make_interval(secs => $1)
                      ORDER BY enqueued_at LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING id",
    )
    .bind(requeue_after.as_secs_f64())
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let expired: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM runs WHERE status = 'running' AND lease_expires_at < now()
         ORDER BY lease_expires_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    ids.extend(expired);
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

/// Records that events up to `id` were handed out for the run (never lowers the figure):
/// after Redis loses the list, ids continue past it (`events::Floor::Recorded`).
pub async fn record_last_event_id(pool: &PgPool, run: Uuid, id: u64) -> Result<(), StoreError> {
    sqlx::query("UPDATE runs SET last_event_id = GREATEST(last_event_id, $2) WHERE id = $1")
        .bind(run)
        .bind(id as i64)
        .execute(pool)
        .await?;
    Ok(())
}
