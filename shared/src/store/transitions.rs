//! The run state machine: one function per transition of a run's lifecycle (docs/architecture.md).
//!
//! ```text
//! queued -> running -> completed | failed | cancelled
//! running -> waiting_for_input | waiting_for_confirmation
//! waiting_* -> queued                    (resume)
//! waiting_* | queued | running -> cancelled
//! running -> queued                      (drain, or lease expired after a crash)
//! running -> running                     (quarantine: this attempt runs alone in its worker)
//! ```
//! Worker-side transitions take a [`Fence`] and succeed only while that attempt holds the run.

use std::time::Duration;

use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::runs::RunRow;
use super::turns::{IterationTiming, timing_param};
use super::{Fence, StoreError, is_unique_violation, lock_fenced, messages};
use crate::domain::{AgentSpec, RunStatus};

#[derive(Clone)]
pub struct NewRun {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// Continue this thread; a new thread is made when absent.
    pub thread_id: Option<Uuid>,
    pub agent: AgentSpec,
    pub max_iterations: i32,
    pub metadata: Value,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<Vec<u8>>,
    pub input: String,
    /// Its tenant has a running limit (or the run is one of a batch under the fair share): the
    /// run is created held, for [`super::fair_dispatch`] to dispatch in turn (and not published
    /// by its creator).
    pub fair: bool,
    /// The fair share, when on: the run is created held only if its tenant's window is full or
    /// the tenant has held runs already (`fair_share_room`, migration 0031), and whoever ends it
    /// dispatches its tenant's next.
    pub share: Option<crate::domain::FairShare>,
    /// W3C `traceparent` of the creating request (`runs.traceparent`); every attempt joins it.
    pub traceparent: Option<String>,
}

impl NewRun {
    /// A run of `tenant` on a new thread, for the store's tests: model `m`, input `hi`.
    #[cfg(test)]
    pub(crate) fn for_test(tenant_id: Uuid) -> NewRun {
        NewRun {
            id: Uuid::now_v7(),
            tenant_id,
            thread_id: None,
            agent: serde_json::from_value(serde_json::json!({"model": "m"})).expect("agent"),
            max_iterations: 3,
            metadata: serde_json::json!({}),
            idempotency_key: None,
            request_hash: None,
            input: "hi".into(),
            fair: false,
            share: None,
            traceparent: None,
        }
    }
}

/// `-> queued`: the thread (if new), the user's message and the run, in one transaction.
pub async fn create(conn: &mut PgConnection, new: NewRun) -> Result<RunRow, StoreError> {
    let thread_id = match new.thread_id {
        Some(id) => {
            // Locking the thread serializes run creation on it, so the active-run check below
            // cannot race (the unique index stays as the last line of defence).
            let owned: Option<(Uuid,)> = sqlx::query_as(
                "SELECT id FROM threads WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
            )
            .bind(id)
            .bind(new.tenant_id)
            .fetch_optional(&mut *conn)
            .await?;
            owned.ok_or(StoreError::NotFound)?;
            let active: Option<(Uuid,)> = sqlx::query_as(
                "SELECT id FROM runs WHERE thread_id = $1 AND status IN
                 ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                  'waiting_for_tasks', 'waiting_for_slot')",
            )
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
            if let Some((run_id,)) = active {
                return Err(StoreError::ThreadBusy {
                    thread_id: id,
                    run_id,
                });
            }
            id
        }
        None => {
            let id = Uuid::now_v7();
            sqlx::query("INSERT INTO threads (id, tenant_id) VALUES ($1, $2)")
                .bind(id)
                .bind(new.tenant_id)
                .execute(&mut *conn)
                .await?;
            id
        }
    };
    let inserted = insert_run(&mut *conn, RUN_ON_THREAD, &new, thread_id).await;
    let run = match inserted {
        Ok(run) => run,
        Err(e) if is_unique_violation(&e, "runs_one_active_per_thread") => {
            // The transaction is aborted now, so the holder cannot be looked up here.
            return Err(StoreError::ThreadBusy {
                thread_id,
                run_id: Uuid::nil(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    Ok(run)
}

/// The run and its user message, as CTEs of one statement (parameters $1..$14). Held: by a
/// running limit ($10), or by the fair share ($12..$14, `fair_share_window`'s arguments) when
/// its tenant's window is full.
macro_rules! run_and_message {
    () => {
        "run AS (
            INSERT INTO runs (id, tenant_id, thread_id, status, agent, metadata,
                              idempotency_key, request_hash, max_iterations, held, fair,
                              traceparent)
            VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, $8,
                    $10 OR CASE WHEN $12 > 0
                                THEN fair_share_room($2, fair_share_window($12, $13, $14)) = 0
                                ELSE false END,
                    $10 OR $12 > 0, $11)
            RETURNING *),
         message AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
            VALUES ($3, $1, 'user', true, $9))
         SELECT * FROM run"
    };
}

/// On an existing thread.
const RUN_ON_THREAD: &str = concat!("WITH ", run_and_message!());

/// On a thread created by the same statement.
const RUN_ON_NEW_THREAD: &str = concat!(
    "WITH thread AS (INSERT INTO threads (id, tenant_id) VALUES ($3, $2)), ",
    run_and_message!()
);

/// Runs one of the statements above; both take the same parameters $1..$14 (so does the
/// waiting run's insert of `store::double_text`).
pub(crate) async fn insert_run<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    sql: &'static str,
    new: &NewRun,
    thread_id: Uuid,
) -> Result<RunRow, sqlx::Error> {
    let share = super::fair_dispatch::share_args(new.share);
    sqlx::query_as::<_, RunRow>(sql)
        .bind(new.id)
        .bind(new.tenant_id)
        .bind(thread_id)
        .bind(Json(&new.agent))
        .bind(Json(&new.metadata))
        .bind(&new.idempotency_key)
        .bind(&new.request_hash)
        .bind(new.max_iterations)
        .bind(Json(messages::user_body(&new.input)))
        .bind(new.fair)
        .bind(&new.traceparent)
        .bind(share.0)
        .bind(share.1)
        .bind(share.2)
        .fetch_one(executor)
        .await
}

