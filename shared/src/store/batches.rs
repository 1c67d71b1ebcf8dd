//! Batches (migration `0008_batches.sql`): a batch row and one item per run request. The API
//! writes both in one statement when a batch is submitted, then creates the runs in chunks
//! (`api/src/batch_driver.rs`): each chunk locks the batch row (renewing the driver's lease),
//! takes the next items without a run, creates their runs and sets the items' `run_id`, all in
//! one transaction. So an item never gets two runs, and whatever a crash interrupts is exactly
//! the items still without one.
//!
//! Nothing here runs for a run outside a batch: the batch's counts, completion and
//! cancellation read `runs` through the partial indexes on `batch_id`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::StoreError;

/// The statuses of a run not yet ended, as the partial index `runs_batch_active` names them
/// (the planner matches the predicate by its text).
macro_rules! active {
    () => {
        "('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation', 'waiting_for_tasks')"
    };
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BatchRow {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub status: String,
    pub total: i32,
    pub metadata: Json<Value>,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<Vec<u8>>,
    pub fair: bool,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl BatchRow {
    /// Cancelled by its tenant: items still without a run will never get one.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.status.as_str(), "cancelling" | "cancelled")
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "cancelled")
    }
}

/// A batch to write.
#[derive(Debug)]
pub struct NewBatch {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// `creating` (its runs are made later, by whoever holds the lease) or `in_progress`
    /// (its runs are written in the same transaction: `POST /v1/runs/batch`).
    pub status: &'static str,
    pub metadata: Value,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<Vec<u8>>,
    pub fair: bool,
    /// The driver's lease, for a `creating` batch.
    pub lease: Option<(String, u64)>,
    /// W3C `traceparent` of the submitting request: the runs the driver makes later join it.
    pub traceparent: Option<String>,
}

/// One item to write: the run request (for a `creating` batch) or the run made for it.
#[derive(Debug)]
pub struct NewItem {
    pub custom_id: String,
    pub body: Option<Value>,
    pub run_id: Option<Uuid>,
}

/// The batch and its items, in one statement. `None` when the tenant already has a batch
/// with this idempotency key (nothing is written; look it up with [`by_idempotency_key`]).
pub async fn insert<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    batch: &NewBatch,
    items: &[NewItem],
) -> Result<Option<BatchRow>, StoreError> {
    insert_gated(executor, batch, items, None).await
}

/// [`insert`] for a tenant with `limits.max_active_runs`: the same statement first takes the
/// tenant's creation lock and counts its active runs (`lock_and_count_active`), and writes
/// nothing when the items would take it past `max` ([`StoreError::TooManyActiveRuns`]).
/// One statement, no transaction around it: a large body is not sent to Postgres while a
/// transaction sits idle (`database.idle_in_transaction_timeout_ms` would end it), and the
/// lock is held only while the statement runs.
pub async fn insert_within_limit<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    batch: &NewBatch,
    items: &[NewItem],
    max: u32,
) -> Result<Option<BatchRow>, StoreError> {
    insert_gated(executor, batch, items, Some(max)).await
}

