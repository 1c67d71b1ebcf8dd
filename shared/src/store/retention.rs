//! Removal of runs past their tenant's retention window, in bounded batches (the worker's
//! `retention` task paces them; docs/operations.md, "Retention").
//!
//! What goes: a finished run (completed, failed, cancelled) once `finished_runs_secs` have passed
//! since it ended; a run waiting for input or approval once `waiting_runs_secs` have passed since
//! it paused (0: never), with the runs waiting for its thread behind it. With a run go its tool
//! calls and iteration timings. A thread's messages are its conversation: every later run of the
//! thread sends them to the model, and a summary of the context counts them from the thread's
//! first (`covers`), so they are removed only with the thread itself, once every run of it is
//! past its window; a thread in use keeps them while its old runs go. A batch (`/v1/batches`)
//! goes once it finished past the window and none of its runs is left, with its items; a webhook
//! delivery once it is delivered or failed and older than the window. Usage totals
//! (`usage_daily`, `usage_shards`), tenants, keys, endpoints and MCP servers are kept.
//!
//! Nothing here waits for a turn commit, nor makes one wait: the rows taken are those of runs
//! that ended or wait (a turn commit writes only running runs, their new messages, tool calls and
//! timings, and usage shards), locked with `SKIP LOCKED`, in one short transaction per batch
//! whose statements give up on any other lock after `retention.lock_timeout_ms`. The one row a
//! run creation may wait for is its thread's, held for one batch's transaction when every run of
//! that thread is past its window (or its waiting run goes): never a thread in use.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::StoreError;
use crate::config::RetentionSettings;
use crate::domain::{RetentionOverrides, RetentionWindows};

/// Advisory lock key of the removal election (advisory locks are per database).
const RETENTION_LOCK: i64 = 0x6167_6672_6574_6e74; // "agfretnt"

/// Runs counted at most for the backlog gauge: the figure is "at least this many" past it.
pub const BACKLOG_CAP: i64 = 100_000;

/// `/v1/batches` batches removed at most per removal batch: each takes its items (up to
/// `api.max_batch_items`) with it.
const BATCHES_PER_BATCH: i64 = 4;

/// Removal batches [`remove_due`] runs at most.
const MAX_BATCHES: usize = 10_000;

/// The tenants' windows as a CTE `t` (`tenant_id`, `finished_before`, `waiting_before`; a
/// cut-off is NULL where the window is 0), from `$1` tenant ids, `$2` and `$3` their windows in seconds.
/// `now()` is the transaction's start: every statement of a batch cuts at the same instant.
macro_rules! windows_cte {
    () => {
        "t AS (
            SELECT w.tenant_id,
                   CASE WHEN w.fd > 0 THEN now() - make_interval(secs => w.fd) END
                       AS finished_before,
                   CASE WHEN w.wd > 0 THEN now() - make_interval(secs => w.wd) END
                       AS waiting_before
            FROM unnest($1::uuid[], $2::float8[], $3::float8[]) AS w(tenant_id, fd, wd))"
    };
}

/// Whether run `$r` is a task of a plan whose planner has not ended: kept, whatever its own
/// window, for the planner reads its result when the round ends (and a task that waits keeps
/// its planner waiting). It goes by its window once the planner ended.
macro_rules! planner_waits {
    ($r:literal) => {
        concat!(
            "(",
            $r,
            ".parent_run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs p
                WHERE p.id = ",
            $r,
            ".parent_run_id AND p.finished_at IS NULL))"
        )
    };
}

/// Whether run `x` (joined with its tenant's `t`) is past its window: never NULL, so that
/// `NOT` of it is true for a run that is kept.
macro_rules! expired_x {
    () => {
        concat!("(NOT ", planner_waits!("x"), " AND COALESCE(
            (x.status IN ('completed', 'failed', 'cancelled') AND x.finished_at < t.finished_before)
         OR (x.status IN ('waiting_for_input', 'waiting_for_confirmation')
             AND x.updated_at < t.waiting_before
             AND NOT EXISTS (SELECT 1 FROM runs y WHERE y.thread_id = x.thread_id
                               AND y.status = 'waiting_for_thread'
                               AND y.created_at >= t.waiting_before))
         OR (x.status = 'waiting_for_thread' AND x.created_at < t.waiting_before
             AND EXISTS (SELECT 1 FROM runs a WHERE a.thread_id = x.thread_id
                           AND a.status IN ('waiting_for_input', 'waiting_for_confirmation')
                           AND a.updated_at < t.waiting_before)),
         false))")
    };
}