/// `-> queued` on a new thread: the thread, the run and its user message in one statement,
/// so the common case of `POST /v1/runs` costs Postgres one round trip and one commit instead
/// of five (BEGIN, three INSERTs, COMMIT). Foreign keys are checked at the statement's end,
/// when all three rows exist.
pub async fn create_on_new_thread<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    new: NewRun,
) -> Result<RunRow, StoreError> {
    debug_assert!(new.thread_id.is_none());
    let thread_id = Uuid::now_v7();
    let run = insert_run(executor, RUN_ON_NEW_THREAD, &new, thread_id).await?;
    Ok(run)
}

/// A claim that took the run.
#[derive(Debug)]
pub struct Claimed {
    pub run: RunRow,
    /// The previous holder died (or was drained) mid-iteration: clients must drop its partial
    /// deltas, and the interrupted iteration is redone from the last committed state.
    pub recovered: bool,
    /// The run's lease had expired: its holder vanished and this claim took it over.
    pub took_over: bool,
    /// The attempt taken over held the run alone in quarantine ([`quarantine`]): its worker
    /// died running nothing else, so the run is the cause (poison).
    pub crashed_alone: bool,
    /// Prompt + completion tokens of the run's tenant this UTC day, as the claim found them:
    /// with the run's own counters, what the budget check needs before the first model call.
    pub tenant_tokens_today: i64,
    /// The tenant's own `tokens_per_day` (`tenants.limits`), as stored; `None`: the default.
    pub tenant_tokens_per_day: Option<Json<serde_json::Value>>,
    /// For a run that has not begun its first iteration, the thread's history as the model
    /// will see it (`messages::llm_history`), read by the claim itself: one statement and one
    /// round trip less per run than reading it after. `None` for a run that continues: its
    /// open calls are settled first, and the history is read after them (read now, their
    /// missing results would be "repaired" before they are recorded).
    pub history: Option<Vec<serde_json::Value>>,
}

impl Claimed {
    pub fn fence(&self) -> Fence {
        Fence {
            run_id: self.run.id,
            attempt: self.run.attempt,
        }
    }
}

/// `queued -> running`, or `running (lease expired) -> running` under a new attempt.
/// One conditional UPDATE; `None` means the message was stale or a duplicate.
pub async fn claim(
    pool: &PgPool,
    run_id: Uuid,
    owner: &str,
    lease: Duration,
) -> Result<Option<Claimed>, StoreError> {
    let mut claimed = claim_many(pool, &[run_id], owner, lease).await?;
    Ok(claimed.pop().flatten())
}

