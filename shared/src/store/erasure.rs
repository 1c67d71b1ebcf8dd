//! Tenant erasure (migration `0028_erasure.sql`): what `DELETE /admin/v1/tenants/{id}` and
//! `agentfleet-api tenants erase` write at once, and the bounded steps that remove the rest of
//! the tenant afterwards (`api/src/erasure.rs` drives them; docs/operations.md, "Erasing a
//! tenant").
//!
//! Every table that holds something of a tenant, and how its rows are found:
//!
//! | table | found by |
//! | --- | --- |
//! | `api_keys`, `runs`, `batches`, `webhook_endpoints`, `mcp_servers`, `usage_daily`, `usage_shards` | `tenant_id` (an index) |
//! | `threads` | its runs' `thread_id` (no index holds `threads.tenant_id`; a thread left without a run is found by one scan at the end) |
//! | `messages` | `thread_id` (and `run_id`) of the tenant's threads and runs |
//! | `tool_calls`, `iterations` | `run_id` of the tenant's runs |
//! | `batch_items` | `batch_id` of the tenant's batches |
//! | `webhook_deliveries` | `endpoint_id` of the tenant's endpoints |
//!
//! Each step deletes at most `erasure.batch_size` rows of one table, children before their
//! parents, in a transaction of its own that only ever locks rows of the erased tenant: no
//! other tenant's statement waits for one. The steps find their rows anew each time (what is
//! deleted is gone), so an erasure resumes after a crash exactly where it stopped. The
//! tenant's row stays as a tombstone ([`finish`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::StoreError;

/// Every table an erasure empties of the tenant, in the order the counts list them.
pub const TABLES: [&str; 14] = [
    "api_keys",
    "threads",
    "runs",
    "messages",
    "tool_calls",
    "iterations",
    "usage_daily",
    "usage_shards",
    "batches",
    "batch_items",
    "webhook_endpoints",
    "webhook_deliveries",
    "mcp_servers",
    "tenant_active_deltas",
];

/// Rows per table.
pub type Counts = BTreeMap<String, i64>;

/// The statuses of a run not yet ended, as the partial index `runs_active_by_tenant` names
/// them (the planner matches the predicate by its text).
const ACTIVE: &str = "('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')";

/// An erasure as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Erasure {
    pub tenant_id: Uuid,
    /// `erasing` (rows or keys may remain) or `done` (verified: nothing of the tenant is left).
    pub status: String,
    /// `cancelling` (its runs not yet ended are being cancelled), `waiting`
    /// (`erasure.grace_ms` after the last cancel: cached keys of other replicas expire, workers
    /// stop), `deleting`, `verifying`, `done`.
    pub phase: String,
    pub requested_at: DateTime<Utc>,
    /// When a replica first worked on it.
    pub started_at: Option<DateTime<Utc>>,
    /// When its last active run was cancelled; deletion begins `erasure.grace_ms` later.
    pub quiet_since: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Keys revoked by the request (the others were revoked already).
    pub keys_revoked: i32,
    /// Runs cancelled (queued, waiting or running when the erasure found them).
    pub runs_cancelled: i32,
    /// Redis keys deleted (the runs' event lists, fences and bases; the tenant's rate bucket).
    pub redis_keys_deleted: i64,
    /// Rows per table when deletion began.
    #[schema(value_type = Option<Object>)]
    pub counted: Option<Json<Counts>>,
    /// Rows deleted so far, per table.
    #[schema(value_type = Object)]
    pub deleted: Json<Counts>,
    /// Rows per table left: counted when deletion began, less what was deleted since, and
    /// counted again by each verification; every table at 0 once `done` (the proof). Null
    /// before deletion begins.
    #[schema(value_type = Option<Object>)]
    pub remaining: Option<Json<Counts>>,
    /// When `remaining` was last counted by a verification (the proof's time once `done`).
    pub verified_at: Option<DateTime<Utc>>,
    /// The last failure of a step (retried by the next holder of the erasure).
    pub last_error: Option<String>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "tenant_id, status, phase, requested_at, started_at, quiet_since, \
     finished_at, keys_revoked, runs_cancelled, redis_keys_deleted, counted, deleted, remaining, \
     verified_at, last_error, updated_at";

