//! Dead letters and stuck work, for operators (`agentfleet-api admin …`).
//!
//! The source of truth for a dead letter is Postgres: a run failed with `poison_run` (its
//! worker vanished while it ran alone in quarantine, after more than `worker.max_recoveries`
//! take-overs). Runs in quarantine are listed by [`quarantined`]. Its message in the
//! dead-letter queue (`{prefix}.runs.dead`) says only which run; the queue's depth is what the
//! alert watches. A replay puts the run back to `queued` (one transition,
//! [`replay`]) and is counted in `runs.replays`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::{StoreError, is_unique_violation};

/// A run failed as poison.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    pub run_id: Uuid,
    pub tenant_id: Uuid,
    pub thread_id: Uuid,
    /// Why it was failed (the run's error message).
    pub reason: String,
    pub failed_at: Option<DateTime<Utc>>,
    /// Attempts so far (claims), and take-overs after a vanished worker in the last holding.
    pub attempt: i32,
    pub recoveries: i32,
    /// Times an operator replayed it before.
    pub replays: i32,
}

/// Poison runs, newest first.
pub async fn list(
    pool: &PgPool,
    tenant: Option<Uuid>,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id AS run_id, tenant_id, thread_id, coalesce(error ->> 'message', '') AS reason,
                finished_at AS failed_at, attempt, recoveries, replays
         FROM runs
         WHERE status = 'failed' AND (error ->> 'code') = 'poison_run'
           AND ($1::uuid IS NULL OR tenant_id = $1)
         ORDER BY finished_at DESC
         LIMIT $2",
    )
    .bind(tenant)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("run {0} not found")]
    NotFound(Uuid),
    #[error("run {run_id} is not a dead letter (status {status}, error code {code})")]
    NotDeadLettered {
        run_id: Uuid,
        status: String,
        code: String,
    },
    #[error("run {run_id} cannot be replayed now: its thread {thread_id} has another active run")]
    ThreadBusy { run_id: Uuid, thread_id: Uuid },
    #[error("run {run_id} is not replayed: its batch was cancelled (batch status {batch_status})")]
    BatchCancelled { run_id: Uuid, batch_status: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a replay put back: the caller publishes a run that is not `fair`, and dispatches the
/// tenant of one that is (`store::fair_dispatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    pub run_id: Uuid,
    pub tenant_id: Uuid,
    /// Counted against its tenant's running limit or the fair share: put back `held`, so it
    /// waits for a free place of its tenant's window like any new run of the tenant, instead of
    /// being published past it.
    pub fair: bool,
}