/// [`claim`] for several runs in one statement (a worker whose slots free up together);
/// per run, in order, its claim. The rows are locked in id order, so two groups that share a
/// run (a duplicate message) wait for each other instead of deadlocking.
pub async fn claim_many<'e>(
    db: impl sqlx::PgExecutor<'e>,
    run_ids: &[Uuid],
    owner: &str,
    lease: Duration,
) -> Result<Vec<Option<Claimed>>, StoreError> {
    let rows = sqlx::query_as::<_, ClaimRow>(
        "WITH prev AS (
            SELECT id, status, interrupted, held, attempt, quarantine_attempt
              FROM runs WHERE id = ANY($1) ORDER BY id FOR UPDATE)
         UPDATE runs r SET
             status = 'running',
             attempt = r.attempt + 1,
             recoveries = r.recoveries + (prev.status = 'running')::int,
             interrupted = false,
             lease_owner = $2,
             lease_expires_at = now() + make_interval(secs => $3),
             started_at = coalesce(r.started_at, now()),
             updated_at = now()
         FROM prev
         WHERE r.id = prev.id
           AND ((prev.status = 'queued' AND NOT prev.held)
                OR (prev.status = 'running' AND r.lease_expires_at < now()))
         RETURNING r.*, (prev.status = 'running' OR prev.interrupted) AS recovered,
             (prev.status = 'running') AS took_over,
             (prev.status = 'running' AND prev.quarantine_attempt IS NOT DISTINCT FROM prev.attempt)
                 AS crashed_alone,
             coalesce((SELECT u.prompt_tokens + u.completion_tokens FROM usage_days u
                       WHERE u.tenant_id = r.tenant_id
                         AND u.day = (now() AT TIME ZONE 'UTC')::date), 0) AS tenant_tokens_today,
             (SELECT ten.limits -> 'tokens_per_day' FROM tenants ten WHERE ten.id = r.tenant_id)
                 AS tenant_tokens_per_day,
             CASE WHEN r.iteration = 0 THEN
               (SELECT coalesce(jsonb_agg(m.body ORDER BY m.id), '[]'::jsonb) FROM messages m
                 WHERE m.thread_id = r.thread_id AND m.is_llm_message) END AS history",
    )
    .bind(run_ids)
    .bind(owner)
    .bind(lease.as_secs_f64())
    .fetch_all(db)
    .await?;
    let mut by_id: std::collections::HashMap<Uuid, ClaimRow> =
        rows.into_iter().map(|r| (r.run.id, r)).collect();
    Ok(run_ids
        .iter()
        .map(|id| {
            by_id.remove(id).map(|r| Claimed {
                recovered: r.recovered,
                took_over: r.took_over,
                crashed_alone: r.crashed_alone,
                run: r.run,
                tenant_tokens_today: r.tenant_tokens_today,
                tenant_tokens_per_day: r.tenant_tokens_per_day,
                history: r.history.map(|h| super::messages::repair_tool_results(h.0)),
            })
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    #[sqlx(flatten)]
    run: RunRow,
    recovered: bool,
    took_over: bool,
    crashed_alone: bool,
    tenant_tokens_today: i64,
    tenant_tokens_per_day: Option<Json<serde_json::Value>>,
    history: Option<Json<Vec<serde_json::Value>>>,
}

/// What a lease renewal learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    Held,
    /// Held, and a cancel was requested.
    CancelRequested,
    /// Held, and `if_busy = interrupt` asked for the run to end at its next safe point.
    InterruptRequested,
}

/// Extends the leases of many held runs in one statement (a worker renews all its runs each
/// `worker.lease_renew_ms`: one statement a tick instead of one a run). A row another statement
/// has locked right now (a grouped commit of the same run) is skipped rather than waited for:
/// waiting could deadlock with a group that locks the same rows in another order, and the
/// next tick renews it. Per fence, in order: its renewal, `None` if skipped while still held,
/// or `LeaseLost` if the fence no longer holds.
pub async fn renew_leases(
    pool: &PgPool,
    fences: &[Fence],
    lease: Duration,
) -> Result<Vec<Result<Option<Lease>, StoreError>>, StoreError> {
    if fences.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = fences.iter().map(|f| f.run_id).collect();
    let attempts: Vec<i32> = fences.iter().map(|f| f.attempt).collect();
    let renewed: Vec<(Uuid, i32, bool, bool)> = sqlx::query_as(
        "WITH held AS (
            SELECT r.id FROM runs r
              JOIN UNNEST($1::uuid[], $2::int[]) AS h(id, attempt)
                ON r.id = h.id AND r.attempt = h.attempt
             WHERE r.id = ANY($1) AND r.status = 'running'
               FOR UPDATE OF r SKIP LOCKED)
         UPDATE runs r SET lease_expires_at = now() + make_interval(secs => $3)
           FROM held WHERE r.id = held.id
         RETURNING r.id, r.attempt, r.cancel_requested_at IS NOT NULL,
                   r.interrupt_requested_at IS NOT NULL",
    )
    .bind(&ids)
    .bind(&attempts)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?;
    let renewed: std::collections::HashMap<(Uuid, i32), Lease> = renewed
        .into_iter()
        .map(|(id, attempt, cancel, interrupt)| {
            let lease = match (cancel, interrupt) {
                (true, _) => Lease::CancelRequested,
                (false, true) => Lease::InterruptRequested,
                (false, false) => Lease::Held,
            };
            ((id, attempt), lease)
        })
        .collect();
    let unrenewed: Vec<Fence> = fences
        .iter()
        .filter(|f| !renewed.contains_key(&(f.run_id, f.attempt)))
        .copied()
        .collect();
    // Skipped (locked) or lost: the fences that still hold, read without a lock.
    let still_held: std::collections::HashSet<(Uuid, i32)> = if unrenewed.is_empty() {
        Default::default()
    } else {
        let ids: Vec<Uuid> = unrenewed.iter().map(|f| f.run_id).collect();
        let attempts: Vec<i32> = unrenewed.iter().map(|f| f.attempt).collect();
        let rows: Vec<(Uuid, i32)> = sqlx::query_as(
            "SELECT r.id, r.attempt FROM runs r
               JOIN UNNEST($1::uuid[], $2::int[]) AS h(id, attempt)
                 ON r.id = h.id AND r.attempt = h.attempt
              WHERE r.id = ANY($1) AND r.status = 'running'",
        )
        .bind(&ids)
        .bind(&attempts)
        .fetch_all(pool)
        .await?;
        rows.into_iter().collect()
    };
    Ok(fences
        .iter()
        .map(|f| match renewed.get(&(f.run_id, f.attempt)) {
            Some(lease) => Ok(Some(*lease)),
            None if still_held.contains(&(f.run_id, f.attempt)) => Ok(None),
            None => Err(f.lost()),
        })
        .collect())
}