/// What [`request`] did.
#[derive(Debug)]
pub struct Requested {
    pub erasure: Erasure,
    /// The erasure was recorded by this request (false: it was requested before).
    pub new: bool,
}

/// Erases `tenant`: in one transaction, marks it erased (and suspended: nothing of it starts,
/// and a batch still creating its runs stops), revokes every key of it and records the
/// erasure. Requesting it again changes nothing and answers the erasure as it stands.
/// `StoreError::NotFound` for an unknown tenant.
pub async fn request(pool: &PgPool, tenant: Uuid) -> Result<Requested, StoreError> {
    let mut tx = pool.begin().await?;
    let erased: Option<(bool,)> =
        sqlx::query_as("SELECT erased_at IS NOT NULL FROM tenants WHERE id = $1 FOR UPDATE")
            .bind(tenant)
            .fetch_optional(&mut *tx)
            .await?;
    let (already,) = erased.ok_or(StoreError::NotFound)?;
    if !already {
        sqlx::query(
            "UPDATE tenants SET erased_at = now(), suspended_at = COALESCE(suspended_at, now())
             WHERE id = $1",
        )
        .bind(tenant)
        .execute(&mut *tx)
        .await?;
    }
    let revoked = sqlx::query(
        "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND revoked_at IS NULL",
    )
    .bind(tenant)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let inserted = sqlx::query(
        "INSERT INTO tenant_erasures (tenant_id, keys_revoked) VALUES ($1, $2)
         ON CONFLICT (tenant_id) DO NOTHING",
    )
    .bind(tenant)
    .bind(revoked as i32)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let erasure = get_in(&mut tx, tenant).await?.ok_or(StoreError::NotFound)?;
    tx.commit().await?;
    Ok(Requested {
        erasure,
        new: inserted == 1,
    })
}

async fn get_in(conn: &mut PgConnection, tenant: Uuid) -> Result<Option<Erasure>, StoreError> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM tenant_erasures WHERE tenant_id = $1"
    )))
    .bind(tenant)
    .fetch_optional(conn)
    .await?)
}

/// The erasure of `tenant`, if one was requested.
pub async fn get(pool: &PgPool, tenant: Uuid) -> Result<Option<Erasure>, StoreError> {
    let mut conn = pool.acquire().await?;
    get_in(&mut conn, tenant).await
}

/// Takes the lease of `tenant`'s erasure for `owner` if nobody holds it (or its holder's
/// lease ran out). Whether it did.
pub async fn take(
    pool: &PgPool,
    tenant: Uuid,
    owner: &str,
    lease_ms: u64,
) -> Result<bool, StoreError> {
    let taken = sqlx::query(
        "UPDATE tenant_erasures
            SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3::bigint / 1000.0),
                started_at = COALESCE(started_at, now())
          WHERE tenant_id = $1 AND status = 'erasing'
            AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < now())",
    )
    .bind(tenant)
    .bind(owner)
    .bind(lease_ms as i64)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(taken == 1)
}

/// The oldest erasure not done whose lease is free, taken for `owner`.
pub async fn claim(pool: &PgPool, owner: &str, lease_ms: u64) -> Result<Option<Uuid>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE tenant_erasures
            SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2::bigint / 1000.0),
                started_at = COALESCE(started_at, now())
          WHERE tenant_id = (
                SELECT tenant_id FROM tenant_erasures
                 WHERE status = 'erasing'
                   AND (lease_owner IS NULL OR lease_expires_at < now())
                 ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)
          RETURNING tenant_id",
    )
    .bind(owner)
    .bind(lease_ms as i64)
    .fetch_optional(pool)
    .await?)
}

/// Renews `owner`'s lease of the erasure, in the caller's transaction (which then holds the
/// erasure's row: two steps of one erasure never overlap). `None` when `owner` lost it or it
/// is done.
pub async fn renew(
    conn: &mut PgConnection,
    tenant: Uuid,
    owner: &str,
    lease_ms: u64,
) -> Result<Option<Erasure>, StoreError> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenant_erasures
            SET lease_expires_at = now() + make_interval(secs => $3::bigint / 1000.0)
          WHERE tenant_id = $1 AND lease_owner = $2 AND status = 'erasing'
          RETURNING {COLUMNS}"
    )))
    .bind(tenant)
    .bind(owner)
    .bind(lease_ms as i64)
    .fetch_optional(conn)
    .await?)
}