/// `failed (poison_run) -> queued`: the error is cleared, take-overs start again from zero and
/// the quarantine is lifted (the run runs among others until it reaches the limit again),
/// `replays` is incremented. The next claim is a new,
/// counted attempt. A run of a batch that had completed reopens the batch (`in_progress`: it
/// completes again, with a second `batch.completed`, once the run ends); a run of a cancelled
/// batch is refused, as its batch would cancel it again. Under the fair share (`fair_share`)
/// every replayed run goes back `held` and `fair`, dispatched in turn like any run of its
/// tenant, also one created before the fair share was on.
pub async fn replay(
    pool: &PgPool,
    run_id: Uuid,
    fair_share: bool,
) -> Result<Replayed, ReplayError> {
    let mut tx = pool.begin().await.map_err(StoreError::from)?;
    // The run's batch first, as a creation chunk takes its batch before the runs it writes
    // (and `finish` before it reads them): taking the run first deadlocked with a chunk that
    // held the batch and was inserting a later item's run on the replayed run's thread (each
    // waited for the other: the batch's row, the thread's slot in
    // `runs_one_active_per_thread`). A run's batch never changes, so reading it unlocked is
    // enough; the lock is the one the batch's update below takes anyway.
    sqlx::query(
        "SELECT 1 FROM batches WHERE id = (SELECT batch_id FROM runs WHERE id = $1)
         FOR NO KEY UPDATE",
    )
    .bind(run_id)
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    let updated: Result<Option<(Uuid, bool, Option<Uuid>)>, sqlx::Error> = sqlx::query_as(
        "UPDATE runs SET status = 'queued', error = NULL, finished_at = NULL, recoveries = 0,
                         quarantined_at = NULL, quarantine_attempt = NULL,
                         interrupted = false, lease_owner = NULL, lease_expires_at = NULL,
                         held = fair OR $2, fair = fair OR $2, enqueued_at = now(),
                         replays = replays + 1, replayed_at = now(), updated_at = now()
         WHERE id = $1 AND status = 'failed' AND (error ->> 'code') = 'poison_run'
           AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = runs.batch_id
                             AND b.status IN ('cancelling', 'cancelled'))
         RETURNING tenant_id, fair, batch_id",
    )
    .bind(run_id)
    .bind(fair_share)
    .fetch_optional(&mut *tx)
    .await;
    match updated {
        Ok(Some((tenant_id, fair, batch))) => {
            // A plan's task: its tokens joined its planner's `task_tokens` when it failed, and
            // join them again (all of them: a run's figures are cumulative) when it ends anew.
            // Task row, then planner row: the order of the fan-in and of a planner's cancel.
            sqlx::query(
                "UPDATE runs p
                    SET task_tokens = GREATEST(0, p.task_tokens
                                      - (t.prompt_tokens + t.completion_tokens + t.task_tokens))
                   FROM runs t WHERE t.id = $1 AND p.id = t.parent_run_id",
            )
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
            if let Some(batch) = batch {
                // The batch's row is ours since the first statement (a `finish` or a cancel
                // that held it has committed, and the run's update above saw what it wrote:
                // a cancel refused the replay there). `batches::finish` locks the row before
                // it looks at the runs, so it sees this run once this commits. The check of
                // the status below is a guard: no cancel can commit in between.
                let (status,): (String,) = sqlx::query_as(
                    "UPDATE batches
                        SET status = CASE status WHEN 'completed' THEN 'in_progress' ELSE status END,
                            finished_at = CASE status WHEN 'completed' THEN NULL ELSE finished_at END
                      WHERE id = $1
                      RETURNING status",
                )
                .bind(batch)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                if status == "cancelling" || status == "cancelled" {
                    // At once, rather than when the pool gets the connection back: the run's
                    // and the batch's rows stay locked until then.
                    tx.rollback().await.map_err(StoreError::from)?;
                    return Err(ReplayError::BatchCancelled {
                        run_id,
                        batch_status: status,
                    });
                }
            }
            tx.commit().await.map_err(StoreError::from)?;
            Ok(Replayed {
                run_id,
                tenant_id,
                fair,
            })
        }
        Ok(None) => {
            // At once: the batch's row stays locked until the transaction ends.
            tx.rollback().await.map_err(StoreError::from)?;
            let row: Option<(String, Option<String>, Option<String>)> = sqlx::query_as(
                "SELECT r.status::text, r.error ->> 'code', b.status
                 FROM runs r LEFT JOIN batches b ON b.id = r.batch_id WHERE r.id = $1",
            )
            .bind(run_id)
            .fetch_optional(pool)
            .await
            .map_err(StoreError::from)?;
            match row {
                None => Err(ReplayError::NotFound(run_id)),
                Some((status, code, batch))
                    if status == "failed" && code.as_deref() == Some("poison_run") =>
                {
                    Err(ReplayError::BatchCancelled {
                        run_id,
                        batch_status: batch.unwrap_or_default(),
                    })
                }
                Some((status, code, _)) => Err(ReplayError::NotDeadLettered {
                    run_id,
                    status,
                    code: code.unwrap_or_else(|| "none".to_owned()),
                }),
            }
        }
        Err(e) if is_unique_violation(&e, "runs_one_active_per_thread") => {
            tx.rollback().await.map_err(StoreError::from)?;
            let (thread_id,): (Uuid,) = sqlx::query_as("SELECT thread_id FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_one(pool)
                .await
                .map_err(StoreError::from)?;
            Err(ReplayError::ThreadBusy { run_id, thread_id })
        }
        Err(e) => Err(StoreError::from(e).into()),
    }
}

/// A run in quarantine: taken over more than `worker.max_recoveries` times, so each of its
/// attempts runs alone in a worker; failed as poison if one of those workers dies.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Quarantined {
    pub run_id: Uuid,
    pub tenant_id: Uuid,
    pub status: String,
    /// When it first ran alone.
    pub quarantined_at: DateTime<Utc>,
    /// A worker holds it alone right now.
    pub running_alone: bool,
    pub attempt: i32,
    pub recoveries: i32,
    /// For a failed run, its error code (`poison_run`: its quarantine worker died).
    pub error_code: Option<String>,
}