/// The windows of every tenant that has one (tenants whose windows are both 0 keep everything).
#[derive(Debug, Clone, Default)]
pub struct Windows {
    tenants: Vec<Uuid>,
    finished_secs: Vec<f64>,
    waiting_secs: Vec<f64>,
}

impl Windows {
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

/// Every tenant's effective windows: its own (`tenants.retention`) over `defaults`.
pub async fn windows(
    conn: &mut PgConnection,
    defaults: &RetentionWindows,
) -> Result<Windows, StoreError> {
    let rows: Vec<(Uuid, sqlx::types::Json<RetentionOverrides>)> =
        sqlx::query_as("SELECT id, retention FROM tenants ORDER BY id")
            .fetch_all(&mut *conn)
            .await?;
    let mut w = Windows::default();
    for (tenant, own) in rows {
        let eff = own.0.over(defaults);
        if eff.finished_runs_secs == 0 && eff.waiting_runs_secs == 0 {
            continue;
        }
        w.tenants.push(tenant);
        // Exact as float8: a window is at most 3.2e9 seconds (`MAX_RETENTION_SECS`).
        w.finished_secs.push(eff.finished_runs_secs as f64);
        w.waiting_secs.push(eff.waiting_runs_secs as f64);
    }
    Ok(w)
}

/// Runs past their window now (finished, and waiting where a waiting window is set), counted up
/// to [`BACKLOG_CAP`] through the indexes that the batches take them by.
pub async fn backlog(conn: &mut PgConnection, w: &Windows) -> Result<i64, StoreError> {
    if w.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query_scalar(concat!(
        "WITH ",
        windows_cte!(),
        "
         SELECT (SELECT count(*) FROM (
                    SELECT 1 FROM t CROSS JOIN LATERAL (
                        SELECT 1 FROM runs r
                        WHERE r.tenant_id = t.tenant_id AND r.finished_at IS NOT NULL
                          AND r.finished_at < t.finished_before
                        LIMIT $4) f
                    LIMIT $4) fs)
              + (SELECT count(*) FROM (
                    SELECT 1 FROM t CROSS JOIN LATERAL (
                        SELECT 1 FROM runs r
                        WHERE t.waiting_before IS NOT NULL AND r.tenant_id = t.tenant_id
                          AND r.status IN ('waiting_for_input', 'waiting_for_confirmation')
                          AND r.updated_at < t.waiting_before
                        LIMIT $4) p
                    LIMIT $4) ws)"
    ))
    .bind(&w.tenants)
    .bind(&w.finished_secs)
    .bind(&w.waiting_secs)
    .bind(BACKLOG_CAP)
    .fetch_one(&mut *conn)
    .await?)
}

/// What one batch (or several) removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    pub runs: u64,
    pub threads: u64,
    pub messages: u64,
    pub tool_calls: u64,
    pub iterations: u64,
    pub batches: u64,
    pub webhook_deliveries: u64,
    /// The batch stopped at one of its bounds (or passed over rows locked elsewhere): more may
    /// be due.
    pub more: bool,
}

impl Removed {
    /// `(what, count)` pairs, as the metric `agentfleet_retention_removed_total{what}` names them.
    pub fn counts(&self) -> [(&'static str, u64); 7] {
        [
            ("runs", self.runs),
            ("threads", self.threads),
            ("messages", self.messages),
            ("tool_calls", self.tool_calls),
            ("iterations", self.iterations),
            ("batches", self.batches),
            ("webhook_deliveries", self.webhook_deliveries),
        ]
    }

    fn add(&mut self, other: &Removed) {
        self.runs += other.runs;
        self.threads += other.threads;
        self.messages += other.messages;
        self.tool_calls += other.tool_calls;
        self.iterations += other.iterations;
        self.batches += other.batches;
        self.webhook_deliveries += other.webhook_deliveries;
        self.more = other.more;
    }
}

/// Sizes of one batch.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Runs taken at most (and webhook deliveries).
    pub runs: i64,
    /// Messages of threads that go whole, at most.
    pub messages: i64,
}