async fn insert_gated<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    batch: &NewBatch,
    items: &[NewItem],
    max: Option<u32>,
) -> Result<Option<BatchRow>, StoreError> {
    use sqlx::{FromRow, Row};
    let custom_ids: Vec<&str> = items.iter().map(|i| i.custom_id.as_str()).collect();
    let bodies: Vec<Option<Json<&Value>>> =
        items.iter().map(|i| i.body.as_ref().map(Json)).collect();
    let run_ids: Vec<Option<Uuid>> = items.iter().map(|i| i.run_id).collect();
    let (owner, lease_ms) = match &batch.lease {
        Some((owner, ms)) => (Some(owner.as_str()), *ms as i64),
        None => (None, 0),
    };
    // The gate is evaluated first (the batch reads it); the items join the inserted batch
    // row: on an idempotency conflict or a refusal there is none, and no item is written.
    let row = sqlx::query(
        "WITH gate AS (
            SELECT COALESCE(sum(c.active), 0)::int8 AS active
            FROM lock_and_count_active(CASE WHEN $15::int8 IS NULL THEN '{}'::uuid[]
                                            ELSE ARRAY[$2::uuid] END) c),
         batch AS (
            INSERT INTO batches (id, tenant_id, status, total, metadata, idempotency_key,
                                 request_hash, fair, lease_owner, lease_expires_at, traceparent)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9,
                   CASE WHEN $9::text IS NULL THEN NULL
                        ELSE now() + make_interval(secs => $10::bigint / 1000.0) END, $14
            FROM gate WHERE $15::int8 IS NULL OR gate.active + $4 <= $15
            ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
            RETURNING *),
         item AS (
            INSERT INTO batch_items (batch_id, position, custom_id, body, run_id)
            SELECT batch.id, t.position - 1, t.custom_id, t.body, t.run_id
            FROM batch, UNNEST($11::text[], $12::jsonb[], $13::uuid[])
                 WITH ORDINALITY AS t(custom_id, body, run_id, position))
         SELECT gate.active AS gate_active, batch.* FROM gate LEFT JOIN batch ON true",
    )
    .bind(batch.id)
    .bind(batch.tenant_id)
    .bind(batch.status)
    .bind(items.len() as i32)
    .bind(Json(&batch.metadata))
    .bind(batch.idempotency_key.as_deref())
    .bind(batch.request_hash.as_deref())
    .bind(batch.fair)
    .bind(owner)
    .bind(lease_ms)
    .bind(&custom_ids)
    .bind(&bodies)
    .bind(&run_ids)
    .bind(batch.traceparent.as_deref())
    .bind(max.map(i64::from))
    .fetch_one(executor)
    .await?;
    if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
        return Ok(Some(BatchRow::from_row(&row)?));
    }
    if let Some(max) = max {
        let active: i64 = row.try_get("gate_active")?;
        super::active_runs::check(active, max, items.len())?;
    }
    Ok(None)
}