/// Runs in quarantine, or that were, newest first; `active` keeps those not yet finished.
pub async fn quarantined(
    pool: &PgPool,
    active: bool,
    limit: i64,
) -> Result<Vec<Quarantined>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id AS run_id, tenant_id, status::text AS status, quarantined_at,
                (status = 'running' AND quarantine_attempt = attempt) AS running_alone,
                attempt, recoveries, error ->> 'code' AS error_code
         FROM runs
         WHERE quarantined_at IS NOT NULL
           AND NOT ($1 AND status IN ('completed', 'failed', 'cancelled'))
         ORDER BY quarantined_at DESC
         LIMIT $2",
    )
    .bind(active)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// A run that has not moved for a long time.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Stuck {
    pub run_id: Uuid,
    pub tenant_id: Uuid,
    pub status: String,
    /// Since when it is in that status (its last change).
    pub since: DateTime<Utc>,
}

/// Runs waiting (for input, a confirmation or their thread) or queued, unchanged for longer
/// than `older_than`, oldest first.
pub async fn stuck(
    pool: &PgPool,
    older_than: chrono::Duration,
    limit: i64,
) -> Result<Vec<Stuck>, StoreError> {
    let seconds = older_than.num_milliseconds() as f64 / 1000.0;
    Ok(sqlx::query_as(
        "SELECT id AS run_id, tenant_id, status::text AS status, updated_at AS since
         FROM runs
         WHERE status IN ('queued', 'waiting_for_input', 'waiting_for_confirmation',
                          'waiting_for_thread')
           AND updated_at < now() - make_interval(secs => $1)
         ORDER BY updated_at
         LIMIT $2",
    )
    .bind(seconds)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::store::batches::{self, NewBatch, NewItem};
    use crate::store::{create_many, tenants, transitions};

    /// A batch `in_progress` whose only run is dead-lettered (failed as poison): every run of
    /// it has ended, so `finish` would complete it. Returns (batch, run).
    async fn batch_with_a_dead_letter(pool: &PgPool) -> (Uuid, Uuid) {
        let tenant = tenants::create(pool, "t").await.unwrap().tenant_id;
        let batch = batches::insert(
            pool,
            &NewBatch {
                id: Uuid::now_v7(),
                tenant_id: tenant,
                status: "creating",
                metadata: json!({}),
                idempotency_key: None,
                request_hash: None,
                fair: false,
                lease: Some(("me".into(), 60_000)),
                traceparent: None,
            },
            &[NewItem {
                custom_id: "c0".into(),
                body: None,
                run_id: None,
            }],
        )
        .await
        .unwrap()
        .expect("written");
        let run = transitions::NewRun::for_test(tenant);
        let run_id = run.id;
        let mut tx = pool.begin().await.unwrap();
        create_many::create_on_new_threads_in(&mut *tx, &[run], Some(batch.id))
            .await
            .unwrap();
        batches::mark_created(&mut tx, batch.id).await.unwrap();
        sqlx::query(
            "UPDATE runs SET status = 'failed', finished_at = now(),
                    error = '{\"code\": \"poison_run\", \"message\": \"poison\"}'
              WHERE id = $1",
        )
        .bind(run_id)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        (batch.id, run_id)
    }

    async fn status_of_run(pool: &PgPool, run: Uuid) -> String {
        sqlx::query_as::<_, (String,)>("SELECT status FROM runs WHERE id = $1")
            .bind(run)
            .fetch_one(pool)
            .await
            .unwrap()
            .0
    }

    async fn status_of_batch(pool: &PgPool, batch: Uuid) -> String {
        sqlx::query_as::<_, (String,)>("SELECT status FROM batches WHERE id = $1")
            .bind(batch)
            .fetch_one(pool)
            .await
            .unwrap()
            .0
    }

    /// Whether a statement on `batches` of this database waits on a row lock.
    async fn waits_on_the_batch(pool: &PgPool) -> bool {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%batches%'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        n > 0
    }

    /// Starts `replay(run)` and returns once it has ended or waits on a lock of a batch (a
    /// replay that does not wait for a transaction holding the batch ends at once).
    async fn start_replay(
        pool: &PgPool,
        run: Uuid,
    ) -> tokio::task::JoinHandle<Result<Replayed, ReplayError>> {
        let replaying = tokio::spawn({
            let pool = pool.clone();
            async move { replay(&pool, run, false).await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !replaying.is_finished() && !waits_on_the_batch(pool).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the replay neither ended nor waited"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        replaying
    }

    /// A replay while a `finish` holds the batch (it completed it, not yet committed) waits for
    /// it, then reopens the batch it completed: the batch does not stay completed with a run
    /// queued again.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_replay_racing_a_finish_reopens_the_batch_it_completed(pool: PgPool) {
        let (batch, run) = batch_with_a_dead_letter(&pool).await;
        let mut finisher = pool.begin().await.unwrap();
        let done = batches::finish(&mut finisher, batch).await.unwrap();
        assert_eq!(done.expect("finished").status, "completed");
        let replaying = start_replay(&pool, run).await;
        finisher.commit().await.unwrap();
        replaying.await.unwrap().expect("replayed");
        assert_eq!(status_of_batch(&pool, batch).await, "in_progress");
    }

    /// A replay whose check for a cancel read the batch before a cancel committed sees that
    /// cancel when it reopens the batch, and is refused: the run stays dead-lettered.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_replay_racing_a_cancel_is_refused(pool: PgPool) {
        let (batch, run) = batch_with_a_dead_letter(&pool).await;
        let mut canceller = pool.begin().await.unwrap();
        sqlx::query("UPDATE batches SET status = 'cancelling' WHERE id = $1")
            .bind(batch)
            .execute(&mut *canceller)
            .await
            .unwrap();
        let replaying = start_replay(&pool, run).await;
        canceller.commit().await.unwrap();
        let refused = replaying.await.unwrap();
        assert!(
            matches!(&refused, Err(ReplayError::BatchCancelled { batch_status, .. }) if batch_status == "cancelling"),
            "{refused:?}"
        );
        assert_eq!(
            status_of_run(&pool, run).await,
            "failed",
            "the run stays dead-lettered"
        );
        assert_eq!(status_of_batch(&pool, batch).await, "cancelling");
    }

    /// A `finish` while a replay's transaction has put the run back and holds the batch waits
    /// for it, then sees the run queued: the batch is not finished.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_finish_racing_a_replay_sees_the_run_it_put_back(pool: PgPool) {
        let (batch, run) = batch_with_a_dead_letter(&pool).await;
        // What `replay` does, held open: the run back in the queue, the batch's row locked.
        let mut replayer = pool.begin().await.unwrap();
        sqlx::query(
            "UPDATE runs SET status = 'queued', error = NULL, finished_at = NULL WHERE id = $1",
        )
        .bind(run)
        .execute(&mut *replayer)
        .await
        .unwrap();
        sqlx::query("UPDATE batches SET status = status WHERE id = $1")
            .bind(batch)
            .execute(&mut *replayer)
            .await
            .unwrap();
        let finishing = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin().await.unwrap();
                let done = batches::finish(&mut tx, batch).await.unwrap();
                tx.commit().await.unwrap();
                done
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !waits_on_the_batch(&pool).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the finish did not wait for the replay"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        replayer.commit().await.unwrap();
        assert!(
            finishing.await.unwrap().is_none(),
            "a batch with a queued run was finished"
        );
        assert_eq!(status_of_batch(&pool, batch).await, "in_progress");
    }

    /// A replay while a creation chunk of the run's batch holds the batch and inserts a later
    /// item's run on the replayed run's thread: the replay waits for the chunk, which goes
    /// through, then finds the thread busy and is refused. Taking the run before the batch,
    /// the two waited for each other until Postgres aborted one as a deadlock.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_replay_waits_for_a_creating_chunk_on_its_thread_without_deadlock(pool: PgPool) {
        let (batch, run) = batch_with_a_dead_letter(&pool).await;
        let (tenant, thread): (Uuid, Uuid) =
            sqlx::query_as("SELECT tenant_id, thread_id FROM runs WHERE id = $1")
                .bind(run)
                .fetch_one(&pool)
                .await
                .unwrap();
        // The chunk: the batch's row first, as `batch_driver` takes it.
        let mut chunk = pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM batches WHERE id = $1 FOR UPDATE")
            .bind(batch)
            .execute(&mut *chunk)
            .await
            .unwrap();
        let replaying = start_replay(&pool, run).await;
        let later = transitions::NewRun {
            thread_id: Some(thread),
            ..transitions::NewRun::for_test(tenant)
        };
        let created = transitions::create(&mut chunk, later).await;
        assert!(
            created.is_ok(),
            "the chunk's run on the thread: {:?}",
            created.err()
        );
        chunk.commit().await.unwrap();
        let refused = replaying.await.unwrap();
        assert!(
            matches!(&refused, Err(ReplayError::ThreadBusy { thread_id, .. }) if *thread_id == thread),
            "{refused:?}"
        );
        assert_eq!(
            status_of_run(&pool, run).await,
            "failed",
            "the run stays dead-lettered"
        );
    }
}