impl Bounds {
    pub fn of(settings: &RetentionSettings) -> Bounds {
        Bounds {
            runs: i64::from(settings.batch_runs.max(1)),
            messages: i64::from(settings.batch_messages.max(1)),
        }
    }
}

/// Gives up on any lock held elsewhere after `ms`, until the transaction ends.
async fn set_lock_timeout(conn: &mut PgConnection, ms: u64) -> Result<(), StoreError> {
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{ms}ms"))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// One batch, inside the caller's transaction (which the caller commits).
pub async fn remove_batch(
    conn: &mut PgConnection,
    w: &Windows,
    bounds: Bounds,
) -> Result<Removed, StoreError> {
    let mut removed = Removed::default();
    if w.is_empty() {
        return Ok(removed);
    }
    remove_runs(conn, w, bounds, &mut removed).await?;
    remove_batches(conn, w, &mut removed).await?;
    remove_deliveries(conn, w, bounds, &mut removed).await?;
    Ok(removed)
}

/// Runs past their window, locked: `(id, thread_id, status)`, oldest ended first.
async fn candidates(
    conn: &mut PgConnection,
    w: &Windows,
    limit: i64,
) -> Result<Vec<(Uuid, Uuid, String)>, StoreError> {
    Ok(sqlx::query_as(concat!(
        "WITH ",
        windows_cte!(),
        ",
         cand AS (
            (SELECT c.id FROM t CROSS JOIN LATERAL (
                SELECT r.id FROM runs r
                WHERE r.tenant_id = t.tenant_id AND r.finished_at IS NOT NULL
                  AND r.finished_at < t.finished_before AND NOT ",
        planner_waits!("r"),
        "
                ORDER BY r.finished_at LIMIT $4) c
             WHERE t.finished_before IS NOT NULL
             LIMIT $4)
            UNION ALL
            (SELECT c.id FROM t CROSS JOIN LATERAL (
                SELECT r.id FROM runs r
                WHERE r.tenant_id = t.tenant_id
                  AND r.status IN ('waiting_for_input', 'waiting_for_confirmation')
                  AND r.updated_at < t.waiting_before AND NOT ",
        planner_waits!("r"),
        "
                LIMIT $4) c
             WHERE t.waiting_before IS NOT NULL
             LIMIT $4))
         SELECT x.id, x.thread_id, x.status FROM runs x JOIN t ON t.tenant_id = x.tenant_id
         WHERE x.id IN (SELECT id FROM cand) AND ",
        expired_x!(),
        "
         LIMIT $4
         FOR UPDATE OF x SKIP LOCKED"
    ))
    .bind(&w.tenants)
    .bind(&w.finished_secs)
    .bind(&w.waiting_secs)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?)
}

async fn remove_runs(
    conn: &mut PgConnection,
    w: &Windows,
    bounds: Bounds,
    removed: &mut Removed,
) -> Result<(), StoreError> {
    let cand = candidates(conn, w, bounds.runs).await?;
    if cand.is_empty() {
        return Ok(());
    }
    if cand.len() as i64 >= bounds.runs {
        removed.more = true;
    }
    let mut threads: Vec<Uuid> = cand.iter().map(|(_, t, _)| *t).collect();
    threads.sort_unstable();
    threads.dedup();
    // A thread whose every run is past its window goes whole. Deciding that takes the thread's
    // lock (a run created on a thread, or queued behind its waiting run, takes that lock first),
    // and a statement after it, which sees every run committed before the lock was granted. So
    // do runs waiting behind a waiting run that goes. A thread that is plainly in use (a run
    // inside its window) is not locked: its finished runs go one by one, and a run created on
    // it never waits for this batch. A thread locked elsewhere is left for the next batch.
    let looks_whole = whole_threads(conn, w, &threads).await?;
    let mut to_lock = looks_whole.clone();
    to_lock.extend(
        cand.iter()
            .filter(|(_, _, s)| s.starts_with("waiting_for_"))
            .map(|(_, t, _)| *t),
    );
    to_lock.sort_unstable();
    to_lock.dedup();
    let locked: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM threads WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED",
    )
    .bind(&to_lock)
    .fetch_all(&mut *conn)
    .await?;
    if locked.len() < to_lock.len() {
        removed.more = true;
    }
    let whole = whole_threads(conn, w, &locked).await?;
    let in_use = |t: &Uuid| !to_lock.contains(t) || (locked.contains(t) && !whole.contains(t));

    // Threads in use: their runs past the window go one by one; the messages stay. A waiting
    // run goes with the runs queued behind it, if they are all past the window too.
    let mut ids: Vec<Uuid> = Vec::new();
    let mut waiting_threads: Vec<Uuid> = Vec::new();
    for (id, thread, status) in &cand {
        if !in_use(thread) {
            continue;
        }
        if status.starts_with("waiting_for_") {
            waiting_threads.push(*thread);
        } else {
            ids.push(*id);
        }
    }
    if !waiting_threads.is_empty() {
        let behind: Vec<(Uuid, Uuid, bool)> = sqlx::query_as(concat!(
            "WITH ",
            windows_cte!(),
            "
             SELECT x.id, x.thread_id, ",
            expired_x!(),
            " FROM runs x JOIN t ON t.tenant_id = x.tenant_id
             WHERE x.thread_id = ANY($4) AND x.status = 'waiting_for_thread'
             FOR UPDATE OF x"
        ))
        .bind(&w.tenants)
        .bind(&w.finished_secs)
        .bind(&w.waiting_secs)
        .bind(&waiting_threads)
        .fetch_all(&mut *conn)
        .await?;
        for (id, thread, _) in cand
            .iter()
            .filter(|(_, t, s)| waiting_threads.contains(t) && s.starts_with("waiting_for_"))
        {
            let queued: Vec<&(Uuid, Uuid, bool)> =
                behind.iter().filter(|(_, t, _)| t == thread).collect();
            if queued.iter().all(|(_, _, expired)| *expired) {
                ids.push(*id);
                ids.extend(queued.iter().map(|(q, _, _)| *q));
            }
        }
    }
    delete_runs(conn, &ids, removed).await?;

    // Threads that go whole: their messages first, newest first and bounded (a thread whose
    // removal is interrupted by a new run keeps the start of its conversation, whose summary
    // offsets stay right), then their runs, then the thread. Its runs stay until its messages
    // are gone: they are what brings the thread back to the next batch.
    if whole.is_empty() {
        return Ok(());
    }
    let messages = sqlx::query(
        "DELETE FROM messages WHERE id IN (
             SELECT id FROM messages WHERE thread_id = ANY($1) ORDER BY id DESC LIMIT $2)",
    )
    .bind(&whole)
    .bind(bounds.messages)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    removed.messages += messages;
    let emptied: Vec<Uuid> = sqlx::query_scalar(
        "SELECT th FROM unnest($1::uuid[]) th
         WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.thread_id = th)",
    )
    .bind(&whole)
    .fetch_all(&mut *conn)
    .await?;
    if emptied.len() < whole.len() {
        removed.more = true;
    }
    if emptied.is_empty() {
        return Ok(());
    }
    // Runs queued behind a waiting run first: a run that stays for the next batch is then one
    // the candidates find again.
    let runs: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM runs WHERE thread_id = ANY($1)
         ORDER BY (status = 'waiting_for_thread') DESC, created_at
         LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(&emptied)
    .bind(bounds.runs)
    .fetch_all(&mut *conn)
    .await?;
    delete_runs(conn, &runs, removed).await?;
    let threads = sqlx::query(
        "DELETE FROM threads th WHERE th.id = ANY($1)
           AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = th.id)",
    )
    .bind(&emptied)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    removed.threads += threads;
    if (threads as usize) < emptied.len() {
        removed.more = true;
    }
    Ok(())
}

