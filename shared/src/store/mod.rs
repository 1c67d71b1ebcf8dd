//! Postgres access. Every write a worker makes after its claim is fenced by its attempt.

/// The fence in SQL: the run (`$1`) is still held by the attempt (`$2`) that writes. Every
/// fenced statement is built from this one condition (with `concat!`), so it is written once.
macro_rules! held {
    () => {
        "id = $1 AND attempt = $2 AND status = 'running'"
    };
}

/// The fence as a CTE named `fence`: the held run's row, locked until the statement's
/// transaction ends, so a concurrent claim or cancel waits and then sees our writes.
macro_rules! fence_cte {
    () => {
        concat!(
            "fence AS (SELECT id FROM runs WHERE ",
            held!(),
            " FOR UPDATE)"
        )
    };
}

/// The `iterations` rows of grouped writes: each input row `t` (joined with the CTE `held` of
/// the runs whose fence held) carries `t.timing`, a JSON array of zero or one timing (see
/// `turns::timing_param`).
macro_rules! timing_cte {
    () => {
        "timing AS (
            INSERT INTO iterations (run_id, iteration, attempt, started_at, finished_at,
                                    model_us, tools_us, total_us)
            SELECT x.run_id, x.iteration, x.attempt, x.started, x.finished, x.model_us,
                   x.tools_us, x.total_us
            FROM input t JOIN held ON held.id = t.run_id,
                 jsonb_to_recordset(t.timing) AS x(run_id uuid, iteration int, attempt int,
                     started timestamptz, finished timestamptz, model_us bigint,
                     tools_us bigint, total_us bigint)
            ON CONFLICT DO NOTHING)"
    };
}

pub mod active_runs;
pub mod agents;
pub mod batches;
pub mod group_commit;

/// `status = 'running'` as a parameter of the grouped fenced writes (`turns::record_many`,
/// `tool_calls::finish_many`, `transitions::end_many`). From the literal, the planner proves
/// the partial indexes on `status` usable for the fence and, on a `runs` table it has no
/// statistics for yet (a new database; autovacuum analyzes only after its naptime), plans a
/// scan of one whole — every active run — instead of a primary-key probe per run, and the
/// generic plan keeps it for the connection's life. With a parameter it cannot; the fence
/// also names its ids (`r.id = ANY($1)`) so the primary key carries it.
pub(crate) const RUNNING: &str = "running";
pub mod create_many;
pub mod dead_letters;
pub mod double_text;
pub mod erasure;
pub mod export;
pub mod fair_dispatch;
pub mod keys;
pub mod mcp_servers;
pub mod messages;
pub mod plans;
pub mod retention;
pub mod runs;
pub mod tenants;
pub mod tool_calls;
pub mod transitions;
pub mod turns;
pub mod usage;
pub mod webhook_deliveries;
pub mod webhooks;

use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    /// The run is no longer held by this attempt: another worker took it, or it was cancelled.
    #[error("run {run_id}: attempt {attempt} no longer holds the run")]
    LeaseLost { run_id: Uuid, attempt: i32 },
    #[error("run {run_id} is {status}")]
    WrongStatus { run_id: Uuid, status: String },
    #[error("thread {thread_id} already has an active run {run_id}")]
    ThreadBusy { thread_id: Uuid, run_id: Uuid },
    #[error("thread {thread_id} already has {limit} runs waiting")]
    ThreadQueueFull { thread_id: Uuid, limit: i64 },
    /// A create would take its tenant past `limits.max_active_runs` ([`active_runs::reserve`]).
    #[error("{active} active runs and {new_runs} more would pass the limit of {max}")]
    TooManyActiveRuns {
        max: u32,
        active: i64,
        new_runs: usize,
    },
    #[error("database: {}", crate::report::sqlx_line(.0))]
    Db(#[from] sqlx::Error),
    /// A grouped write had no answer in time (`database.statement_timeout_ms`): the server
    /// cancelled its statement (a lock held elsewhere, a stalled disk), or did not even answer.
    #[error("database: no answer in time (database.statement_timeout_ms)")]
    TimedOut,
}