/// The end of a holding that needs no other write: `running -> completed | cancelled`, with
/// the last iteration's timing. Owned: it may wait to be written with other runs' ends (see
/// [`super::group_commit`]).
pub struct Ending {
    pub fence: Fence,
    pub status: RunStatus,
    pub last_event_id: u64,
    pub timing: Option<IterationTiming>,
}

/// What ending one holding did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The fence held: the run ended.
    pub held: bool,
    /// The thread's next waiting run (double-texting), promoted to `queued` by the end's
    /// trigger in the same transaction: the ender publishes it.
    pub promoted: Option<Uuid>,
}

/// Ends holdings of several runs in one statement; per ending, whether its fence held and
/// which waiting run of its thread it promoted. The `LATERAL` probe reads the statement's
/// snapshot (before the trigger promotes): one lookup per ended run in an index that is empty
/// unless a tenant double-texts.
pub async fn end_many<'e>(
    db: impl sqlx::PgExecutor<'e>,
    endings: &[Ending],
) -> Result<Vec<Ended>, StoreError> {
    let held: Vec<(Uuid, Option<Uuid>)> = sqlx::query_as(concat!(
        "WITH input AS (
            SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::text[], $4::int8[], $5::jsonb[])
                AS t(run_id, attempt, status, last_event_id, timing)),
         held AS (
            UPDATE runs r SET status = t.status, error = NULL, lease_owner = NULL,
                              lease_expires_at = NULL, finished_at = now(), updated_at = now(),
                              last_event_id = GREATEST(r.last_event_id, t.last_event_id)
            FROM input t
            WHERE r.id = ANY($1) AND r.id = t.run_id AND r.attempt = t.attempt
              AND r.status = $6
            RETURNING r.id, r.thread_id),
         ",
        timing_cte!(),
        "
         SELECT h.id, w.id FROM held h
         LEFT JOIN LATERAL (
            SELECT id FROM runs w WHERE w.thread_id = h.thread_id
               AND w.status = 'waiting_for_thread'
             ORDER BY w.enqueued_at, w.id LIMIT 1) w ON true",
    ))
    .bind(endings.iter().map(|e| e.fence.run_id).collect::<Vec<_>>())
    .bind(endings.iter().map(|e| e.fence.attempt).collect::<Vec<_>>())
    .bind(
        endings
            .iter()
            .map(|e| e.status.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        endings
            .iter()
            .map(|e| e.last_event_id as i64)
            .collect::<Vec<_>>(),
    )
    .bind(
        endings
            .iter()
            .map(|e| timing_param(e.timing.as_ref()))
            .collect::<Vec<_>>(),
    )
    .bind(super::RUNNING)
    .fetch_all(db)
    .await?;
    Ok(endings
        .iter()
        .map(|e| {
            let found = held.iter().find(|(id, _)| *id == e.fence.run_id);
            Ended {
                held: found.is_some(),
                promoted: found.and_then(|(_, next)| *next),
            }
        })
        .collect())
}