/// Gives the lease back (the holder is stopping): any replica may take the erasure at once.
pub async fn release(pool: &PgPool, tenant: Uuid, owner: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE tenant_erasures SET lease_owner = NULL, lease_expires_at = NULL
          WHERE tenant_id = $1 AND lease_owner = $2",
    )
    .bind(tenant)
    .bind(owner)
    .execute(pool)
    .await?;
    Ok(())
}

/// What a step changes on the erasure's row, written in the step's transaction.
#[derive(Debug, Default)]
pub struct Progress<'a> {
    /// Rows deleted, per table.
    pub deleted: &'a [(&'static str, u64)],
    pub runs_cancelled: u64,
    pub redis_keys_deleted: u64,
    /// Moves to this phase.
    pub phase: Option<&'static str>,
    /// Sets `quiet_since` to now.
    pub quiet: bool,
    /// Sets `counted` (and `remaining` to it).
    pub counted: Option<&'a Counts>,
    /// Sets `remaining` and `verified_at`.
    pub remaining: Option<&'a Counts>,
}

/// Records `progress` if `owner` still holds the erasure; whether it did (the caller rolls
/// its step back when not).
pub async fn record(
    conn: &mut PgConnection,
    tenant: Uuid,
    owner: &str,
    progress: &Progress<'_>,
) -> Result<bool, StoreError> {
    let mut deleted = Counts::new();
    for (table, n) in progress.deleted {
        *deleted.entry((*table).to_owned()).or_default() += *n as i64;
    }
    let done = sqlx::query(
        "UPDATE tenant_erasures e
            SET deleted = (SELECT COALESCE(jsonb_object_agg(k, v), '{}'::jsonb) FROM (
                    SELECT k, sum(v)::bigint AS v FROM (
                        SELECT key AS k, value::bigint AS v FROM jsonb_each_text(e.deleted)
                        UNION ALL
                        SELECT key, value::bigint FROM jsonb_each_text($3::jsonb)) a
                    GROUP BY k) b),
                runs_cancelled = runs_cancelled + $4,
                redis_keys_deleted = redis_keys_deleted + $5,
                phase = COALESCE($6, phase),
                quiet_since = CASE WHEN $7 THEN now() ELSE quiet_since END,
                counted = COALESCE($8, counted),
                -- Exact when counted (a verification, or deletion beginning); in between, what
                -- was counted less what was deleted since.
                remaining = CASE
                    WHEN $9::jsonb IS NOT NULL THEN $9
                    WHEN $8::jsonb IS NOT NULL THEN $8
                    WHEN e.remaining IS NULL THEN NULL
                    ELSE (SELECT jsonb_object_agg(r.key, GREATEST(0,
                              r.value::bigint - COALESCE(($3::jsonb ->> r.key)::bigint, 0)))
                            FROM jsonb_each_text(e.remaining) r)
                END,
                verified_at = CASE WHEN $9::jsonb IS NULL THEN verified_at ELSE now() END,
                last_error = NULL,
                updated_at = now()
          WHERE tenant_id = $1 AND lease_owner = $2 AND status = 'erasing'",
    )
    .bind(tenant)
    .bind(owner)
    .bind(Json(&deleted))
    .bind(progress.runs_cancelled as i32)
    .bind(progress.redis_keys_deleted as i64)
    .bind(progress.phase)
    .bind(progress.quiet)
    .bind(progress.counted.map(Json))
    .bind(progress.remaining.map(Json))
    .execute(conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Notes a failed step on the erasure (`last_error`, at most 1000 characters).
pub async fn note_error(pool: &PgPool, tenant: Uuid, error: &str) -> Result<(), StoreError> {
    let error: String = error.chars().take(1000).collect();
    sqlx::query(
        "UPDATE tenant_erasures SET last_error = $2, updated_at = now()
          WHERE tenant_id = $1 AND status = 'erasing'",
    )
    .bind(tenant)
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// Ends the erasure, verified: `remaining` (every table at 0) is its proof. The tenant's row
/// becomes a tombstone: its name replaced and its limits cleared; its id, creation time,
/// `suspended_at` and `erased_at` stay. `false` if `owner` no longer held it.
pub async fn finish(
    conn: &mut PgConnection,
    tenant: Uuid,
    owner: &str,
    remaining: &Counts,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE tenant_erasures
            SET status = 'done', phase = 'done', finished_at = now(), remaining = $3,
                verified_at = now(), lease_owner = NULL, lease_expires_at = NULL,
                last_error = NULL, updated_at = now()
          WHERE tenant_id = $1 AND lease_owner = $2 AND status = 'erasing'",
    )
    .bind(tenant)
    .bind(owner)
    .bind(Json(remaining))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if done == 0 {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE tenants SET name = $2, limits = '{}'::jsonb WHERE id = $1 AND erased_at IS NOT NULL",
    )
    .bind(tenant)
    .bind(TOMBSTONE_NAME)
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

/// The name an erased tenant's row keeps.
pub const TOMBSTONE_NAME: &str = "(erased)";

/// Up to `limit` runs of the tenant to cancel: those waiting for their thread first (so that
/// cancelling a thread's active run promotes none of them), then planners waiting for their
/// tasks (a planner's cancel cancels its tasks, where the end of its last task would make it
/// runnable), then those not yet ended. Empty when none is left.
pub async fn runs_to_cancel(
    pool: &PgPool,
    tenant: Uuid,
    limit: i64,
    waiting_too: bool,
) -> Result<Vec<Uuid>, StoreError> {
    let active = format!("status IN {ACTIVE}");
    let steps = [
        waiting_too.then_some("status = 'waiting_for_thread'"),
        Some("status = 'waiting_for_tasks'"),
        Some(active.as_str()),
    ];
    for predicate in steps.into_iter().flatten() {
        let ids: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM runs WHERE tenant_id = $1 AND {predicate} LIMIT $2"
        )))
        .bind(tenant)
        .bind(limit)
        .fetch_all(pool)
        .await?;
        if !ids.is_empty() {
            return Ok(ids);
        }
    }
    Ok(Vec::new())
}