pub async fn by_idempotency_key(
    pool: &PgPool,
    tenant: Uuid,
    key: &str,
) -> Result<Option<BatchRow>, StoreError> {
    Ok(sqlx::query_as::<_, BatchRow>(
        "SELECT * FROM batches WHERE tenant_id = $1 AND idempotency_key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_optional(pool)
    .await?)
}

/// Which of `ids` are threads of `tenant`.
pub async fn owned_threads(
    pool: &PgPool,
    tenant: Uuid,
    ids: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    let rows: Vec<(Uuid,)> =
        sqlx::query_as("SELECT id FROM threads WHERE tenant_id = $1 AND id = ANY($2)")
            .bind(tenant)
            .bind(ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// The tenant's batch; `NotFound` for an unknown id or another tenant's batch.
pub async fn get_for_tenant(pool: &PgPool, tenant: Uuid, id: Uuid) -> Result<BatchRow, StoreError> {
    sqlx::query_as::<_, BatchRow>("SELECT * FROM batches WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant)
        .fetch_optional(pool)
        .await?
        .ok_or(StoreError::NotFound)
}

/// A page of the tenant's batches, newest first, before `(created_at, id)`.
pub async fn list_for_tenant(
    pool: &PgPool,
    tenant: Uuid,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<BatchRow>, StoreError> {
    let (at, id) = before.unzip();
    Ok(sqlx::query_as::<_, BatchRow>(
        "SELECT * FROM batches WHERE tenant_id = $1
           AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
         ORDER BY created_at DESC, id DESC LIMIT $4",
    )
    .bind(tenant)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// What a batch's items have come to, read in one snapshot.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Runs per status (`RunStatus::as_str`).
    pub runs: Vec<(String, i64)>,
    /// Items without a run yet (nor an error).
    pub pending: i64,
    /// Prompt + completion tokens of the batch's runs.
    pub total_tokens: i64,
}

impl Counts {
    pub fn created(&self) -> i64 {
        self.runs.iter().map(|(_, n)| n).sum()
    }

    pub fn of(&self, status: &str) -> i64 {
        self.runs
            .iter()
            .find(|(s, _)| s == status)
            .map_or(0, |(_, n)| *n)
    }

    /// Runs not yet ended (the statuses of `active!`).
    pub fn active(&self) -> i64 {
        [
            "queued",
            "running",
            "waiting_for_input",
            "waiting_for_confirmation",
            "waiting_for_tasks",
        ]
        .iter()
        .map(|s| self.of(s))
        .sum()
    }
}

/// `GROUP BY status` over the batch's runs (index `runs_batch`) and the items still to
/// create (index `batch_items_pending`), as one statement so both are of one moment.
pub async fn counts<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    id: Uuid,
) -> Result<Counts, StoreError> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT status, count(*), coalesce(sum(prompt_tokens + completion_tokens), 0)::bigint
           FROM runs WHERE batch_id = $1 GROUP BY status
         UNION ALL
         SELECT '', count(*), 0 FROM batch_items
          WHERE batch_id = $1 AND run_id IS NULL AND error IS NULL",
    )
    .bind(id)
    .fetch_all(executor)
    .await?;
    let mut counts = Counts::default();
    for (status, n, tokens) in rows {
        if status.is_empty() {
            counts.pending = n;
        } else {
            counts.total_tokens += tokens;
            counts.runs.push((status, n));
        }
    }
    counts.runs.sort();
    Ok(counts)
}

/// What the driver holding `owner`'s lease may do next.
#[derive(Debug, Clone)]
pub struct Held {
    pub status: String,
    pub tenant_id: Uuid,
    pub fair: bool,
    /// The tenant is suspended: nothing new of it may start, so no run is created for now.
    pub suspended: bool,
    /// The submitting request's trace context, stored with each run the driver makes.
    pub traceparent: Option<String>,
}

/// Locks the batch row until the transaction ends and renews `owner`'s lease by `lease_ms`;
/// `None` when `owner` no longer holds it (cancelled, finished, or taken over after its
/// lease expired). Holding the row lock is what serializes chunks and a cancel.
pub async fn renew(
    conn: &mut PgConnection,
    id: Uuid,
    owner: &str,
    lease_ms: u64,
) -> Result<Option<Held>, StoreError> {
    type Row = (String, Uuid, bool, bool, Option<String>);
    let row: Option<Row> = sqlx::query_as(
        "UPDATE batches b
            SET lease_expires_at = now() + make_interval(secs => $3::bigint / 1000.0)
           FROM tenants t
          WHERE b.id = $1 AND b.lease_owner = $2 AND t.id = b.tenant_id
          RETURNING b.status, b.tenant_id, b.fair, t.suspended_at IS NOT NULL, b.traceparent",
    )
    .bind(id)
    .bind(owner)
    .bind(lease_ms as i64)
    .fetch_optional(conn)
    .await?;
    Ok(
        row.map(|(status, tenant_id, fair, suspended, traceparent)| Held {
            status,
            tenant_id,
            fair,
            suspended,
            traceparent,
        }),
    )
}

/// An item still without a run.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingItem {
    pub position: i32,
    pub custom_id: String,
    pub body: Option<Json<Value>>,
}

/// The next `limit` items without a run, in order (call under [`renew`]'s lock).
pub async fn pending_items(
    conn: &mut PgConnection,
    id: Uuid,
    limit: i64,
) -> Result<Vec<PendingItem>, StoreError> {
    Ok(sqlx::query_as::<_, PendingItem>(
        "SELECT position, custom_id, body FROM batch_items
          WHERE batch_id = $1 AND run_id IS NULL AND error IS NULL
          ORDER BY position LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// Records what each item came to: its run, or the error that kept it from having one. The
/// request body is dropped (the run holds it now).
pub async fn set_outcomes(
    conn: &mut PgConnection,
    id: Uuid,
    positions: &[i32],
    run_ids: &[Option<Uuid>],
    errors: &[Option<Value>],
) -> Result<(), StoreError> {
    let errors: Vec<Option<Json<&Value>>> = errors.iter().map(|e| e.as_ref().map(Json)).collect();
    sqlx::query(
        "UPDATE batch_items i SET run_id = t.run_id, error = t.error, body = NULL
           FROM UNNEST($2::int4[], $3::uuid[], $4::jsonb[]) AS t(position, run_id, error)
          WHERE i.batch_id = $1 AND i.position = t.position",
    )
    .bind(id)
    .bind(positions)
    .bind(run_ids)
    .bind(&errors)
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks runs made one by one (on an existing thread, `transitions::create`) as the batch's.
pub async fn adopt_runs(
    conn: &mut PgConnection,
    id: Uuid,
    run_ids: &[Uuid],
) -> Result<(), StoreError> {
    sqlx::query("UPDATE runs SET batch_id = $1 WHERE id = ANY($2)")
        .bind(id)
        .bind(run_ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// Counts a failed chunk of batch `id` (still driven by `owner`): how many have failed in a
/// row now. `None`: the lease is no longer `owner`'s.
pub async fn chunk_failed(pool: &PgPool, id: Uuid, owner: &str) -> Result<Option<i32>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE batches SET chunk_failures = chunk_failures + 1
          WHERE id = $1 AND lease_owner = $2 AND status = 'creating'
          RETURNING chunk_failures",
    )
    .bind(id)
    .bind(owner)
    .fetch_optional(pool)
    .await?)
}

/// A chunk went through: the failures in a row start again from none.
pub async fn chunk_succeeded(conn: &mut PgConnection, id: Uuid) -> Result<(), StoreError> {
    sqlx::query("UPDATE batches SET chunk_failures = 0 WHERE id = $1 AND chunk_failures > 0")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Gives every item of batch `id` still without a run `error` instead (call under
/// [`renew`]'s lock); how many.
pub async fn fail_pending(
    conn: &mut PgConnection,
    id: Uuid,
    error: &Value,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE batch_items SET error = $2, body = NULL
          WHERE batch_id = $1 AND run_id IS NULL AND error IS NULL",
    )
    .bind(id)
    .bind(Json(error))
    .execute(conn)
    .await?
    .rows_affected())
}

/// Every item has its run (or its error): `creating -> in_progress`, the lease given up.
pub async fn mark_created(conn: &mut PgConnection, id: Uuid) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE batches SET status = 'in_progress', lease_owner = NULL, lease_expires_at = NULL
          WHERE id = $1 AND status = 'creating'",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Takes over up to `limit` batches that need a driver (runs to create, or runs to cancel)
/// and whose lease has expired (their driver died or stalled), for `owner`.
pub async fn take_over(
    pool: &PgPool,
    owner: &str,
    lease_ms: u64,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let rows: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE batches SET lease_owner = $1,
                lease_expires_at = now() + make_interval(secs => $2::bigint / 1000.0)
          WHERE id IN (SELECT id FROM batches
                        WHERE status IN ('creating', 'cancelling')
                          AND (lease_expires_at IS NULL OR lease_expires_at < now())
                        LIMIT $3 FOR UPDATE SKIP LOCKED)
          RETURNING id",
    )
    .bind(owner)
    .bind(lease_ms as i64)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// `creating | in_progress -> cancelling` with `owner` as the driver that cancels its runs.
/// Waits for a chunk in flight (the row lock), so no run is created after this commits.
/// `None` when the batch was not creating or in progress (already cancelled or finished).
pub async fn start_cancel(
    pool: &PgPool,
    tenant: Uuid,
    id: Uuid,
    owner: &str,
    lease_ms: u64,
) -> Result<Option<BatchRow>, StoreError> {
    Ok(sqlx::query_as::<_, BatchRow>(
        "UPDATE batches SET status = 'cancelling', lease_owner = $3,
                lease_expires_at = now() + make_interval(secs => $4::bigint / 1000.0)
          WHERE id = $1 AND tenant_id = $2 AND status IN ('creating', 'in_progress')
          RETURNING *",
    )
    .bind(id)
    .bind(tenant)
    .bind(owner)
    .bind(lease_ms as i64)
    .fetch_optional(pool)
    .await?)
}

/// Up to `limit` of the batch's runs not yet ended (index `runs_batch_active`).
pub async fn active_runs(pool: &PgPool, id: Uuid, limit: i64) -> Result<Vec<Uuid>, StoreError> {
    let rows: Vec<(Uuid,)> = sqlx::query_as(concat!(
        "SELECT id FROM runs WHERE batch_id = $1 AND status IN ",
        active!(),
        " LIMIT $2"
    ))
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// A batch the periodic sweep looks at.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Unfinished {
    pub id: Uuid,
    pub status: String,
}

/// Up to `limit` batches not yet finished (index `batches_unfinished`), oldest first.
pub async fn unfinished(pool: &PgPool, limit: i64) -> Result<Vec<Unfinished>, StoreError> {
    Ok(sqlx::query_as::<_, Unfinished>(
        "SELECT id, status FROM batches
          WHERE status IN ('creating', 'in_progress', 'cancelling')
          ORDER BY created_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Records `started_at` once a run of the batch has started: the earliest start among them.
/// Returns it (`None` while no run has started). Called only by a reader whose counts show a
/// run past `queued` while `started_at` is unset, so it scans the batch's runs about once.
pub async fn note_started(pool: &PgPool, id: Uuid) -> Result<Option<DateTime<Utc>>, StoreError> {
    let row: Option<(Option<DateTime<Utc>>,)> = sqlx::query_as(
        "UPDATE batches b SET started_at = s.first
           FROM (SELECT min(started_at) AS first FROM runs WHERE batch_id = $1) s
          WHERE b.id = $1 AND b.started_at IS NULL AND s.first IS NOT NULL
          RETURNING b.started_at",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(|(at,)| at))
}

/// `in_progress -> completed` or `cancelling -> cancelled` once none of the batch's runs is
/// still active (a probe of `runs_batch_active`; a second one for a batch that looks
/// finishable, under its row's lock). Returns the finished batch when this call
/// finished it (exactly one caller does, whichever replica): the caller's transaction is the
/// place to record what follows a batch's end (see `api/src/batch_driver.rs`, `finished`).
///
/// `conn` must be in a transaction. Only a batch that looks finishable has its row locked (the
/// sweep asks every second about every open batch, and a lock is a write), and only then are
/// its runs looked at again, in a statement of its own. A single `UPDATE` that
/// waited for the lock would re-check the batch's row once it got it, but not its runs (its
/// subquery keeps the snapshot taken before the wait), so it finished a batch whose run a
/// dead-letter replay had just put back in the queue (`dead_letters::replay` locks the
/// batch's row too).
pub async fn finish(conn: &mut PgConnection, id: Uuid) -> Result<Option<BatchRow>, StoreError> {
    // Locks only a batch that looks finishable: a row the quals reject is not locked.
    let open: Option<(Uuid,)> = sqlx::query_as(concat!(
        "SELECT b.id FROM batches b
          WHERE b.id = $1 AND b.status IN ('in_progress', 'cancelling')
            AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.batch_id = b.id AND r.status IN ",
        active!(),
        ")
            FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    if open.is_none() {
        return Ok(None);
    }
    Ok(sqlx::query_as::<_, BatchRow>(concat!(
        "UPDATE batches b
            SET status = CASE b.status WHEN 'cancelling' THEN 'cancelled' ELSE 'completed' END,
                finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
                started_at = coalesce(b.started_at,
                    (SELECT min(r.started_at) FROM runs r WHERE r.batch_id = b.id))
          WHERE b.id = $1 AND b.status IN ('in_progress', 'cancelling')
            AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.batch_id = b.id AND r.status IN ",
        active!(),
        ")
          RETURNING b.*"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?)
}

/// One line of a batch's results.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ResultRow {
    pub position: i32,
    pub custom_id: String,
    pub run_id: Option<Uuid>,
    /// Why the item has no run.
    pub item_error: Option<Json<Value>>,
    pub status: Option<String>,
    pub error: Option<Json<Value>>,
    /// The run's last assistant message, for a completed run.
    pub answer: Option<Json<Value>>,
}

/// Up to `limit` items after `after` (a position; -1 for the start), in order, with their runs
/// and, for completed runs, their last assistant message (found through `messages_thread`:
/// each batch run on a new thread is the only one of its thread).
pub async fn results_page(
    pool: &PgPool,
    id: Uuid,
    after: i32,
    limit: i64,
) -> Result<Vec<ResultRow>, StoreError> {
    Ok(sqlx::query_as::<_, ResultRow>(
        "SELECT i.position, i.custom_id, i.run_id, i.error AS item_error, r.status, r.error,
                CASE WHEN r.status = 'completed' THEN
                    (SELECT m.body FROM messages m
                      WHERE m.thread_id = r.thread_id AND m.run_id = r.id AND m.role = 'assistant'
                      ORDER BY m.id DESC LIMIT 1)
                END AS answer
           FROM batch_items i LEFT JOIN runs r ON r.id = i.run_id
          WHERE i.batch_id = $1 AND i.position > $2
          ORDER BY i.position LIMIT $3",
    )
    .bind(id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::tenants;

    async fn tenant(pool: &PgPool) -> Uuid {
        tenants::create(pool, "t").await.unwrap().tenant_id
    }

    fn new_batch(tenant: Uuid, key: Option<&str>) -> NewBatch {
        NewBatch {
            id: Uuid::now_v7(),
            tenant_id: tenant,
            status: "creating",
            metadata: json!({"a": 1}),
            idempotency_key: key.map(str::to_owned),
            request_hash: Some(vec![1; 32]),
            fair: false,
            lease: Some(("me".into(), 60_000)),
            traceparent: None,
        }
    }

    fn items(n: usize) -> Vec<NewItem> {
        (0..n)
            .map(|i| NewItem {
                custom_id: format!("c{i}"),
                body: Some(json!({"i": i})),
                run_id: None,
            })
            .collect()
    }

    /// The batch and its items are one statement; a second batch with the key writes nothing.
    #[sqlx::test(migrations = "../migrations")]
    async fn an_idempotency_key_writes_one_batch(pool: PgPool) {
        let t = tenant(&pool).await;
        let first = insert(&pool, &new_batch(t, Some("k")), &items(3))
            .await
            .unwrap()
            .expect("written");
        assert_eq!(first.total, 3);
        assert!(
            insert(&pool, &new_batch(t, Some("k")), &items(5))
                .await
                .unwrap()
                .is_none()
        );
        let n: (i64,) = sqlx::query_as("SELECT count(*) FROM batch_items")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n.0, 3);
        let mut conn = pool.acquire().await.unwrap();
        let pending = pending_items(&mut conn, first.id, 10).await.unwrap();
        assert_eq!(
            pending
                .iter()
                .map(|p| (p.position, p.custom_id.as_str()))
                .collect::<Vec<_>>(),
            [(0, "c0"), (1, "c1"), (2, "c2")]
        );
        assert_eq!(counts(&pool, first.id).await.unwrap().pending, 3);
    }

    /// Only the lease holder renews; an expired lease is taken over, and the old holder is
    /// refused from then on.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_lease_is_held_by_one_driver(pool: PgPool) {
        let t = tenant(&pool).await;
        let mut b = new_batch(t, None);
        b.lease = Some(("old".into(), 0));
        let batch = insert(&pool, &b, &items(1)).await.unwrap().unwrap();
        let taken = take_over(&pool, "new", 60_000, 10).await.unwrap();
        assert_eq!(taken, [batch.id]);
        assert!(
            take_over(&pool, "third", 60_000, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let mut conn = pool.acquire().await.unwrap();
        assert!(
            renew(&mut conn, batch.id, "old", 1000)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            renew(&mut conn, batch.id, "new", 1000)
                .await
                .unwrap()
                .is_some()
        );
    }

    /// A batch finishes only when no run of it is active.
    #[sqlx::test(migrations = "../migrations")]
    async fn finishes_once_no_run_is_active(pool: PgPool) {
        let t = tenant(&pool).await;
        let batch = insert(&pool, &new_batch(t, None), &items(1))
            .await
            .unwrap()
            .unwrap();
        let mut tx = pool.begin().await.unwrap();
        assert!(
            finish(&mut tx, batch.id).await.unwrap().is_none(),
            "still creating"
        );
        mark_created(&mut tx, batch.id).await.unwrap();
        let done = finish(&mut tx, batch.id).await.unwrap().expect("finished");
        assert_eq!(done.status, "completed");
        assert!(
            finish(&mut tx, batch.id).await.unwrap().is_none(),
            "only once"
        );
        tx.commit().await.unwrap();
    }

    /// Runs made for items count by status; an item's run, error and answer reach its line.
    #[sqlx::test(migrations = "../migrations")]
    async fn counts_and_results_follow_the_items(pool: PgPool) {
        let t = tenant(&pool).await;
        let batch = insert(&pool, &new_batch(t, None), &items(3))
            .await
            .unwrap()
            .unwrap();
        let run = crate::store::transitions::NewRun::for_test(t);
        let run_id = run.id;
        let mut tx = pool.begin().await.unwrap();
        crate::store::create_many::create_on_new_threads_in(&mut *tx, &[run], Some(batch.id))
            .await
            .unwrap();
        set_outcomes(
            &mut tx,
            batch.id,
            &[0, 1],
            &[Some(run_id), None],
            &[
                None,
                Some(json!({"code": "thread_busy", "message": "busy"})),
            ],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let c = counts(&pool, batch.id).await.unwrap();
        assert_eq!(c.runs, [("queued".to_owned(), 1)]);
        assert_eq!((c.pending, c.active(), c.created()), (1, 1, 1));
        let page = results_page(&pool, batch.id, -1, 2).await.unwrap();
        assert_eq!(page.len(), 2, "the page size holds");
        assert_eq!(page[0].run_id, Some(run_id));
        assert_eq!(page[0].status.as_deref(), Some("queued"));
        assert!(
            page[0].answer.is_none(),
            "only a completed run has an answer"
        );
        assert_eq!(
            page[1].item_error.as_ref().unwrap().0["code"],
            "thread_busy"
        );
        let rest = results_page(&pool, batch.id, page[1].position, 2)
            .await
            .unwrap();
        assert_eq!(rest.iter().map(|r| r.position).collect::<Vec<_>>(), [2]);
        let mut conn = pool.acquire().await.unwrap();
        let body = pending_items(&mut conn, batch.id, 10).await.unwrap();
        assert_eq!(body.len(), 1);
        assert_eq!(body[0].body.as_ref().unwrap().0, json!({"i": 2}));
        let cleared: (Option<Json<Value>>,) =
            sqlx::query_as("SELECT body FROM batch_items WHERE batch_id = $1 AND position = 0")
                .bind(batch.id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(cleared.0.is_none(), "a made item's request is dropped");
    }
}