impl StoreError {
    /// Whether trying again later may succeed: the database was unreachable, busy or
    /// restarting, or a transaction lost a race (serialization failure, deadlock). Anything
    /// else (a constraint, invalid data) fails the same way every time.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Db(e) => is_transient_db(e),
            StoreError::TimedOut => true,
            _ => false,
        }
    }

    /// Whether the statement ran out of time (`statement_timeout`, or no answer at all):
    /// writing the same items again at once would only wait as long again. A wait for a lock
    /// cut by `lock_timeout` (55P03) is not: written again one by one, only the items on the
    /// locked row wait.
    pub fn is_timeout(&self) -> bool {
        match self {
            StoreError::TimedOut => true,
            StoreError::Db(sqlx::Error::Database(db)) => {
                db.code().as_deref() == Some(QUERY_CANCELED)
            }
            _ => false,
        }
    }
}

/// SQLSTATE of a statement cancelled by `statement_timeout` (or by an operator's
/// `pg_cancel_backend`).
const QUERY_CANCELED: &str = "57014";

/// [`StoreError::is_transient`] for an error of sqlx itself.
pub fn is_transient_db(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            // 08 connection exception, 40001 serialization failure, 40P01 deadlock,
            // 53 insufficient resources, 57P operator intervention (shutdown, restart),
            // 57014 cancelled (`statement_timeout`: a lock held elsewhere), 55P03 lock not
            // available (`lock_timeout`).
            c.starts_with("08")
                || c == "40001"
                || c == "40P01"
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == QUERY_CANCELED
                || c == "55P03"
        }),
        _ => false,
    }
}

/// The identity of one holding of a run: writes carry it so stale holders are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub run_id: Uuid,
    pub attempt: i32,
}

impl Fence {
    pub fn lost(self) -> StoreError {
        StoreError::LeaseLost {
            run_id: self.run_id,
            attempt: self.attempt,
        }
    }
}

/// Locks the run row if `fence` still holds it; the lock lasts until the transaction ends, so
/// a concurrent claim or cancel waits for us and sees our writes (or we see theirs and stop).
pub async fn lock_fenced(tx: &mut sqlx::PgConnection, fence: Fence) -> Result<(), StoreError> {
    let row: Option<(Uuid,)> = sqlx::query_as(concat!(
        "SELECT id FROM runs WHERE ",
        held!(),
        " FOR UPDATE"
    ))
    .bind(fence.run_id)
    .bind(fence.attempt)
    .fetch_optional(&mut *tx)
    .await?;
    row.map(|_| ()).ok_or(fence.lost())
}

/// Maps a unique violation of the one-active-run-per-thread index.
pub(crate) fn is_unique_violation(err: &sqlx::Error, constraint: &str) -> bool {
    match err {
        sqlx::Error::Database(db) => db.constraint() == Some(constraint),
        _ => false,
    }
}

/// Per item (by run id), whether the statement returned its run as held.
pub(crate) fn held_flags(runs: impl Iterator<Item = Uuid>, held: &[(Uuid,)]) -> Vec<bool> {
    runs.map(|run| held.iter().any(|(id,)| *id == run))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_transient_and_bad_data_is_not() {
        assert!(StoreError::Db(sqlx::Error::PoolTimedOut).is_transient());
        assert!(StoreError::Db(sqlx::Error::Io(std::io::Error::other("reset"))).is_transient());
        assert!(!StoreError::Db(sqlx::Error::RowNotFound).is_transient());
        assert!(!StoreError::NotFound.is_transient());
        assert!(StoreError::TimedOut.is_transient() && StoreError::TimedOut.is_timeout());
        let lost = Fence {
            run_id: Uuid::nil(),
            attempt: 1,
        }
        .lost();
        assert!(!lost.is_transient());
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_database_error_reads_as_one_line_with_its_cause_once(pool: sqlx::PgPool) {
        let err = sqlx::query("SELECT * FROM no_such_table")
            .execute(&pool)
            .await
            .unwrap_err();
        let err = StoreError::from(err);
        let expected = "database: relation \"no_such_table\" does not exist (SQLSTATE 42P01)";
        assert_eq!(err.to_string(), expected);
        assert_eq!(crate::report::one_line(&anyhow::Error::from(err)), expected);
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn invalid_data_and_constraints_are_not_transient(pool: sqlx::PgPool) {
        let nul = sqlx::query("SELECT $1::jsonb")
            .bind("\"a\\u0000b\"")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(
            !StoreError::Db(nul).is_transient(),
            "a NUL in jsonb fails every time"
        );
        let check = sqlx::query("SELECT 1/0").execute(&pool).await.unwrap_err();
        assert!(!StoreError::Db(check).is_transient());
    }
}