/// Deletes up to `limit` rows of the first table, in this order, that still has some of the
/// tenant: its batches' items, its batches, its endpoints' deliveries, its endpoints, its MCP
/// servers. `None` once all are empty. Before the runs: a batch still creating runs stops
/// finding its items, and a run's late change finds no endpoint to deliver to.
pub async fn delete_before_runs(
    conn: &mut PgConnection,
    tenant: Uuid,
    limit: i64,
) -> Result<Option<(&'static str, u64)>, StoreError> {
    let batches: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM batches WHERE tenant_id = $1 LIMIT $2")
            .bind(tenant)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
    if !batches.is_empty() {
        let items = sqlx::query(
            "DELETE FROM batch_items WHERE (batch_id, position) IN (
                SELECT batch_id, position FROM batch_items WHERE batch_id = ANY($1) LIMIT $2)",
        )
        .bind(&batches)
        .bind(limit)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if items > 0 {
            return Ok(Some(("batch_items", items)));
        }
        let n = sqlx::query("DELETE FROM batches WHERE id = ANY($1) AND tenant_id = $2")
            .bind(&batches)
            .bind(tenant)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        return Ok(Some(("batches", n)));
    }
    let endpoints: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM webhook_endpoints WHERE tenant_id = $1 LIMIT $2")
            .bind(tenant)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
    if !endpoints.is_empty() {
        let deliveries = sqlx::query(
            "DELETE FROM webhook_deliveries WHERE id IN (
                SELECT id FROM webhook_deliveries WHERE endpoint_id = ANY($1) LIMIT $2)",
        )
        .bind(&endpoints)
        .bind(limit)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if deliveries > 0 {
            return Ok(Some(("webhook_deliveries", deliveries)));
        }
        let n = sqlx::query("DELETE FROM webhook_endpoints WHERE id = ANY($1) AND tenant_id = $2")
            .bind(&endpoints)
            .bind(tenant)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        return Ok(Some(("webhook_endpoints", n)));
    }
    let n = sqlx::query(
        "DELETE FROM mcp_servers WHERE id IN (
            SELECT id FROM mcp_servers WHERE tenant_id = $1 LIMIT $2)",
    )
    .bind(tenant)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok((n > 0).then_some(("mcp_servers", n)))
}

