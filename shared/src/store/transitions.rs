//! The run state machine: one function per transition of a run's lifecycle (docs/architecture.md).
//!
//! ```text
//! queued -> running -> completed | failed | cancelled
//! running -> waiting_for_input | waiting_for_confirmation
//! waiting_* -> queued                    (resume)
//! waiting_* | queued | running -> cancelled
//! running -> queued                      (drain, or lease expired after a crash)
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
    /// Its tenant has a running limit: the run is created held, for [`super::fair_dispatch`] to
    /// dispatch in turn (and not published by its creator).
    pub fair: bool,
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
                 ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')",
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

/// The run and its user message, as CTEs of one statement (parameters $1..$11).
macro_rules! run_and_message {
    () => {
        "run AS (
            INSERT INTO runs (id, tenant_id, thread_id, status, agent, metadata,
                              idempotency_key, request_hash, max_iterations, held, fair,
                              traceparent)
            VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, $8, $10, $10, $11)
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

/// Runs one of the statements above; both take the same parameters (so does the waiting run's
/// insert of `store::double_text`).
pub(crate) async fn insert_run<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    sql: &'static str,
    new: &NewRun,
    thread_id: Uuid,
) -> Result<RunRow, sqlx::Error> {
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
        .fetch_one(executor)
        .await
}

/// `-> queued` on a new thread: the thread, the run and its user message in one statement,
/// so the common case of `POST /v1/runs` costs Postgres one round trip and one commit instead
/// of five (BEGIN, three INSERTs, COMMIT). Foreign keys are checked at the statement's end,
/// when all three rows exist.
pub async fn create_on_new_thread(pool: &PgPool, new: NewRun) -> Result<RunRow, StoreError> {
    debug_assert!(new.thread_id.is_none());
    let thread_id = Uuid::now_v7();
    let run = insert_run(pool, RUN_ON_NEW_THREAD, &new, thread_id).await?;
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
            SELECT id, status, interrupted, held FROM runs WHERE id = ANY($1) ORDER BY id FOR UPDATE)
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

