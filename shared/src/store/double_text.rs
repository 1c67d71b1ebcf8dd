//! Double-texting: a run submitted to a busy thread with `if_busy = enqueue | interrupt`
//! (docs/architecture.md "Double-texting"). It waits `waiting_for_thread`, its user message on
//! its row, until the thread's active run ends; the trigger of migration 0010 then promotes
//! the oldest waiting run in the transaction of the end.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::runs::RunRow;
use super::transitions::{self, NewRun};
use super::{Fence, StoreError, is_unique_violation, lock_fenced};
use crate::domain::RunStatus;

/// What `POST /v1/runs` does when the thread has an active run (LangGraph's names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IfBusy {
    /// Refuse with 409 `thread_busy`.
    #[default]
    Reject,
    /// Wait for the active run to end, then start (in submission order).
    Enqueue,
    /// Cancel the active run at its next safe point, then start.
    Interrupt,
}

/// The error code and message an interrupted run ends with (`cancelled`).
pub const INTERRUPTED: &str = "interrupted";
pub const INTERRUPTED_MESSAGE: &str = "interrupted by a newer message";

/// The `error` of a run a newer message interrupted, which its `run_cancelled` repeats.
pub fn interrupted_error() -> serde_json::Value {
    json!({"code": INTERRUPTED, "message": INTERRUPTED_MESSAGE})
}

/// A creation with `if_busy`.
#[derive(Debug)]
pub struct Created {
    pub run: RunRow,
    /// The active run cancelled at once (it was queued or paused): (id, previous status,
    /// last event id) for its `run_cancelled` event.
    pub cancelled: Option<(Uuid, RunStatus, i64)>,
    /// A running run asked to stop at its next safe point (its worker is hinted).
    pub interrupting: Option<Uuid>,
    /// A waiting run promoted by that cancel: to publish.
    pub promoted: Option<Uuid>,
}

/// `-> queued | waiting_for_thread` on an existing thread (locked first, as
/// `transitions::create`). With `Reject`, exactly `transitions::create`.
pub async fn create(
    conn: &mut PgConnection,
    new: NewRun,
    if_busy: IfBusy,
    max_waiting: i64,
) -> Result<Created, StoreError> {
    let thread_id = new.thread_id.ok_or(StoreError::NotFound)?;
    if if_busy == IfBusy::Reject {
        let run = transitions::create(conn, new).await?;
        return Ok(Created {
            run,
            cancelled: None,
            interrupting: None,
            promoted: None,
        });
    }
    let owned: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM threads WHERE id = $1 AND tenant_id = $2 FOR UPDATE")
            .bind(thread_id)
            .bind(new.tenant_id)
            .fetch_optional(&mut *conn)
            .await?;
    owned.ok_or(StoreError::NotFound)?;
    let mut cancelled = None;
    let mut interrupting = None;
    let mut promoted = None;
    // The active run is locked too: a worker ending it concurrently waits for this
    // transaction, so its promotion sees the run inserted here.
    let mut active = active_run(conn, thread_id).await?;
    if let (IfBusy::Interrupt, Some((id, status, last_event_id))) = (if_busy, active) {
        // A planner waiting for its tasks ends likewise at its next safe point, once its
        // round is done (its tasks are not cut short).
        if matches!(status, RunStatus::Running | RunStatus::WaitingForTasks) {
            sqlx::query("UPDATE runs SET interrupt_requested_at = now() WHERE id = $1")
                .bind(id)
                .execute(&mut *conn)
                .await?;
            interrupting = Some(id);
        } else {
            // Queued or paused: nothing executes it, so it ends now (its open calls answered).
            transitions::close_unanswered_calls(conn, id, thread_id, INTERRUPTED_MESSAGE).await?;
            sqlx::query(
                "UPDATE runs SET status = 'cancelled', cancel_requested_at = now(),
                                 pending = NULL, held = false, error = $2,
                                 finished_at = now(), updated_at = now(), cancelled_from = $3
                 WHERE id = $1",
            )
            .bind(id)
            .bind(Json(interrupted_error()))
            .bind(status.as_str())
            .execute(&mut *conn)
            .await?;
            cancelled = Some((id, status, last_event_id));
            // Its end promoted the thread's oldest waiting run, if any: the new one queues.
            active = active_run(conn, thread_id).await?;
            promoted = active.map(|(id, _, _)| id);
        }
    }
    let waits = active.is_some() || interrupting.is_some();
    let run = if waits {
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM runs WHERE thread_id = $1 AND status = 'waiting_for_thread'",
        )
        .bind(thread_id)
        .fetch_one(&mut *conn)
        .await?;
        if waiting >= max_waiting {
            return Err(StoreError::ThreadQueueFull {
                thread_id,
                limit: max_waiting,
            });
        }
        insert_waiting(conn, &new, thread_id).await?
    } else {
        match transitions::create(conn, new).await {
            Ok(run) => run,
            Err(e) => return Err(e),
        }
    };
    Ok(Created {
        run,
        cancelled,
        interrupting,
        promoted,
    })
}