/// Up to `limit` runs of the tenant, with their threads: the next to delete. Their Redis keys
/// are named by these ids, so they are read before the rows go.
pub async fn next_runs(
    pool: &PgPool,
    tenant: Uuid,
    limit: i64,
) -> Result<Vec<(Uuid, Uuid)>, StoreError> {
    Ok(
        sqlx::query_as("SELECT id, thread_id FROM runs WHERE tenant_id = $1 LIMIT $2")
            .bind(tenant)
            .bind(limit)
            .fetch_all(pool)
            .await?,
    )
}

/// Deletes up to `limit` rows of the first of the runs' children that still has some: their
/// tool calls, their iterations, their messages. `None` once all are empty.
pub async fn delete_run_children(
    conn: &mut PgConnection,
    runs: &[Uuid],
    threads: &[Uuid],
    limit: i64,
) -> Result<Option<(&'static str, u64)>, StoreError> {
    let n = sqlx::query(
        "DELETE FROM tool_calls WHERE id IN (
            SELECT id FROM tool_calls WHERE run_id = ANY($1) LIMIT $2)",
    )
    .bind(runs)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("tool_calls", n)));
    }
    let n = sqlx::query(
        "DELETE FROM iterations WHERE (run_id, iteration, attempt) IN (
            SELECT run_id, iteration, attempt FROM iterations WHERE run_id = ANY($1) LIMIT $2)",
    )
    .bind(runs)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("iterations", n)));
    }
    // Through `messages_thread`: no index holds `messages.run_id`.
    let n = sqlx::query(
        "DELETE FROM messages WHERE id IN (
            SELECT id FROM messages WHERE thread_id = ANY($1) AND run_id = ANY($2) LIMIT $3)",
    )
    .bind(threads)
    .bind(runs)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok((n > 0).then_some(("messages", n)))
}

/// Deletes the runs (their children deleted before: [`delete_run_children`]), then those of
/// their threads left without a run, with whatever messages those threads still hold (none,
/// unless a message named no run). A thread is deleted in the same transaction as its last
/// run: none is left that no run leads to.
pub async fn delete_runs(
    conn: &mut PgConnection,
    tenant: Uuid,
    runs: &[Uuid],
    threads: &[Uuid],
) -> Result<Vec<(&'static str, u64)>, StoreError> {
    let n_runs = sqlx::query("DELETE FROM runs WHERE id = ANY($1) AND tenant_id = $2")
        .bind(runs)
        .bind(tenant)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let emptied: Vec<Uuid> = sqlx::query_scalar(
        "SELECT t.id FROM threads t WHERE t.id = ANY($1) AND t.tenant_id = $2
            AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id)",
    )
    .bind(threads)
    .bind(tenant)
    .fetch_all(&mut *conn)
    .await?;
    let mut out = vec![("runs", n_runs)];
    if !emptied.is_empty() {
        let n = sqlx::query("DELETE FROM messages WHERE thread_id = ANY($1)")
            .bind(&emptied)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        out.push(("messages", n));
        let n = sqlx::query("DELETE FROM threads WHERE id = ANY($1) AND tenant_id = $2")
            .bind(&emptied)
            .bind(tenant)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        out.push(("threads", n));
    }
    Ok(out)
}