/// `running -> completed`.
pub async fn complete(pool: &PgPool, fence: Fence, last_event_id: u64) -> Result<(), StoreError> {
    let status = RunStatus::Completed;
    let timing = None;
    end(
        pool,
        Ending {
            fence,
            status,
            last_event_id,
            timing,
        },
    )
    .await
}

/// Ends one holding (see [`end_many`]).
pub async fn end(pool: &PgPool, ending: Ending) -> Result<(), StoreError> {
    let fence = ending.fence;
    let ended = end_many(pool, std::slice::from_ref(&ending)).await?;
    if !ended.first().is_some_and(|e| e.held) {
        return Err(fence.lost());
    }
    Ok(())
}

/// `running -> failed`, with a machine-readable code and a message. Calls of the run left
/// without a result get one (`failed`/`skipped`), so the thread stays valid for the next run.
pub async fn fail(
    pool: &PgPool,
    fence: Fence,
    code: &str,
    message: &str,
    last_event_id: u64,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    lock_fenced(&mut tx, fence).await?;
    let (thread_id,): (Uuid,) = sqlx::query_as("SELECT thread_id FROM runs WHERE id = $1")
        .bind(fence.run_id)
        .fetch_one(&mut *tx)
        .await?;
    close_unanswered_calls(&mut tx, fence.run_id, thread_id, "the run failed").await?;
    let error = serde_json::json!({"code": code, "message": message});
    sqlx::query(
        "UPDATE runs SET status = 'failed', error = $2, lease_owner = NULL, lease_expires_at = NULL,
                         finished_at = now(), updated_at = now(),
                         last_event_id = GREATEST(last_event_id, $3)
         WHERE id = $1",
    )
    .bind(fence.run_id)
    .bind(Json(error))
    .bind(last_event_id as i64)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Gives every call of `run` that has no result one: a call in flight is `failed` (its outcome
/// is unknown), a call not started is `skipped`; each gets a tool message saying why. A
/// provider refuses a history with an assistant `tool_calls` message lacking any result.
pub async fn close_unanswered_calls(
    conn: &mut PgConnection,
    run: Uuid,
    thread: Uuid,
    why: &str,
) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "WITH closed AS (
            UPDATE tool_calls
               SET status = CASE WHEN status = 'running' THEN 'failed' ELSE 'skipped' END,
                   error = CASE WHEN status = 'running'
                                THEN $3 || ' while the call was in flight; its outcome is unknown'
                                ELSE $3 || ' before the call ran' END,
                   finished_at = now()
             WHERE run_id = $1
               AND status IN ('pending', 'awaiting_confirmation', 'approved', 'awaiting_input', 'running')
             RETURNING tool_call_id, iteration, position, error)
         INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, iteration)
         SELECT $2, $1, 'tool', true,
                jsonb_build_object('role', 'tool', 'tool_call_id', tool_call_id,
                                   'content', jsonb_build_object('error', error)::text),
                iteration
           FROM closed ORDER BY iteration, position",
    )
    .bind(run)
    .bind(thread)
    .bind(why)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// `running -> waiting_for_input | waiting_for_confirmation`, releasing the lease. The pending