async fn active_run(
    conn: &mut PgConnection,
    thread_id: Uuid,
) -> Result<Option<(Uuid, RunStatus, i64)>, StoreError> {
    let row: Option<(Uuid, RunStatus, i64)> = sqlx::query_as(
        "SELECT id, status, last_event_id FROM runs WHERE thread_id = $1 AND status IN
         ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
          'waiting_for_tasks', 'waiting_for_slot') FOR UPDATE",
    )
    .bind(thread_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row)
}

/// The waiting run; its `enqueued_at` (the promotion order) is taken under the thread lock.
async fn insert_waiting(
    conn: &mut PgConnection,
    new: &NewRun,
    thread_id: Uuid,
) -> Result<RunRow, StoreError> {
    const WAITING: &str = "INSERT INTO runs (id, tenant_id, thread_id, status, agent, metadata,
                           idempotency_key, request_hash, max_iterations, fair, queued_input,
                           enqueued_at, traceparent)
         VALUES ($1, $2, $3, 'waiting_for_thread', $4, $5, $6, $7, $8, $10 OR $12 > 0, $9,
                 clock_timestamp(), $11)
         RETURNING *";
    let run = super::transitions::insert_run(&mut *conn, WAITING, new, thread_id).await?;
    Ok(run)
}

/// Whether a creation lost the race with a concurrent promotion: the active run it waited
/// for ended meanwhile and promoted a waiting run its scan could not see (the check of
/// `transitions::create` found it, or the unique index refused a second active run). Trying
/// again finds the promoted run and waits behind it. `enqueue` and `interrupt` never answer
/// `thread_busy` otherwise.
pub fn lost_race(e: &StoreError) -> bool {
    matches!(e, StoreError::ThreadBusy { .. })
        || matches!(e, StoreError::Db(db) if is_unique_violation(db, "runs_one_active_per_thread"))
}

/// `running -> cancelled` (code `interrupted`) by its holder at a safe point, with every call
/// left without a result answered first; returns the waiting run the end promoted.
pub async fn interrupt(
    pool: &PgPool,
    fence: Fence,
    last_event_id: u64,
) -> Result<Option<Uuid>, StoreError> {
    let mut tx = pool.begin().await?;
    lock_fenced(&mut tx, fence).await?;
    let (thread_id,): (Uuid,) = sqlx::query_as("SELECT thread_id FROM runs WHERE id = $1")
        .bind(fence.run_id)
        .fetch_one(&mut *tx)
        .await?;
    transitions::close_unanswered_calls(&mut tx, fence.run_id, thread_id, INTERRUPTED_MESSAGE)
        .await?;
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', error = $2, lease_owner = NULL,
                         lease_expires_at = NULL, finished_at = now(), updated_at = now(),
                         last_event_id = GREATEST(last_event_id, $3),
                         cancelled_from = 'running'
         WHERE id = $1",
    )
    .bind(fence.run_id)
    .bind(Json(interrupted_error()))
    .bind(last_event_id as i64)
    .execute(&mut *tx)
    .await?;
    let promoted = runnable_on_thread(&mut tx, thread_id).await?;
    tx.commit().await?;
    Ok(promoted)
}

/// Whether an interrupt was requested for the run (read under its lock before it pauses).
pub async fn interrupt_requested(conn: &mut PgConnection, run: Uuid) -> Result<bool, StoreError> {
    let requested: bool =
        sqlx::query_scalar("SELECT interrupt_requested_at IS NOT NULL FROM runs WHERE id = $1")
            .bind(run)
            .fetch_one(&mut *conn)
            .await?;
    Ok(requested)
}