/// After the runs: deletes up to `limit` rows of the first table that still has some of the
/// tenant: its active-run counts, its daily usage (old and sharded), its keys (after its tool calls, which name the
/// key of their decision), then threads that no run leads to (found by a scan of `threads`:
/// normally none), with their messages. `None` once all are empty.
pub async fn delete_after_runs(
    conn: &mut PgConnection,
    tenant: Uuid,
    limit: i64,
) -> Result<Option<(&'static str, u64)>, StoreError> {
    let n = sqlx::query(
        "DELETE FROM tenant_active_deltas WHERE ctid IN (
            SELECT ctid FROM tenant_active_deltas WHERE tenant_id = $1 LIMIT $2)",
    )
    .bind(tenant)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("tenant_active_deltas", n)));
    }
    let n = sqlx::query(
        "DELETE FROM usage_daily WHERE (tenant_id, day) IN (
            SELECT tenant_id, day FROM usage_daily WHERE tenant_id = $1 LIMIT $2)",
    )
    .bind(tenant)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("usage_daily", n)));
    }
    let n = sqlx::query(
        "DELETE FROM usage_shards WHERE (tenant_id, day, shard) IN (
            SELECT tenant_id, day, shard FROM usage_shards WHERE tenant_id = $1 LIMIT $2)",
    )
    .bind(tenant)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("usage_shards", n)));
    }
    let n = sqlx::query(
        "DELETE FROM api_keys WHERE id IN (
            SELECT id FROM api_keys WHERE tenant_id = $1 LIMIT $2)",
    )
    .bind(tenant)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("api_keys", n)));
    }
    let orphans: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM threads WHERE tenant_id = $1 LIMIT $2")
            .bind(tenant)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
    if orphans.is_empty() {
        return Ok(None);
    }
    let n = sqlx::query(
        "DELETE FROM messages WHERE id IN (
            SELECT id FROM messages WHERE thread_id = ANY($1) LIMIT $2)",
    )
    .bind(&orphans)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n > 0 {
        return Ok(Some(("messages", n)));
    }
    // A run made on one of them since it was read keeps it (the foreign key would take the
    // run with it): only threads still without a run go.
    let n = sqlx::query(
        "DELETE FROM threads t WHERE t.id = ANY($1) AND t.tenant_id = $2
            AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id)",
    )
    .bind(&orphans)
    .bind(tenant)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(Some(("threads", n)))
}

/// The tenant's rows in every table of [`TABLES`], exactly: each child table counted through
/// its parents as the steps find them. Read-only, but it scans `threads` whole (no index holds
/// its `tenant_id`), so it runs without the pool's statement time-out; the erasure counts
/// once when deletion begins and once per verification.
pub async fn counts(pool: &PgPool, tenant: Uuid) -> Result<Counts, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    let (values,): (Vec<i64>,) = sqlx::query_as(
        "SELECT ARRAY[
            (SELECT count(*) FROM api_keys WHERE tenant_id = $1),
            (SELECT count(*) FROM threads WHERE tenant_id = $1),
            (SELECT count(*) FROM runs WHERE tenant_id = $1),
            (SELECT count(*) FROM messages WHERE thread_id IN (
                SELECT id FROM threads WHERE tenant_id = $1
                UNION SELECT thread_id FROM runs WHERE tenant_id = $1)),
            (SELECT count(*) FROM tool_calls WHERE run_id IN (
                SELECT id FROM runs WHERE tenant_id = $1)),
            (SELECT count(*) FROM iterations WHERE run_id IN (
                SELECT id FROM runs WHERE tenant_id = $1)),
            (SELECT count(*) FROM usage_daily WHERE tenant_id = $1),
            (SELECT count(*) FROM usage_shards WHERE tenant_id = $1),
            (SELECT count(*) FROM batches WHERE tenant_id = $1),
            (SELECT count(*) FROM batch_items WHERE batch_id IN (
                SELECT id FROM batches WHERE tenant_id = $1)),
            (SELECT count(*) FROM webhook_endpoints WHERE tenant_id = $1),
            (SELECT count(*) FROM webhook_deliveries WHERE endpoint_id IN (
                SELECT id FROM webhook_endpoints WHERE tenant_id = $1)),
            (SELECT count(*) FROM mcp_servers WHERE tenant_id = $1),
            (SELECT count(*) FROM tenant_active_deltas WHERE tenant_id = $1)]",
    )
    .bind(tenant)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(TABLES
        .iter()
        .zip(values)
        .map(|(t, n)| ((*t).to_owned(), n))
        .collect())
}