/// Which of `threads` have no run inside its window (as of this statement's snapshot).
async fn whole_threads(
    conn: &mut PgConnection,
    w: &Windows,
    threads: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    if threads.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar(concat!(
        "WITH ",
        windows_cte!(),
        "
         SELECT th.id FROM threads th WHERE th.id = ANY($4)
           AND NOT EXISTS (SELECT 1 FROM runs x JOIN t ON t.tenant_id = x.tenant_id
                           WHERE x.thread_id = th.id AND NOT ",
        expired_x!(),
        ")"
    ))
    .bind(&w.tenants)
    .bind(&w.finished_secs)
    .bind(&w.waiting_secs)
    .bind(threads)
    .fetch_all(&mut *conn)
    .await?)
}

/// Runs (locked by the caller) with their tool calls and iteration timings.
async fn delete_runs(
    conn: &mut PgConnection,
    ids: &[Uuid],
    removed: &mut Removed,
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    removed.tool_calls += sqlx::query("DELETE FROM tool_calls WHERE run_id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    removed.iterations += sqlx::query("DELETE FROM iterations WHERE run_id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    removed.runs += sqlx::query("DELETE FROM runs WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(())
}

/// Batches that finished past the window and have no run left, with their items.
async fn remove_batches(
    conn: &mut PgConnection,
    w: &Windows,
    removed: &mut Removed,
) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = sqlx::query_scalar(concat!(
        "WITH ",
        windows_cte!(),
        "
         SELECT b.id FROM batches b WHERE b.id IN (
             SELECT c.id FROM t CROSS JOIN LATERAL (
                 SELECT b.id FROM batches b
                 WHERE b.tenant_id = t.tenant_id AND b.created_at < t.finished_before
                   AND b.finished_at < t.finished_before
                   AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.batch_id = b.id)
                 ORDER BY b.created_at LIMIT $4) c
             WHERE t.finished_before IS NOT NULL
             LIMIT $4)
         FOR UPDATE SKIP LOCKED"
    ))
    .bind(&w.tenants)
    .bind(&w.finished_secs)
    .bind(&w.waiting_secs)
    .bind(BATCHES_PER_BATCH)
    .fetch_all(&mut *conn)
    .await?;
    if ids.is_empty() {
        return Ok(());
    }
    if ids.len() as i64 >= BATCHES_PER_BATCH {
        removed.more = true;
    }
    removed.batches += sqlx::query("DELETE FROM batches WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(())
}

/// Webhook deliveries delivered or given up, made before the window: every one is about a
/// change older than the window. Pending ones are still being tried (`webhooks.retry_for_ms`).
async fn remove_deliveries(
    conn: &mut PgConnection,
    w: &Windows,
    bounds: Bounds,
    removed: &mut Removed,
) -> Result<(), StoreError> {
    let n = sqlx::query(concat!(
        "WITH ",
        windows_cte!(),
        ",
         doomed AS (
            SELECT d.id FROM t
            JOIN webhook_endpoints e ON e.tenant_id = t.tenant_id
            CROSS JOIN LATERAL (
                SELECT d.id FROM webhook_deliveries d
                WHERE d.endpoint_id = e.id AND d.created_at < t.finished_before
                  AND d.status <> 'pending'
                ORDER BY d.created_at LIMIT $4) d
            WHERE t.finished_before IS NOT NULL
            LIMIT $4)
         DELETE FROM webhook_deliveries
         WHERE id IN (SELECT id FROM webhook_deliveries
                      WHERE id IN (SELECT id FROM doomed) AND status <> 'pending'
                      FOR UPDATE SKIP LOCKED)"
    ))
    .bind(&w.tenants)
    .bind(&w.finished_secs)
    .bind(&w.waiting_secs)
    .bind(bounds.runs)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n as i64 >= bounds.runs {
        removed.more = true;
    }
    removed.webhook_deliveries += n;
    Ok(())
}

/// The fleet's removal schedule (`retention_state`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The next batch is due then (any worker's).
    pub next_batch_at: DateTime<Utc>,
    /// When a pass last found nothing more to remove.
    pub last_pass_at: DateTime<Utc>,
    /// Runs past their window when the current pass began (0 once a pass completes); counted up
    /// to [`BACKLOG_CAP`].
    pub backlog: i64,
    /// The database's clock when this was read.
    pub now: DateTime<Utc>,
}