/// The thread's queued run, if any: what an end off the grouped path (cancel, fail) promoted,
/// to publish. Not on the hot path.
pub async fn runnable_on_thread(
    conn: &mut PgConnection,
    thread_id: Uuid,
) -> Result<Option<Uuid>, StoreError> {
    let row: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM runs WHERE thread_id = $1 AND status = 'queued'")
            .bind(thread_id)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.map(|(id,)| id))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::AgentSpec;
    use crate::store::transitions::{Ending, claim, end_many};
    use crate::store::{runs, tenants};

    fn new_run(tenant_id: Uuid, thread_id: Option<Uuid>, input: &str) -> NewRun {
        let agent: AgentSpec = serde_json::from_value(json!({"model": "m"})).unwrap();
        NewRun {
            id: Uuid::now_v7(),
            tenant_id,
            thread_id,
            agent,
            max_iterations: 5,
            metadata: json!({}),
            idempotency_key: None,
            request_hash: None,
            input: input.into(),
            fair: false,
            share: None,
            traceparent: None,
        }
    }

    async fn submit(pool: &PgPool, new: NewRun, if_busy: IfBusy) -> Result<Created, StoreError> {
        let mut tx = pool.begin().await.unwrap();
        let created = create(&mut tx, new, if_busy, 2).await?;
        tx.commit().await.unwrap();
        Ok(created)
    }

    /// A tenant's run on a new thread: the thread's active run.
    async fn first_run(pool: &PgPool) -> (Uuid, RunRow) {
        let tenant = tenants::create(pool, "t").await.unwrap().tenant_id;
        let mut tx = pool.begin().await.unwrap();
        let first = transitions::create(&mut tx, new_run(tenant, None, "one"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        (tenant, first)
    }

    async fn user_messages(pool: &PgPool, thread: Uuid) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT body->>'content' FROM messages WHERE thread_id = $1 AND role = 'user' ORDER BY id",
        )
        .bind(thread)
        .fetch_all(pool)
        .await
        .unwrap()
    }

    /// A thread's runs list (and so `GET /v1/threads/{id}/events` follows them) in the order
    /// the thread's lock admitted them, not by when their transactions began: a creation whose
    /// transaction began first but took the lock second lists second (it sorted first, and a
    /// thread stream following the other run never reached it).
    #[sqlx::test(migrations = "../migrations")]
    async fn a_thread_lists_its_runs_in_the_order_its_lock_admitted_them(pool: PgPool) {
        let (tenant, first) = first_run(&pool).await;
        let thread = Some(first.thread_id);
        let mut late = pool.begin().await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *late).await.unwrap();
        let early = submit(&pool, new_run(tenant, thread, "two"), IfBusy::Enqueue)
            .await
            .unwrap()
            .run;
        let later = create(
            &mut late,
            new_run(tenant, thread, "three"),
            IfBusy::Enqueue,
            2,
        )
        .await
        .unwrap()
        .run;
        late.commit().await.unwrap();
        let filter = runs::ListFilter {
            tenant,
            status: None,
            thread_id: thread,
            batch_id: None,
            before: None,
            limit: 10,
        };
        let listed: Vec<Uuid> = runs::list(&pool, &filter)
            .await
            .unwrap()
            .iter()
            .rev()
            .map(|r| r.id)
            .collect();
        assert_eq!(listed, [first.id, early.id, later.id]);
    }

    /// A thread stream's next page: from a run on (itself included), oldest first; from the
    /// start for no run or another thread's; at most the limit.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_thread_pages_its_runs_from_the_one_a_stream_is_at(pool: PgPool) {
        let (tenant, first) = first_run(&pool).await;
        let thread = first.thread_id;
        let mut ids = vec![first.id];
        for input in ["two", "three"] {
            let run = submit(&pool, new_run(tenant, Some(thread), input), IfBusy::Enqueue)
                .await
                .unwrap()
                .run;
            ids.push(run.id);
        }
        let (_, elsewhere) = first_run(&pool).await;
        let page =
            |from: Option<Uuid>, limit| runs::thread_runs_from(&pool, tenant, thread, from, limit);
        assert_eq!(page(None, 10).await.unwrap(), ids);
        assert_eq!(page(Some(ids[1]), 10).await.unwrap(), ids[1..]);
        assert_eq!(page(Some(ids[2]), 10).await.unwrap(), ids[2..]);
        assert_eq!(page(Some(elsewhere.id), 10).await.unwrap(), ids);
        assert_eq!(page(None, 2).await.unwrap(), ids[..2]);
        // Another tenant's key sees none of them.
        let other = tenants::create(&pool, "u").await.unwrap().tenant_id;
        let theirs = runs::thread_runs_from(&pool, other, thread, None, 10);
        assert!(theirs.await.unwrap().is_empty());
    }

    /// The grouped end promotes the oldest waiting run in its own statement and names it; the
    /// waiting runs' messages join the thread only then; the limit of waiting runs holds.
    #[sqlx::test(migrations = "../migrations")]
    async fn an_end_promotes_the_oldest_waiting_run(pool: PgPool) {
        let (tenant, first) = first_run(&pool).await;
        let thread = Some(first.thread_id);
        let busy = submit(&pool, new_run(tenant, thread, "x"), IfBusy::Reject).await;
        assert!(
            matches!(busy, Err(StoreError::ThreadBusy { .. })),
            "{busy:?}"
        );
        let two = submit(&pool, new_run(tenant, thread, "two"), IfBusy::Enqueue)
            .await
            .unwrap()
            .run;
        let three = submit(&pool, new_run(tenant, thread, "three"), IfBusy::Enqueue)
            .await
            .unwrap()
            .run;
        assert_eq!(two.status, RunStatus::WaitingForThread);
        let full = submit(&pool, new_run(tenant, thread, "four"), IfBusy::Enqueue).await;
        assert!(
            matches!(full, Err(StoreError::ThreadQueueFull { limit: 2, .. })),
            "{full:?}"
        );
        assert_eq!(user_messages(&pool, first.thread_id).await, ["one"]);

        let claimed = claim(&pool, first.id, "w", Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        let ending = Ending {
            fence: claimed.fence(),
            status: RunStatus::Completed,
            last_event_id: 1,
            timing: None,
        };
        let ended = end_many(&pool, &[ending]).await.unwrap();
        assert!(ended[0].held);
        assert_eq!(ended[0].promoted, Some(two.id));
        assert_eq!(
            runs::get(&pool, two.id).await.unwrap().status,
            RunStatus::Queued
        );
        assert_eq!(
            runs::get(&pool, three.id).await.unwrap().status,
            RunStatus::WaitingForThread
        );
        assert_eq!(user_messages(&pool, first.thread_id).await, ["one", "two"]);
    }

    /// A final answer's turn is the run's end too: `completed`, lease released, and the
    /// oldest waiting run promoted and
    /// named, exactly as a grouped end would; a stale holder's final turn writes nothing.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_final_turn_ends_its_run_and_promotes_the_oldest_waiting_run(pool: PgPool) {
        use crate::store::turns::{Turn, record_many};
        let (tenant, first) = first_run(&pool).await;
        let thread = Some(first.thread_id);
        let two = submit(&pool, new_run(tenant, thread, "two"), IfBusy::Enqueue)
            .await
            .unwrap()
            .run;
        let claimed = claim(&pool, first.id, "w", Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        let turn = |fence| Turn {
            fence,
            thread_id: first.thread_id,
            iteration: 1,
            message: json!({"role": "assistant", "content": "done"}),
            tool_calls: vec![],
            prompt_tokens: 3,
            completion_tokens: 4,
            estimated_tokens: 0,
            last_event_id: 9,
            timing: None,
            carried: vec![],
            ends: true,
        };
        let stale = Fence {
            run_id: first.id,
            attempt: claimed.fence().attempt + 1,
        };
        assert_eq!(record_many(&pool, &[turn(stale)]).await.unwrap(), [None]);
        assert_eq!(
            runs::get(&pool, first.id).await.unwrap().status,
            RunStatus::Running,
            "a stale final turn ends nothing"
        );

        let committed = record_many(&pool, &[turn(claimed.fence())]).await.unwrap();
        let committed = committed[0].as_ref().expect("the fence holds");
        assert_eq!(committed.promoted, Some(two.id));
        let ended = runs::get(&pool, first.id).await.unwrap();
        assert_eq!(ended.status, RunStatus::Completed);
        assert_eq!(ended.last_event_id, 9);
        assert!(ended.lease_owner.is_none() && ended.lease_expires_at.is_none());
        assert!(ended.finished_at.is_some());
        assert_eq!(
            runs::get(&pool, two.id).await.unwrap().status,
            RunStatus::Queued
        );
    }
}