/// item is what `GET /v1/runs/{id}` shows and what a resume must settle.
pub async fn wait(
    conn: &mut PgConnection,
    fence: Fence,
    status: RunStatus,
    pending: &Value,
    last_event_id: u64,
) -> Result<(), StoreError> {
    debug_assert!(status.is_waiting());
    lock_fenced(conn, fence).await?;
    sqlx::query(
        "UPDATE runs SET status = $2, pending = $3, lease_owner = NULL, lease_expires_at = NULL,
                         updated_at = now(), last_event_id = GREATEST(last_event_id, $4)
         WHERE id = $1",
    )
    .bind(fence.run_id)
    .bind(status.as_str())
    .bind(Json(pending))
    .bind(last_event_id as i64)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// `running -> queued`: a draining worker hands the run back. This spends no recovery: the
/// holder left cleanly. `interrupted` says an iteration was cut short.
pub async fn release(
    pool: &PgPool,
    fence: Fence,
    interrupted: bool,
    last_event_id: u64,
) -> Result<(), StoreError> {
    release_counted(pool, fence, interrupted, false, last_event_id)
        .await
        .map(|_| ())
}

/// `running -> queued` after a failure while the run was held (a database error): like
/// [`release`], and counted. Returns the run's hand-backs so far, this one included.
pub async fn hand_back_after_failure(
    pool: &PgPool,
    fence: Fence,
    last_event_id: u64,
) -> Result<i32, StoreError> {
    release_counted(pool, fence, true, true, last_event_id).await
}

async fn release_counted(
    pool: &PgPool,
    fence: Fence,
    interrupted: bool,
    counted: bool,
    last_event_id: u64,
) -> Result<i32, StoreError> {
    let row: Option<(i32,)> = sqlx::query_as(concat!(
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
                         interrupted = $3, updated_at = now(), enqueued_at = now(), last_event_id = GREATEST(last_event_id, $4),
                         handbacks = handbacks + $5::int
         WHERE ",
        held!(),
        " RETURNING handbacks",
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(interrupted)
    .bind(last_event_id as i64)
    .bind(i32::from(counted))
    .fetch_optional(pool)
    .await?;
    row.map(|(n,)| n).ok_or(fence.lost())
}

/// The outcome of a cancel request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// The run is now cancelled (it was queued, waiting or running).
    Now {
        previous: RunStatus,
        attempt: i32,
        thread_id: Uuid,
        /// The last event id recorded for the run before the cancel.
        last_event_id: i64,
        /// A plan-and-solve planner's unfinished tasks, cancelled with it.
        tasks: Vec<CancelledTask>,
    },
    /// It was already cancelled: repeating a cancel is harmless.
    Already,
}

/// A planner's task cancelled with it, to announce as its own cancel.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CancelledTask {
    pub id: Uuid,
    pub previous: RunStatus,
    pub thread_id: Uuid,
    pub last_event_id: i64,
}

/// `queued | waiting_* | running -> cancelled`. Postgres decides at once; a worker holding the
/// run finds its fence gone at its next write and its stream fenced off (the caller appends
/// `run_cancelled` with the final fence), and the control hint makes it stop within a second.
pub async fn cancel(pool: &PgPool, tenant: Uuid, run_id: Uuid) -> Result<Cancelled, StoreError> {
    let mut tx = pool.begin().await?;
    // A planner's unfinished tasks are locked before the planner: a task's end locks its
    // planner's row after its own (trigger `runs_task_ended`), so this order cannot deadlock
    // with it. A run that is no task's planner finds none (one probe of `runs_tasks`).
    lock_tasks(&mut tx, run_id).await?;
    let row: Option<(String, i32, Uuid, i64)> = sqlx::query_as(
        "SELECT status, attempt, thread_id, last_event_id FROM runs
         WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
    )
    .bind(run_id)
    .bind(tenant)
    .fetch_optional(&mut *tx)
    .await?;
    let (status, attempt, thread_id, last_event_id) = row.ok_or(StoreError::NotFound)?;
    let status = RunStatus::parse(&status).expect("known status");
    match status {
        RunStatus::Cancelled => return Ok(Cancelled::Already),
        s if s.is_final() => {
            return Err(StoreError::WrongStatus {
                run_id,
                status: s.to_string(),
            });
        }
        _ => {}
    }
    // Calls in flight are abandoned (their outcome is unknown: the tool may still finish
    // them); calls waiting for a decision will never run. Each gets a tool result, so the
    // thread stays valid for the next run. Before the status changes: the change promotes
    // the thread's next waiting run, whose user message must follow these results.
    close_unanswered_calls(&mut tx, run_id, thread_id, "the run was cancelled").await?;
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', cancel_requested_at = now(), pending = NULL,
                         lease_owner = NULL, lease_expires_at = NULL, held = false,
                         queued_input = NULL, finished_at = now(), updated_at = now(),
                         cancelled_from = $2
         WHERE id = $1",
    )
    .bind(run_id)
    .bind(status.as_str())
    .execute(&mut *tx)
    .await?;
    // The planner is cancelled first, so the tasks' ends make nothing runnable. Tasks a round
    // commit created while this waited for the planner's row are locked now.
    let mut tasks = Vec::new();
    for task in lock_tasks(&mut tx, run_id).await? {
        close_unanswered_calls(&mut tx, task.id, task.thread_id, "the run was cancelled").await?;
        sqlx::query(
            "UPDATE runs SET status = 'cancelled', cancel_requested_at = now(), pending = NULL,
                             lease_owner = NULL, lease_expires_at = NULL, held = false,
                             finished_at = now(), updated_at = now(), cancelled_from = status
             WHERE id = $1",
        )
        .bind(task.id)
        .execute(&mut *tx)
        .await?;
        tasks.push(task);
    }
    tx.commit().await?;
    Ok(Cancelled::Now {
        previous: status,
        attempt,
        thread_id,
        last_event_id,
        tasks,
    })
}