impl Schedule {
    /// How long until the next batch is due (zero if it is).
    pub fn wait(&self) -> Duration {
        (self.next_batch_at - self.now).to_std().unwrap_or_default()
    }
}

/// What one [`attempt`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attempt {
    /// Another process holds the election now (running a batch).
    NotElected(Schedule),
    /// Elected, but the next batch is not due yet.
    NotDue(Schedule),
    /// Elected and due, but runnable runs wait for workers: removal paused.
    Yielded(Schedule),
    /// A batch ran. `took`: its time in the database.
    Batch {
        removed: Removed,
        took: Duration,
        schedule: Schedule,
    },
}

async fn schedule(conn: &mut PgConnection) -> Result<(Schedule, bool), StoreError> {
    let (next_batch_at, last_pass_at, backlog, now, in_pass): (
        DateTime<Utc>,
        DateTime<Utc>,
        i64,
        DateTime<Utc>,
        bool,
    ) = sqlx::query_as(
        "SELECT next_batch_at, last_pass_at, backlog, now(), pass_started_at IS NOT NULL
         FROM retention_state",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((
        Schedule {
            next_batch_at,
            last_pass_at,
            backlog,
            now,
        },
        in_pass,
    ))
}

/// The next batch, if this caller wins the election and one is due: of all workers, the one
/// that takes a transaction-scoped advisory lock runs it, in the same transaction, and records
/// when the next one is due (`retention.duty_percent`, `retention.slow_batch_ms`, or
/// `retention.interval_ms` once nothing is left), so the pacing holds for the whole fleet. The
/// lock ends with the transaction: a stopped or partitioned worker never blocks removal.
pub async fn attempt(pool: &PgPool, settings: &RetentionSettings) -> Result<Attempt, StoreError> {
    let mut tx = pool.begin().await?;
    set_lock_timeout(&mut tx, settings.lock_timeout_ms).await?;
    let (elected,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1)")
        .bind(RETENTION_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    let (mut sched, in_pass) = schedule(&mut tx).await?;
    if !elected {
        tx.commit().await?;
        return Ok(Attempt::NotElected(sched));
    }
    if sched.now < sched.next_batch_at {
        tx.commit().await?;
        return Ok(Attempt::NotDue(sched));
    }
    if settings.yield_runnable_age_ms > 0 {
        // The oldest runnable run, through `runs_queued_since`: one index probe.
        let waited: Option<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM now() - min(enqueued_at))::float8
             FROM runs WHERE status = 'queued' AND NOT held",
        )
        .fetch_one(&mut *tx)
        .await?;
        if waited.is_some_and(|s| s * 1000.0 >= settings.yield_runnable_age_ms as f64) {
            sched.next_batch_at = reschedule(&mut tx, settings.yield_pause()).await?;
            tx.commit().await?;
            return Ok(Attempt::Yielded(sched));
        }
    }
    let started = Instant::now();
    let w = windows(&mut tx, &settings.windows()).await?;
    if !in_pass {
        let n = backlog(&mut tx, &w).await?;
        sqlx::query("UPDATE retention_state SET pass_started_at = now(), backlog = $1")
            .bind(n)
            .execute(&mut *tx)
            .await?;
        sched.backlog = n;
    }
    let removed = remove_batch(&mut tx, &w, Bounds::of(settings)).await?;
    let took = started.elapsed();
    if removed.more {
        sched.next_batch_at = reschedule(&mut tx, settings.pause_after(took)).await?;
    } else {
        let (next, last): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
            "UPDATE retention_state
             SET pass_started_at = NULL, backlog = 0, last_pass_at = now(),
                 next_batch_at = now() + make_interval(secs => $1)
             RETURNING next_batch_at, last_pass_at",
        )
        .bind(settings.interval().as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
        sched.next_batch_at = next;
        sched.last_pass_at = last;
        sched.backlog = 0;
    }
    tx.commit().await?;
    Ok(Attempt::Batch {
        removed,
        took,
        schedule: sched,
    })
}

async fn reschedule(conn: &mut PgConnection, after: Duration) -> Result<DateTime<Utc>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE retention_state SET next_batch_at = now() + make_interval(secs => $1)
         RETURNING next_batch_at",
    )
    .bind(after.as_secs_f64())
    .fetch_one(&mut *conn)
    .await?)
}

/// Everything due now, batch after batch (each its own transaction), regardless of the election
/// and the pacing: for tests and tools. Stops when a batch finds nothing more, or after
/// [`MAX_BATCHES`].
pub async fn remove_due(
    pool: &PgPool,
    settings: &RetentionSettings,
) -> Result<Removed, StoreError> {
    let mut total = Removed::default();
    for _ in 0..MAX_BATCHES {
        let mut tx = pool.begin().await?;
        set_lock_timeout(&mut tx, settings.lock_timeout_ms).await?;
        let w = windows(&mut tx, &settings.windows()).await?;
        let removed = remove_batch(&mut tx, &w, Bounds::of(settings)).await?;
        tx.commit().await?;
        total.add(&removed);
        if !removed.more {
            break;
        }
    }
    Ok(total)
}