/// Whether every count is 0.
pub fn all_zero(counts: &Counts) -> bool {
    counts.values().all(|n| *n == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_zero_only_when_every_table_is() {
        let mut c: Counts = TABLES.iter().map(|t| ((*t).to_owned(), 0)).collect();
        assert!(all_zero(&c));
        c.insert("messages".into(), 1);
        assert!(!all_zero(&c));
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_request_revokes_every_key_and_is_recorded_once(pool: PgPool) {
        let created = crate::store::tenants::create(&pool, "acme").await.unwrap();
        let tenant = created.tenant_id;
        crate::store::keys::create(&pool, tenant, "second", None)
            .await
            .unwrap();
        let first = request(&pool, tenant).await.unwrap();
        assert!(first.new);
        assert_eq!(first.erasure.keys_revoked, 2);
        assert_eq!(first.erasure.status, "erasing");
        assert!(
            crate::store::tenants::authenticate(&pool, &created.api_key)
                .await
                .unwrap()
                .is_none()
        );
        let again = request(&pool, tenant).await.unwrap();
        assert!(!again.new);
        assert_eq!(again.erasure.keys_revoked, 2);
        // No key can be made for it any more.
        assert!(matches!(
            crate::store::keys::create(&pool, tenant, "third", None).await,
            Err(crate::store::keys::KeyError::TenantErased(_))
        ));
        assert!(matches!(
            request(&pool, Uuid::now_v7()).await,
            Err(StoreError::NotFound)
        ));
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_lease_is_held_by_one_owner_and_progress_needs_it(pool: PgPool) {
        let tenant = crate::store::tenants::create(&pool, "acme")
            .await
            .unwrap()
            .tenant_id;
        request(&pool, tenant).await.unwrap();
        assert_eq!(
            claim(&pool, "a", 60_000).await.unwrap(),
            Some(tenant),
            "a free erasure is claimed"
        );
        assert_eq!(claim(&pool, "b", 60_000).await.unwrap(), None);
        assert!(!take(&pool, tenant, "b", 60_000).await.unwrap());
        let mut conn = pool.acquire().await.unwrap();
        let deleted = [("runs", 3), ("runs", 2), ("threads", 1)];
        let progress = Progress {
            deleted: &deleted,
            ..Default::default()
        };
        assert!(!record(&mut conn, tenant, "b", &progress).await.unwrap());
        assert!(record(&mut conn, tenant, "a", &progress).await.unwrap());
        assert!(record(&mut conn, tenant, "a", &progress).await.unwrap());
        let e = get(&pool, tenant).await.unwrap().unwrap();
        assert_eq!(e.deleted.0.get("runs"), Some(&10));
        assert_eq!(e.deleted.0.get("threads"), Some(&2));
        assert_eq!(e.remaining, None, "nothing counted yet");
        let counted: Counts = [("runs".to_owned(), 12), ("threads".to_owned(), 1)].into();
        let start = Progress {
            counted: Some(&counted),
            ..Default::default()
        };
        assert!(record(&mut conn, tenant, "a", &start).await.unwrap());
        assert!(record(&mut conn, tenant, "a", &progress).await.unwrap());
        let e = get(&pool, tenant).await.unwrap().unwrap();
        let left: Counts = [("runs".to_owned(), 7), ("threads".to_owned(), 0)].into();
        assert_eq!(
            e.remaining.map(|r| r.0),
            Some(left),
            "counted less deleted, never below 0"
        );
        assert_eq!(e.verified_at, None);
        release(&pool, tenant, "a").await.unwrap();
        assert!(take(&pool, tenant, "b", 60_000).await.unwrap());
        let zero = counts(&pool, tenant).await.unwrap();
        assert_eq!(zero.get("api_keys"), Some(&1), "{zero:?}");
        assert!(!finish(&mut conn, tenant, "a", &zero).await.unwrap());
        assert!(finish(&mut conn, tenant, "b", &zero).await.unwrap());
        let t = crate::store::tenants::get(&pool, tenant).await.unwrap();
        assert_eq!(t.name, TOMBSTONE_NAME);
        assert!(t.erased_at.is_some());
    }
}