/// Locks the unfinished tasks of the planner `run_id`, in id order.
async fn lock_tasks(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<CancelledTask>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, status AS previous, thread_id, last_event_id FROM runs
         WHERE parent_run_id = $1 AND status NOT IN ('completed', 'failed', 'cancelled')
         ORDER BY id FOR UPDATE",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await?)
}

/// `running -> running` under the same attempt: the holder has emptied its worker and runs
/// the run alone in quarantine (it was taken over more than `worker.max_recoveries` times).
/// Recorded before the run goes on, so that a claim taking this attempt over knows the run
/// crashed a worker it had to itself ([`Claimed::crashed_alone`]). `quarantined_at` keeps the
/// first time.
pub async fn quarantine(pool: &PgPool, fence: Fence) -> Result<(), StoreError> {
    let done = sqlx::query(concat!(
        "UPDATE runs SET quarantined_at = coalesce(quarantined_at, now()),
                         quarantine_attempt = attempt, updated_at = now()
         WHERE ",
        held!()
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .execute(pool)
    .await?;
    if done.rows_affected() == 0 {
        return Err(fence.lost());
    }
    Ok(())
}

/// `running -> failed` by the claim that took over the run's quarantine attempt: the run
/// crashed (or lost) a worker that held nothing else. Returns the message, which its
/// tenant sees: it names no worker.
pub async fn fail_poisoned(
    pool: &PgPool,
    fence: Fence,
    recoveries: i32,
    last_event_id: u64,
) -> Result<String, StoreError> {
    let message = format!(
        "the run was taken over {recoveries} times after its worker stopped responding, the \
         last time while it ran alone in quarantine; it is presumed to crash its worker and \
         was failed"
    );
    fail(pool, fence, "poison_run", &message, last_event_id).await?;
    Ok(message)
}

/// What a resume brings.
#[derive(Debug, Clone)]
pub enum ResumeInput {
    /// The answer to the run's question.
    Answer(String),
    /// A decision for every call awaiting confirmation.
    Decisions(Vec<Decision>),
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub tool_call_id: String,
    pub approve: bool,
    pub reason: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("run not found")]
    NotFound,
    #[error("run is {0}, not waiting")]
    NotWaiting(RunStatus),
    #[error("the run is waiting for {expected}")]
    WrongInput { expected: &'static str },
    #[error("pending tool calls without a decision: {0:?}")]
    MissingDecisions(Vec<String>),
    #[error("tool calls not awaiting a decision: {0:?}")]
    UnknownToolCalls(Vec<String>),
    #[error("a tool call was decided twice: {0}")]
    DuplicateDecision(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ResumeError {
    fn from(e: sqlx::Error) -> ResumeError {
        ResumeError::Store(StoreError::Db(e))
    }
}

/// The run after a resume, and the attempt that paused it.
pub struct Resumed {
    pub run: RunRow,
    pub paused_attempt: i32,
    pub pending: Value,
}

/// `waiting_* -> queued`: records the answer (a tool result for `ask`, then a user message;
/// after a budget pause, only the user message) or the decisions (who decided, when, why; rejected calls get their tool result now), all
/// in one transaction under the run's row lock, so concurrent resumes cannot both succeed.
pub async fn resume(
    pool: &PgPool,
    tenant: Uuid,
    run_id: Uuid,
    input: ResumeInput,
    decided_by: Uuid,
) -> Result<Resumed, ResumeError> {
    let mut tx = pool.begin().await?;
    let run = sqlx::query_as::<_, RunRow>(
        "SELECT * FROM runs WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
    )
    .bind(run_id)
    .bind(tenant)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(ResumeError::NotFound)?;
    let pending = run
        .pending
        .as_ref()
        .map(|p| p.0.clone())
        .unwrap_or(Value::Null);
    let iteration = run.iteration;
    match (run.status, input) {
        // Paused on the tenant's token budget: no tool call waits for a result, the input is
        // the next user message. The worker checks the budget again before its model call.
        (RunStatus::WaitingForInput, ResumeInput::Answer(text))
            if pending.get("kind").and_then(Value::as_str) == Some("budget") =>
        {
            messages::insert_user(&mut tx, run.thread_id, run_id, &text).await?;
        }
        (RunStatus::WaitingForInput, ResumeInput::Answer(text)) => {
            let call_id = pending
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let result = serde_json::json!({"answer": text});
            sqlx::query(
                "UPDATE tool_calls SET decided_by = $3, decided_at = now() WHERE run_id = $1 AND tool_call_id = $2",
            )
            .bind(run_id)
            .bind(&call_id)
            .bind(decided_by)
            .execute(&mut *tx)
            .await?;
            super::tool_calls::finish_in(
                &mut tx,
                run_id,
                run.thread_id,
                iteration,
                &call_id,
                crate::domain::ToolCallStatus::Succeeded,
                Some(&result),
                None,
                "The user answered; the answer is the next message.",
            )
            .await?;
            messages::insert_user(&mut tx, run.thread_id, run_id, &text).await?;
        }
        (RunStatus::WaitingForConfirmation, ResumeInput::Decisions(decisions)) => {
            let awaiting: Vec<(String,)> = sqlx::query_as(
                "SELECT tool_call_id FROM tool_calls WHERE run_id = $1 AND status = 'awaiting_confirmation'
                 ORDER BY iteration, position",
            )
            .bind(run_id)
            .fetch_all(&mut *tx)
            .await?;
            let awaiting: Vec<String> = awaiting.into_iter().map(|(id,)| id).collect();
            let mut seen = std::collections::HashSet::new();
            for d in &decisions {
                if !seen.insert(d.tool_call_id.as_str()) {
                    return Err(ResumeError::DuplicateDecision(d.tool_call_id.clone()));
                }
            }
            let unknown: Vec<String> = decisions
                .iter()
                .filter(|d| !awaiting.contains(&d.tool_call_id))
                .map(|d| d.tool_call_id.clone())
                .collect();
            if !unknown.is_empty() {
                return Err(ResumeError::UnknownToolCalls(unknown));
            }
            let missing: Vec<String> = awaiting
                .iter()
                .filter(|id| !seen.contains(id.as_str()))
                .cloned()
                .collect();
            if !missing.is_empty() {
                return Err(ResumeError::MissingDecisions(missing));
            }
            for d in &decisions {
                sqlx::query(
                    "UPDATE tool_calls SET status = 'approved', decided_by = $3, decided_at = now(), decision_reason = $4
                     WHERE run_id = $1 AND tool_call_id = $2",
                )
                .bind(run_id)
                .bind(&d.tool_call_id)
                .bind(decided_by)
                .bind(&d.reason)
                .execute(&mut *tx)
                .await?;
                if !d.approve {
                    let why = d.reason.as_deref().unwrap_or("no reason given");
                    let content =
                        serde_json::json!({"error": format!("the user rejected this call: {why}")})
                            .to_string();
                    let result = serde_json::json!({"rejected": true, "reason": d.reason});
                    super::tool_calls::finish_in(
                        &mut tx,
                        run_id,
                        run.thread_id,
                        iteration,
                        &d.tool_call_id,
                        crate::domain::ToolCallStatus::Rejected,
                        Some(&result),
                        None,
                        &content,
                    )
                    .await?;
                }
            }
        }
        (RunStatus::WaitingForInput, _) => {
            return Err(ResumeError::WrongInput {
                expected: "an `input` answer",
            });
        }
        (RunStatus::WaitingForConfirmation, _) => {
            return Err(ResumeError::WrongInput {
                expected: "`decisions` on the pending tool calls",
            });
        }
        (status, _) => return Err(ResumeError::NotWaiting(status)),
    }
    let resumed = sqlx::query_as::<_, RunRow>(
        "UPDATE runs SET status = 'queued', pending = NULL, updated_at = now(), enqueued_at = now(),
                         held = fair
         WHERE id = $1 RETURNING *",
    )
    .bind(run_id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Resumed {
        paused_attempt: run.attempt,
        run: resumed,
        pending,
    })
}

#[cfg(test)]
mod tests;