/// Extends the lease while `fence` holds the run.
pub async fn renew_lease(
    pool: &PgPool,
    fence: Fence,
    lease: Duration,
) -> Result<Lease, StoreError> {
    let row: Option<(bool, bool)> = sqlx::query_as(concat!(
        "UPDATE runs SET lease_expires_at = now() + make_interval(secs => $3)
         WHERE ",
        held!(),
        "
         RETURNING cancel_requested_at IS NOT NULL, interrupt_requested_at IS NOT NULL",
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(lease.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    match row {
        Some((true, _)) => Ok(Lease::CancelRequested),
        Some((false, true)) => Ok(Lease::InterruptRequested),
        Some((false, false)) => Ok(Lease::Held),
        None => Err(fence.lost()),
    }
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
    },
    /// It was already cancelled: repeating a cancel is harmless.
    Already,
}

/// `queued | waiting_* | running -> cancelled`. Postgres decides at once; a worker holding the
/// run finds its fence gone at its next write and its stream fenced off (the caller appends
/// `run_cancelled` with the final fence), and the control hint makes it stop within a second.
pub async fn cancel(pool: &PgPool, tenant: Uuid, run_id: Uuid) -> Result<Cancelled, StoreError> {
    let mut tx = pool.begin().await?;
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
    tx.commit().await?;
    Ok(Cancelled::Now {
        previous: status,
        attempt,
        thread_id,
        last_event_id,
    })
}

/// `running -> failed` without a fence: the claim found a poison run (too many recoveries).
pub async fn fail_poisoned(
    pool: &PgPool,
    fence: Fence,
    recoveries: i32,
    last_event_id: u64,
) -> Result<String, StoreError> {
    let message = format!(
        "the run was taken over {recoveries} times after its worker stopped responding; \
         it is presumed to crash its worker and was failed"
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
mod tests {
    use super::*;
    use crate::store::{runs, tenants};

    async fn new_run(pool: &PgPool) -> RunRow {
        let tenant = tenants::create(pool, "t").await.unwrap();
        new_run_of(pool, tenant.tenant_id).await
    }

    async fn new_run_of(pool: &PgPool, tenant_id: Uuid) -> RunRow {
        let mut tx = pool.begin().await.unwrap();
        let run = create(
            &mut tx,
            NewRun {
                max_iterations: 5,
                ..NewRun::for_test(tenant_id)
            },
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        run
    }

    const LEASE: Duration = Duration::from_secs(10);

    #[sqlx::test(migrations = "../migrations")]
    async fn a_queued_run_is_claimed_once(pool: PgPool) {
        let run = new_run(&pool).await;
        let claimed = claim(&pool, run.id, "w1", LEASE)
            .await
            .unwrap()
            .expect("claimed");
        assert_eq!((claimed.run.attempt, claimed.recovered), (1, false));
        assert_eq!(claimed.run.status, RunStatus::Running);
        assert!(
            claim(&pool, run.id, "w2", LEASE).await.unwrap().is_none(),
            "a duplicate message claims nothing"
        );
    }

    /// A group of claims answers each message on its own: a queued run is taken once (a
    /// duplicate in the same group gets nothing), a run another worker holds is left alone.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_claim_group_answers_each_message(pool: PgPool) {
        let (queued, held) = (new_run(&pool).await, new_run(&pool).await);
        claim(&pool, held.id, "w1", LEASE).await.unwrap().unwrap();
        let ids = [queued.id, held.id, queued.id, Uuid::now_v7()];
        let claims = claim_many(&pool, &ids, "w2", LEASE).await.unwrap();
        let taken: Vec<Option<(Uuid, i32)>> = claims
            .iter()
            .map(|c| c.as_ref().map(|c| (c.run.id, c.run.attempt)))
            .collect();
        assert_eq!(taken, [Some((queued.id, 1)), None, None, None]);
        let held_now = runs::get(&pool, held.id).await.unwrap();
        assert_eq!(
            (held_now.attempt, held_now.lease_owner.as_deref()),
            (1, Some("w1"))
        );
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_stale_attempt_is_fenced_out_after_a_take_over(pool: PgPool) {
        let run = new_run(&pool).await;
        let first = claim(&pool, run.id, "w1", LEASE).await.unwrap().unwrap();
        sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second'")
            .execute(&pool)
            .await
            .unwrap();
        let second = claim(&pool, run.id, "w2", LEASE)
            .await
            .unwrap()
            .expect("expired lease is taken over");
        assert_eq!(
            (second.run.attempt, second.recovered, second.run.recoveries),
            (2, true, 1)
        );
        assert!(matches!(
            complete(&pool, first.fence(), 3).await,
            Err(StoreError::LeaseLost { .. })
        ));
        assert!(matches!(
            renew_lease(&pool, first.fence(), LEASE).await,
            Err(StoreError::LeaseLost { .. })
        ));
        complete(&pool, second.fence(), 3).await.unwrap();
        let done = runs::get(&pool, run.id).await.unwrap();
        assert_eq!(done.status, RunStatus::Completed);
        assert_eq!(done.last_event_id, 3);
        assert!(done.lease_owner.is_none());
    }

    fn timing(run: &RunRow, iteration: i32) -> IterationTiming {
        let now = chrono::Utc::now();
        IterationTiming {
            run_id: run.id,
            iteration,
            attempt: 1,
            started: now,
            finished: now,
            model_us: 1,
            tools_us: 2,
            total_us: 5,
        }
    }

    async fn count(pool: &PgPool, sql: &str, run: Uuid) -> i64 {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
            .bind(run)
            .fetch_one(pool)
            .await
            .unwrap();
        n
    }

    /// Grouped writes (`store::group_commit`): each item is fenced on its own, so a stale holder's
    /// item writes nothing while the others in its group commit.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_group_writes_only_the_items_whose_fence_holds(pool: PgPool) {
        use crate::store::turns::{Committed, Turn, record_many};
        let (a, b) = (new_run(&pool).await, new_run(&pool).await);
        let held_a = claim(&pool, a.id, "w", LEASE).await.unwrap().unwrap().run;
        let held_b = claim(&pool, b.id, "w", LEASE).await.unwrap().unwrap().run;
        let stale_b = Fence {
            run_id: b.id,
            attempt: held_b.attempt + 1,
        };
        // Each turn also carries the final iteration's timing of another run: written with
        // the turn whose fence holds, dropped with the stale one.
        let (c, d) = (new_run(&pool).await, new_run(&pool).await);
        let turn = |run: &RunRow, fence: Fence, carried: &RunRow| Turn {
            fence,
            thread_id: run.thread_id,
            iteration: 1,
            message: serde_json::json!({"role": "assistant", "content": null}),
            tool_calls: vec![serde_json::json!({
                "id": Uuid::now_v7(), "tool_call_id": "call_1", "position": 0, "name": "t",
                "raw_arguments": "{}", "arguments": {}, "risk": "low", "status": "running",
                "dispatch_count": 1})],
            prompt_tokens: 3,
            completion_tokens: 4,
            estimated_tokens: 0,
            last_event_id: 7,
            timing: Some(timing(run, 1)),
            carried: vec![timing(carried, 2)],
            ends: false,
        };
        let fence_a = Fence {
            run_id: a.id,
            attempt: held_a.attempt,
        };
        let turns = vec![turn(&held_a, fence_a, &c), turn(&held_b, stale_b, &d)];
        let held = record_many(&pool, &turns).await.unwrap();
        let usage = Committed {
            run_tokens: 7,
            tenant_tokens_today: 7,
            tenant_tokens_per_day: None,
            promoted: None,
        };
        assert_eq!(held, [Some(usage), None]);
        for (run, expected) in [(a.id, 1), (b.id, 0)] {
            let q = "SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'assistant'";
            assert_eq!(
                count(&pool, q, run).await,
                expected,
                "assistant message of {run}"
            );
            let q = "SELECT count(*) FROM tool_calls WHERE run_id = $1 AND dispatch_count = 1 AND started_at IS NOT NULL";
            assert_eq!(
                count(&pool, q, run).await,
                expected,
                "dispatched call of {run}"
            );
            let q = "SELECT count(*) FROM iterations WHERE run_id = $1";
            assert_eq!(count(&pool, q, run).await, expected, "timing of {run}");
        }
        let q = "SELECT count(*) FROM iterations WHERE run_id = $1 AND iteration = 2";
        assert_eq!(
            count(&pool, q, c.id).await,
            1,
            "carried by the turn that held"
        );
        assert_eq!(count(&pool, q, d.id).await, 0, "not by the stale one");
        let left = [timing(&d, 2), timing(&d, 2)];
        crate::store::turns::record_timings(&pool, &left)
            .await
            .unwrap();
        assert_eq!(count(&pool, q, d.id).await, 1, "left over, written once");
        let a_now = runs::get(&pool, a.id).await.unwrap();
        assert_eq!(
            (a_now.iteration, a_now.prompt_tokens, a_now.last_event_id),
            (1, 3, 7)
        );
        assert_eq!(runs::get(&pool, b.id).await.unwrap().iteration, 0);

        let endings = vec![
            Ending {
                fence: stale_b,
                status: RunStatus::Completed,
                last_event_id: 9,
                timing: None,
            },
            Ending {
                fence: fence_a,
                status: RunStatus::Completed,
                last_event_id: 9,
                timing: Some(timing(&held_a, 2)),
            },
        ];
        let ended = end_many(&pool, &endings).await.unwrap();
        let held: Vec<bool> = ended.iter().map(|e| e.held).collect();
        assert_eq!(held, [false, true]);
        assert_eq!(
            runs::get(&pool, a.id).await.unwrap().status,
            RunStatus::Completed
        );
        assert_eq!(
            runs::get(&pool, b.id).await.unwrap().status,
            RunStatus::Running
        );
        let q = "SELECT count(*) FROM iterations WHERE run_id = $1";
        assert_eq!(
            count(&pool, q, a.id).await,
            2,
            "the ending carried the last timing"
        );
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn release_hands_back_without_counting_a_recovery(pool: PgPool) {
        let run = new_run(&pool).await;
        let first = claim(&pool, run.id, "w1", LEASE).await.unwrap().unwrap();
        release(&pool, first.fence(), true, 4).await.unwrap();
        let again = claim(&pool, run.id, "w2", LEASE).await.unwrap().unwrap();
        assert_eq!(
            (again.run.attempt, again.run.recoveries, again.recovered),
            (2, 0, true)
        );
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn resume_needs_a_waiting_run_and_cancel_is_idempotent(pool: PgPool) {
        let run = new_run(&pool).await;
        let key: (Uuid,) = sqlx::query_as("SELECT id FROM api_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
        let err = resume(
            &pool,
            run.tenant_id,
            run.id,
            ResumeInput::Answer("x".into()),
            key.0,
        )
        .await;
        assert!(matches!(
            err,
            Err(ResumeError::NotWaiting(RunStatus::Queued))
        ));
        let first = cancel(&pool, run.tenant_id, run.id).await.unwrap();
        assert!(matches!(
            first,
            Cancelled::Now {
                previous: RunStatus::Queued,
                ..
            }
        ));
        assert_eq!(
            cancel(&pool, run.tenant_id, run.id).await.unwrap(),
            Cancelled::Already
        );
        assert!(
            claim(&pool, run.id, "w", LEASE).await.unwrap().is_none(),
            "a cancelled run is never claimed"
        );
        assert!(matches!(
            cancel(&pool, Uuid::new_v4(), run.id).await,
            Err(StoreError::NotFound)
        ));
    }

    /// A budget pause has no tool call to answer: the resume records the input as a user
    /// message only, and queues the run.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_budget_pause_resumes_with_a_user_message_only(pool: PgPool) {
        let run = new_run(&pool).await;
        let key: (Uuid,) = sqlx::query_as("SELECT id FROM api_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
        let claimed = claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap();
        let pending = serde_json::json!({"kind": "budget", "budget": "tenant", "used": 5,
            "limit": 1, "question": "raise it"});
        let mut tx = pool.begin().await.unwrap();
        wait(
            &mut tx,
            claimed.fence(),
            RunStatus::WaitingForInput,
            &pending,
            3,
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let resumed = resume(
            &pool,
            run.tenant_id,
            run.id,
            ResumeInput::Answer("go on".into()),
            key.0,
        )
        .await
        .unwrap();
        assert_eq!(resumed.run.status, RunStatus::Queued);
        assert_eq!(resumed.pending, pending);
        let users: Vec<(Value,)> = sqlx::query_as(
            "SELECT body FROM messages WHERE run_id = $1 AND role = 'user' ORDER BY id",
        )
        .bind(run.id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(users.len(), 2, "the run's input, then the resume's");
        assert!(users[1].0.to_string().contains("go on"), "{:?}", users[1]);
        let (calls,): (i64,) = sqlx::query_as("SELECT count(*) FROM tool_calls WHERE run_id = $1")
            .bind(run.id)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(calls, 0);
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn the_schema_refuses_impossible_states(pool: PgPool) {
        let run = new_run(&pool).await;
        // Running without a lease.
        let bad = sqlx::query("UPDATE runs SET status = 'running' WHERE id = $1")
            .bind(run.id)
            .execute(&pool)
            .await;
        assert!(bad.is_err());
        // Waiting without a pending item.
        let bad = sqlx::query("UPDATE runs SET status = 'waiting_for_input' WHERE id = $1")
            .bind(run.id)
            .execute(&pool)
            .await;
        assert!(bad.is_err());
        // A second active run on the same thread.
        let mut tx = pool.begin().await.unwrap();
        let second = create(
            &mut tx,
            NewRun {
                id: Uuid::now_v7(),
                tenant_id: run.tenant_id,
                thread_id: Some(run.thread_id),
                agent: AgentSpec::clone(&run.agent),
                max_iterations: 5,
                metadata: serde_json::json!({}),
                idempotency_key: None,
                request_hash: None,
                input: "again".into(),
                fair: false,
                traceparent: None,
            },
        )
        .await;
        assert!(matches!(second, Err(StoreError::ThreadBusy { run_id, .. }) if run_id == run.id));
    }

    /// An iteration-1 turn of `run` with these tokens (prompt, completion, estimated) and
    /// `calls` pending tool calls.
    fn turn(run: &RunRow, tokens: (i64, i64, i64), calls: usize) -> crate::store::turns::Turn {
        crate::store::turns::Turn {
            fence: Fence {
                run_id: run.id,
                attempt: run.attempt,
            },
            thread_id: run.thread_id,
            iteration: 1,
            message: serde_json::json!({"role": "assistant", "content": "x"}),
            tool_calls: (0..calls)
                .map(|i| {
                    serde_json::json!({
                    "id": Uuid::now_v7(), "tool_call_id": format!("call_{i}"), "position": i,
                    "name": "t", "raw_arguments": "{}", "arguments": {}, "risk": "low",
                    "status": "pending", "dispatch_count": 0})
                })
                .collect(),
            prompt_tokens: tokens.0,
            completion_tokens: tokens.1,
            estimated_tokens: tokens.2,
            last_event_id: 1,
            timing: None,
            carried: vec![],
            ends: false,
        }
    }

    /// Usage rides along with the turn commit: the run's counters, one usage row per
    /// tenant and day summed over the group, and in `RETURNING` what the budget check needs.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_groups_usage_is_summed_per_tenant_and_read_back(pool: PgPool) {
        use crate::store::turns::{Committed, Turn, record_many};
        let t1 = tenants::create(&pool, "t1").await.unwrap().tenant_id;
        let t2 = tenants::create(&pool, "t2").await.unwrap().tenant_id;
        sqlx::query(r#"UPDATE tenants SET limits = '{"tokens_per_day": 99}' WHERE id = $1"#)
            .bind(t2)
            .execute(&pool)
            .await
            .unwrap();
        let mut held = vec![];
        for tenant in [t1, t1, t2] {
            let run = new_run_of(&pool, tenant).await;
            held.push(claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap().run);
        }
        let turns = vec![
            turn(&held[0], (10, 1, 0), 2),
            turn(&held[1], (20, 2, 22), 0),
            turn(&held[2], (31, 2, 0), 1),
        ];
        let answers = record_many(&pool, &turns).await.unwrap();
        let committed = |run, today, own: Option<i64>| {
            Some(Committed {
                run_tokens: run,
                tenant_tokens_today: today,
                tenant_tokens_per_day: own.map(|n| Json(serde_json::json!(n))),
                promoted: None,
            })
        };
        assert_eq!(
            answers,
            [
                committed(11, 33, None),
                committed(22, 33, None),
                committed(33, 33, Some(99))
            ]
        );
        let rows: Vec<(Uuid, i64, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT tenant_id, prompt_tokens, completion_tokens, estimated_tokens, tool_calls, runs
             FROM usage_days ORDER BY prompt_tokens",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows, [(t1, 30, 3, 22, 2, 2), (t2, 31, 2, 0, 1, 1)]);
        let run = runs::get(&pool, held[0].id).await.unwrap();
        assert_eq!(
            (run.prompt_tokens, run.tool_calls, run.estimated_tokens),
            (10, 2, 0)
        );
        // A second turn adds to the same day's row and counts no new run.
        let again = turn(&held[1], (5, 5, 0), 0);
        let again = Turn {
            iteration: 2,
            ..again
        };
        let answers = record_many(&pool, &[again]).await.unwrap();
        assert_eq!(answers, [committed(32, 43, None)]);
        let claimed = {
            let run = new_run_of(&pool, t1).await;
            claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap()
        };
        assert_eq!(
            claimed.tenant_tokens_today, 43,
            "the claim reads the day's figure"
        );
        let (runs,): (i64,) = sqlx::query_as("SELECT runs FROM usage_days WHERE tenant_id = $1")
            .bind(t1)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(runs, 2);
    }

    /// Two turn groups of one tenant on different connections do not wait for each other:
    /// each adds to its own shard of the day (before migration 0017 the second waited for the
    /// first's commit on the tenant's one row; `lock_timeout` turns that wait into a failure).
    /// The day's figure sums every shard and the rows of `usage_daily`, as the claim, the
    /// turn's `RETURNING` and `GET /v1/usage` read it.
    #[sqlx::test(migrations = "../migrations")]
    async fn turn_groups_on_two_connections_take_different_rows_and_the_day_sums_them(
        pool: PgPool,
    ) {
        use sqlx::Connection;

        use crate::store::turns::record_many;
        use crate::store::usage;
        let tenant = tenants::create(&pool, "t").await.unwrap().tenant_id;
        // What a worker of the previous release wrote today.
        sqlx::query(
            "INSERT INTO usage_daily (tenant_id, day, prompt_tokens, completion_tokens, runs)
             VALUES ($1, (now() AT TIME ZONE 'UTC')::date, 100, 0, 1)",
        )
        .bind(tenant)
        .execute(&pool)
        .await
        .unwrap();
        let mut held = vec![];
        for _ in 0..3 {
            let run = new_run_of(&pool, tenant).await;
            held.push(claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap());
        }
        assert_eq!(
            held[0].tenant_tokens_today, 100,
            "the claim reads usage_daily too"
        );
        let turn = |run: &RunRow, prompt: i64| turn(run, (prompt, 0, 0), 0);
        // Two connections whose backends write different shards.
        async fn shard(conn: &mut sqlx::PgConnection) -> i32 {
            let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                .fetch_one(conn)
                .await
                .unwrap();
            pid % 32
        }
        let mut a = pool.acquire().await.unwrap().detach();
        let mut b = loop {
            let mut b = pool.acquire().await.unwrap().detach();
            if shard(&mut b).await != shard(&mut a).await {
                break b;
            }
        };
        sqlx::query("SET lock_timeout = '2s'")
            .execute(&mut b)
            .await
            .unwrap();
        let mut first = a.begin().await.unwrap();
        let in_a = record_many(&mut *first, &[turn(&held[0].run, 10)])
            .await
            .unwrap();
        assert_eq!(in_a[0].as_ref().unwrap().tenant_tokens_today, 110);
        // The first group holds its row until it commits; the second does not need it.
        let in_b = record_many(&mut b, &[turn(&held[1].run, 20)])
            .await
            .unwrap();
        assert_eq!(
            in_b[0].as_ref().unwrap().tenant_tokens_today,
            120,
            "the uncommitted group is not counted yet"
        );
        first.commit().await.unwrap();
        let third = record_many(&mut a, &[turn(&held[2].run, 30)])
            .await
            .unwrap();
        assert_eq!(third[0].as_ref().unwrap().tenant_tokens_today, 160);
        let (shards,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM usage_shards WHERE tenant_id = $1")
                .bind(tenant)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(shards, 2, "one row per connection's shard");
        let today = chrono::Utc::now().date_naive();
        let days = usage::daily(&pool, tenant, today, today).await.unwrap();
        assert_eq!(
            days.iter()
                .map(|d| (d.prompt_tokens, d.runs))
                .collect::<Vec<_>>(),
            [(160, 4)],
            "usage_daily's row and both shards"
        );
        let next = new_run_of(&pool, tenant).await;
        let claimed = claim(&pool, next.id, "w", LEASE).await.unwrap().unwrap();
        assert_eq!(claimed.tenant_tokens_today, 160);
    }
}
