//! Dead letters and stuck work, for operators (`agentfleet-api admin …`).
//!
//! The source of truth for a dead letter is Postgres: a run failed with `poison_run` (taken
//! over more than `worker.max_recoveries` times after its worker vanished). Its message in the
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
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `failed (poison_run) -> queued`: the error is cleared, take-overs start again from zero (or
/// the next claim would fail it at once), `replays` is incremented. The next claim is a new,
/// counted attempt. The caller publishes the run.
pub async fn replay(pool: &PgPool, run_id: Uuid) -> Result<(), ReplayError> {
    let updated = sqlx::query(
        "UPDATE runs SET status = 'queued', error = NULL, finished_at = NULL, recoveries = 0,
                         interrupted = false, lease_owner = NULL, lease_expires_at = NULL,
                         replays = replays + 1, replayed_at = now(), updated_at = now()
         WHERE id = $1 AND status = 'failed' AND (error ->> 'code') = 'poison_run'",
    )
    .bind(run_id)
    .execute(pool)
    .await;
    match updated {
        Ok(done) if done.rows_affected() == 1 => Ok(()),
        Ok(_) => {
            let row: Option<(String, Option<String>)> =
                sqlx::query_as("SELECT status, error ->> 'code' FROM runs WHERE id = $1")
                    .bind(run_id)
                    .fetch_optional(pool)
                    .await
                    .map_err(StoreError::from)?;
            match row {
                None => Err(ReplayError::NotFound(run_id)),
                Some((status, code)) => Err(ReplayError::NotDeadLettered {
                    run_id,
                    status,
                    code: code.unwrap_or_else(|| "none".to_owned()),
                }),
            }
        }
        Err(e) if is_unique_violation(&e, "runs_one_active_per_thread") => {
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
