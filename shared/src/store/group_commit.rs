//! Group commit: the same fenced write of many runs as one statement.
//!
//! A worker holds up to `worker.concurrency` runs, and at load many of them reach the same
//! step at once (a turn to record, a tool result, the end). Each write on its own costs
//! Postgres a round trip, an executor start-up, the table's constraint expressions and a
//! commit (a WAL flush); written together they cost that once per group. The groups form by
//! themselves: a write waits only while earlier groups hold every slot (`in_flight`), so an
//! idle worker writes at once and a busy one writes larger groups — no timer, no added
//! latency when there is nothing to group with.
//!
//! Each item still carries its own fence, and the statement reports which items' fences held
//! (or, for a write that answers with rows, the row of each item). If the group's statement
//! fails, every item is written again on its own, so one item's bad data (a constraint) fails
//! only that item, with its own error.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::StoreError;

type Reply<R> = oneshot::Sender<Result<R, StoreError>>;

/// The future of one group's write, borrowing the connection it runs on.
pub type WriteFuture<'c, R> = Pin<Box<dyn Future<Output = Result<Vec<R>, StoreError>> + Send + 'c>>;

/// Writes `items` in one statement on the connection it is given; per item, in order, what it
/// answers (for a fenced write: whether its fence held). Build one with [`write_fn`].
pub type WriteFn<T, R = bool> =
    Arc<dyn for<'c> Fn(&'c mut PgConnection, Arc<Vec<T>>) -> WriteFuture<'c, R> + Send + Sync>;

/// Makes a [`WriteFn`] of a closure (a closure passed here is inferred for every lifetime of
/// the connection; one handed to `Arc::new` directly is not).
pub fn write_fn<T, R, F>(f: F) -> WriteFn<T, R>
where
    F: for<'c> Fn(&'c mut PgConnection, Arc<Vec<T>>) -> WriteFuture<'c, R> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// How long a grouped writer keeps one connection before it takes a fresh one (so a
/// backend's caches and memory do not grow without end; pooled connections are replaced the
/// same way).
const KEPT_CONNECTION_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// Set on every grouped writer's connection. Each grouped statement finds its rows by
/// primary key (`id = ANY($1)`, the fence), so a sequential scan is never the right plan for
/// it; the planner picks one only while it takes `runs` for a table of a few pages — a new
/// database, before autovacuum's first `ANALYZE` — and the generic plan
/// (`database.generic_plans`) then keeps that scan for the connection's life, reading every
/// row version of the table in each group. Measured (`bench --only e2e`, three runs each):
/// Postgres 0.88 → 0.76 ms per run (medians). Where a table has no index for a statement,
/// Postgres still scans it: this setting only makes a scan the last resort. JIT is off on the
/// same connections: such a last-resort scan is costed at 10^10, far past `jit_above_cost`, and
/// compiling the statement then took 0.6 s for a table of four rows (a grouped statement
/// touches a few rows; JIT never pays for itself there).
const NO_SEQUENTIAL_SCANS: &str =
    "SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false)";

/// How long the check of a connection after a database error may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// A handle to one kind of grouped write; cheap to clone.
pub struct Batcher<T, R = bool> {
    tx: mpsc::UnboundedSender<(T, Reply<R>)>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<T: Send + Sync + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the grouping task; it ends when the last handle is dropped. At most `in_flight`
    /// groups are written at once, each of at most `max_items`, and each group in flight keeps
    /// its own connection (taken from `pool` and then kept out of it: see [`Connections`]).
    ///
    /// A group with no answer after `timeout` (see `DatabaseSettings::write_timeout`) fails
    /// with [`StoreError::TimedOut`] and its connection is closed.
    pub fn spawn(
        pool: PgPool,
        in_flight: usize,
        max_items: usize,
        timeout: Option<Duration>,
        write: WriteFn<T, R>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer {
            connections: Connections {
                pool,
                kept: Default::default(),
            },
            write,
            timeout,
        };
        tokio::spawn(group(
            rx,
            Arc::new(writer),
            in_flight.max(1),
            max_items.max(1),
        ));
        Batcher { tx }
    }

    /// Writes `item` with whatever else is waiting (for a fenced write, `Ok(false)`: its fence
    /// did not hold).
    pub async fn write(&self, item: T) -> Result<R, StoreError> {
        self.send(item).await
    }

    /// Hands `item` to the writer now (it joins the next group whether or not the answer is
    /// awaited) and returns its answer to await later, as [`Batcher::write`] gives it.
    pub fn send(&self, item: T) -> impl Future<Output = Result<R, StoreError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .tx
            .send((item, reply))
            .map_err(|_| StoreError::Db(sqlx::Error::PoolClosed));
        async move {
            sent?;
            answer
                .await
                .map_err(|_| StoreError::Db(sqlx::Error::WorkerCrashed))?
        }
    }
}

/// The connections of one kind of grouped write, one per group in flight.
///
/// They are detached from the pool because sqlx checks every connection it takes back with a
/// round trip (a `Sync` and its `ReadyForQuery`): one more wake-up of the worker and of a
/// Postgres backend for every grouped statement, on the path every run takes. A kept
/// connection is dropped when a statement on it fails and it may be broken (see
/// [`Connections::give_back`]), and after [`KEPT_CONNECTION_LIFETIME`]; the next group takes a
/// fresh one. The pool opens others in their place, so a process holds up
/// to `database.max_connections` plus one per grouped writer's group in flight.
struct Connections {
    pool: PgPool,
    kept: Mutex<Vec<(PgConnection, Instant)>>,
}

impl Connections {
    async fn take(&self) -> Result<(PgConnection, Instant), StoreError> {
        let kept = self.kept.lock().expect("kept connections lock").pop();
        match kept {
            Some(kept) => Ok(kept),
            // Boxed: sqlx's acquire future is large (about 14 KB); inline, it would make every
            // group's task that large, copied several times at each spawn.
            None => {
                Box::pin(async {
                    let mut conn = self.pool.acquire().await?.detach();
                    sqlx::query(NO_SEQUENTIAL_SCANS).execute(&mut conn).await?;
                    Ok((conn, Instant::now()))
                })
                .await
            }
        }
    }

    /// Keeps `conn` for the next group unless `outcome` says it may be broken: an error of
    /// the database (which may be its last word, as a backend terminated by an administrator
    /// says) is followed by one round trip to see the connection still answers.
    async fn give_back(&self, mut conn: (PgConnection, Instant), error: Option<&StoreError>) {
        use sqlx::Connection;
        let usable = match error {
            None => true,
            Some(StoreError::Db(sqlx::Error::Database(_))) => {
                matches!(
                    tokio::time::timeout(CHECK_TIMEOUT, conn.0.ping()).await,
                    Ok(Ok(()))
                )
            }
            Some(StoreError::Db(_)) => false,
            Some(_) => true,
        };
        if usable && conn.1.elapsed() < KEPT_CONNECTION_LIFETIME && !self.pool.is_closed() {
            self.kept.lock().expect("kept connections lock").push(conn);
        }
    }
}

struct Writer<T, R> {
    connections: Connections,
    write: WriteFn<T, R>,
    timeout: Option<Duration>,
}

impl<T, R> Writer<T, R> {
    async fn write(&self, items: Arc<Vec<T>>) -> Result<Vec<R>, StoreError> {
        let mut conn = self.connections.take().await?;
        let written = (self.write)(&mut conn.0, items);
        let outcome = match self.timeout {
            None => written.await,
            Some(limit) => match tokio::time::timeout(limit, written).await {
                Ok(outcome) => outcome,
                // Abandoned mid-statement, the connection cannot carry another: dropped here,
                // it is closed (the server's `statement_timeout` ends the statement).
                Err(_) => return Err(StoreError::TimedOut),
            },
        };
        self.connections
            .give_back(conn, outcome.as_ref().err())
            .await;
        outcome
    }
}

async fn group<T: Send + Sync + 'static, R: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<(T, Reply<R>)>,
    writer: Arc<Writer<T, R>>,
    in_flight: usize,
    max_items: usize,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    loop {
        // A slot first: while every slot is busy, items wait in the channel and form a group.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut items = vec![first];
        while items.len() < max_items {
            match rx.try_recv() {
                Ok(item) => items.push(item),
                Err(_) => break,
            }
        }
        let writer = writer.clone();
        tokio::spawn(async move {
            write_group(&writer, items).await;
            drop(slot);
        });
    }
}

async fn write_group<T, R>(writer: &Writer<T, R>, items: Vec<(T, Reply<R>)>) {
    let started = Instant::now();
    metrics::histogram!("agentfleet_store_group_size").record(items.len() as f64);
    let (items, replies): (Vec<T>, Vec<Reply<R>>) = items.into_iter().unzip();
    let items = Arc::new(items);
    match writer.write(items.clone()).await {
        Ok(answers) => {
            debug_assert_eq!(answers.len(), replies.len(), "one answer per item");
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(e) if e.is_timeout() => {
            // Not split: written one by one, each item would wait as long again, and every
            // run behind them with it. The runs hand themselves back (counted) instead.
            tracing::warn!(error = %e, items = replies.len(), "grouped write ran out of time");
            for reply in replies {
                let _ = reply.send(Err(StoreError::TimedOut));
            }
        }
        Err(e) if replies.len() == 1 => {
            let _ = replies.into_iter().next().expect("one").send(Err(e));
        }
        // Among them a wait for a row locked elsewhere, cut by `lock_timeout` (55P03): one by
        // one, only the items on that row wait again, and the rest of the group is written.
        Err(e) => {
            tracing::debug!(error = %e, items = replies.len(), "grouped write failed; writing its items one by one");
            let Ok(items) = Arc::try_unwrap(items) else {
                // The write function kept the items: not ours to split, so all fail alike.
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Db(sqlx::Error::WorkerCrashed)));
                }
                return;
            };
            for (item, reply) in items.into_iter().zip(replies) {
                // Written one after another, items that each wait on the same lock (a table
                // locked by hand, one tenant's row) would wait a lock time-out each: the split
                // gets the group's time limit, and what it leaves unwritten fails as timed out.
                if writer
                    .timeout
                    .is_some_and(|limit| started.elapsed() >= limit)
                {
                    let _ = reply.send(Err(StoreError::TimedOut));
                    continue;
                }
                let result = writer.write(Arc::new(vec![item])).await.and_then(|a| {
                    a.into_iter()
                        .next()
                        .ok_or(StoreError::Db(sqlx::Error::RowNotFound))
                });
                let _ = reply.send(result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A table `held` of rows `1..=rows` (`n` = 0), and a transaction holding `lock` on it.
    async fn held_table(
        pool: &PgPool,
        rows: i32,
        lock: &'static str,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        sqlx::query("CREATE TABLE held (id int PRIMARY KEY, n int NOT NULL)")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO held SELECT i, 0 FROM generate_series(1, $1) i")
            .bind(rows)
            .execute(pool)
            .await
            .unwrap();
        let mut locker = pool.begin().await.unwrap();
        sqlx::query(lock).execute(&mut *locker).await.unwrap();
        locker
    }

    /// A write adding 1 to `n` of its ids in `held` after `settings` (what the connection
    /// options set), recording the ids of each call in `calls`.
    fn updating(settings: &'static str, calls: Arc<Mutex<Vec<Vec<i32>>>>) -> WriteFn<i32> {
        write_fn(move |conn, ids: Arc<Vec<i32>>| {
            let calls = calls.clone();
            Box::pin(async move {
                calls.lock().unwrap().push(ids.to_vec());
                sqlx::raw_sql(settings).execute(&mut *conn).await?;
                sqlx::query("UPDATE held SET n = n + 1 WHERE id = ANY($1)")
                    .bind(&ids[..])
                    .execute(&mut *conn)
                    .await?;
                Ok(vec![true; ids.len()])
            })
        })
    }

    /// `n` of every row of `held`, by id.
    async fn held_counts(pool: &PgPool) -> Vec<(i32,)> {
        sqlx::query_as("SELECT n FROM held ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap()
    }

    /// Items wait while every slot is busy and are then written as one group; when a group
    /// fails, its items are written one by one, so only the bad item fails.
    #[sqlx::test]
    async fn waiting_items_form_a_group_and_a_failed_group_is_split(pool: PgPool) {
        let gate = Arc::new(tokio::sync::Notify::new());
        let groups: Arc<Mutex<Vec<Vec<u32>>>> = Default::default();
        let (gate2, groups2) = (gate.clone(), groups.clone());
        let write: WriteFn<u32> = write_fn(move |_conn, items: Arc<Vec<u32>>| {
            let (gate, groups) = (gate2.clone(), groups2.clone());
            Box::pin(async move {
                let first = groups.lock().unwrap().is_empty();
                groups.lock().unwrap().push(items.to_vec());
                if first {
                    gate.notified().await; // holds the only slot until the test lets go
                }
                if items.contains(&13) {
                    return Err(StoreError::NotFound);
                }
                Ok(items.iter().map(|i| i % 2 == 0).collect())
            })
        });
        let batcher = Batcher::spawn(pool, 1, 64, None, write);
        let spawn = |i: u32| {
            let b = batcher.clone();
            tokio::spawn(async move { (i, b.write(i).await) })
        };
        let mut tasks = vec![spawn(1)];
        while groups.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // The first group holds the only slot: these wait in the channel.
        tasks.extend([2, 13, 4, 5].map(spawn));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        for task in tasks {
            let (i, result) = task.await.unwrap();
            match i {
                13 => assert!(matches!(result, Err(StoreError::NotFound))),
                _ => assert_eq!(result.unwrap(), i % 2 == 0, "item {i}"),
            }
        }
        let groups = groups.lock().unwrap().clone();
        assert_eq!(groups[0], [1], "the first item is written at once");
        assert_eq!(
            groups[1],
            [2, 13, 4, 5],
            "the others waited and formed one group"
        );
        assert_eq!(
            &groups[2..],
            [[2], [13], [4], [5]],
            "the failed group was split"
        );
    }

    /// A grouped writer's connection probes `runs` by its primary key even while the table
    /// is new and tiny, where the planner would otherwise scan it whole (and a generic plan
    /// would keep that scan for the connection's life).
    #[sqlx::test(migrations = "../migrations")]
    async fn a_grouped_write_probes_runs_by_key_on_a_new_table(pool: PgPool) {
        // The shape of every grouped fence, as a generic plan (`database.generic_plans`).
        async fn plan(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
            sqlx::raw_sql(
                "SET plan_cache_mode = force_generic_plan;
                 PREPARE fence(uuid[], text) AS
                     SELECT id FROM runs WHERE id = ANY($1) AND status = $2",
            )
            .execute(&mut *conn)
            .await?;
            let lines: Vec<(String,)> =
                sqlx::query_as("EXPLAIN EXECUTE fence(ARRAY[gen_random_uuid()], 'running')")
                    .fetch_all(&mut *conn)
                    .await?;
            sqlx::raw_sql("DEALLOCATE fence; RESET plan_cache_mode")
                .execute(&mut *conn)
                .await?;
            Ok(lines
                .into_iter()
                .map(|(l,)| l)
                .collect::<Vec<_>>()
                .join("\n"))
        }
        let mut pooled = pool.acquire().await.unwrap();
        let unguarded = plan(&mut pooled).await.unwrap();
        assert!(
            unguarded.contains("Seq Scan on runs"),
            "the premise: on a new table the planner scans it whole\n{unguarded}"
        );
        drop(pooled);
        let write: WriteFn<u32, String> = write_fn(|conn, items: Arc<Vec<u32>>| {
            Box::pin(async move {
                let plan = plan(conn).await?;
                Ok(vec![plan; items.len()])
            })
        });
        let grouped = Batcher::spawn(pool, 1, 64, None, write)
            .write(1)
            .await
            .unwrap();
        assert!(
            grouped.contains("Index") && grouped.contains("runs_pkey"),
            "a grouped writer probes the primary key\n{grouped}"
        );
        assert!(!grouped.contains("Seq Scan"), "{grouped}");
    }

    /// Groups reuse their connection (no pool round trip per group); a connection whose
    /// statement failed for another reason than the database refusing it is not reused.
    #[sqlx::test]
    async fn a_group_reuses_its_connection_until_it_breaks(pool: PgPool) {
        let write: WriteFn<u32, i32> = write_fn(|conn, items: Arc<Vec<u32>>| {
            Box::pin(async move {
                if items[0] == 0 {
                    // Refused by the database: the connection is still good.
                    sqlx::query("SELECT 1/0").execute(&mut *conn).await?;
                }
                let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(vec![pid; items.len()])
            })
        });
        let batcher = Batcher::spawn(pool.clone(), 1, 64, None, write);
        let first = batcher.write(1).await.unwrap();
        assert_eq!(
            batcher.write(2).await.unwrap(),
            first,
            "the second group reuses it"
        );
        assert!(matches!(
            batcher.write(0).await,
            Err(StoreError::Db(sqlx::Error::Database(_)))
        ));
        assert_eq!(
            batcher.write(3).await.unwrap(),
            first,
            "a refused statement leaves the connection in use"
        );
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(first)
            .execute(&pool)
            .await
            .unwrap();
        let broken = batcher.write(4).await;
        assert!(
            broken.is_err(),
            "the terminated connection fails its group: {broken:?}"
        );
        let fresh = batcher.write(5).await.unwrap();
        assert_ne!(fresh, first, "a broken connection is replaced");
    }

    /// An item sent is written at once, whether or not its answer is awaited, and its answer
    /// can be awaited later.
    #[sqlx::test]
    async fn an_item_sent_is_written_without_its_answer_awaited(pool: PgPool) {
        let written: Arc<Mutex<Vec<u32>>> = Default::default();
        let seen = written.clone();
        let write: WriteFn<u32> = write_fn(move |_conn, items: Arc<Vec<u32>>| {
            let seen = seen.clone();
            Box::pin(async move {
                seen.lock().unwrap().extend(items.iter());
                Ok(vec![true; items.len()])
            })
        });
        let batcher = Batcher::spawn(pool, 1, 64, None, write);
        drop(batcher.send(1)); // never awaited
        let later = batcher.send(2);
        let deadline = Instant::now() + Duration::from_secs(10);
        while written.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "both items are written");
            tokio::task::yield_now().await;
        }
        assert_eq!(*written.lock().unwrap(), [1, 2]);
        assert!(later.await.unwrap(), "the answer waited for the caller");
    }

    /// A group that waits on a lock held elsewhere is cancelled by the server's
    /// `statement_timeout` and fails at once, all its items alike, instead of being split
    /// into writes that would each wait as long again; the writer goes on.
    #[sqlx::test]
    async fn a_group_cancelled_for_time_fails_whole_and_the_writer_goes_on(pool: PgPool) {
        let locker = held_table(&pool, 2, "SELECT 1 FROM held WHERE id = 1 FOR UPDATE").await;
        let calls: Arc<Mutex<Vec<Vec<i32>>>> = Default::default();
        // What `database.statement_timeout_ms` sets on every connection.
        let write = updating("SET statement_timeout = 200", calls.clone());
        let batcher = Batcher::spawn(pool.clone(), 1, 64, Some(Duration::from_secs(30)), write);
        let started = Instant::now();
        // Sent together before the writer runs: one group.
        let answers = [batcher.send(2), batcher.send(1), batcher.send(2)];
        for answer in answers {
            let answer = answer.await;
            assert!(matches!(answer, Err(StoreError::TimedOut)), "{answer:?}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server's cancel answered, not the writer's own limit"
        );
        assert_eq!(calls.lock().unwrap().len(), 1, "one group, not split");
        locker.rollback().await.unwrap();
        assert!(batcher.write(1).await.unwrap(), "the writer goes on");
        let counts = held_counts(&pool).await;
        assert_eq!(counts, [(1,), (0,)], "the cancelled group wrote nothing");
    }

    /// A group that waits on a row locked elsewhere past `lock_timeout` (55P03, shorter than
    /// `statement_timeout`) is written again item by item: the items on other rows are
    /// written, and only the one on the locked row fails, as transient.
    #[sqlx::test]
    async fn a_group_meeting_a_locked_row_fails_only_the_item_on_it(pool: PgPool) {
        let locker = held_table(&pool, 3, "SELECT 1 FROM held WHERE id = 1 FOR UPDATE").await;
        let groups: Arc<Mutex<Vec<Vec<i32>>>> = Default::default();
        // What `database.lock_timeout_ms` and `statement_timeout_ms` set on every connection.
        let write = updating(
            "SET lock_timeout = 200; SET statement_timeout = 20000",
            groups.clone(),
        );
        let batcher = Batcher::spawn(pool.clone(), 1, 64, Some(Duration::from_secs(30)), write);
        let started = Instant::now();
        // Sent together before the writer runs: one group.
        let answers = [batcher.send(2), batcher.send(1), batcher.send(3)];
        let [two, one, three] = answers;
        assert!(
            two.await.unwrap(),
            "the item before the locked row is written"
        );
        assert!(
            three.await.unwrap(),
            "the item after the locked row is written"
        );
        let one = one.await;
        match &one {
            Err(e @ StoreError::Db(sqlx::Error::Database(db))) => {
                assert_eq!(db.code().as_deref(), Some("55P03"), "{one:?}");
                assert!(e.is_transient() && !e.is_timeout(), "{one:?}");
            }
            other => panic!("the item on the locked row fails with 55P03: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the lock's time-out answered, not the statement's"
        );
        assert_eq!(
            *groups.lock().unwrap(),
            [vec![2, 1, 3], vec![2], vec![1], vec![3]],
            "one group, then its items one by one"
        );
        locker.rollback().await.unwrap();
        let counts: Vec<(i32,)> = sqlx::query_as("SELECT n FROM held ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(
            counts,
            [(0,), (1,), (1,)],
            "only the locked row was left unwritten"
        );
    }

    /// Items that all wait on one lock (a table locked by hand, one tenant's row) are not
    /// written one after another for a lock time-out each: the split stops at the group's
    /// time limit, and the items it did not reach fail as timed out.
    #[sqlx::test]
    async fn a_split_of_items_waiting_on_one_lock_stops_at_the_groups_limit(pool: PgPool) {
        let locker = held_table(&pool, 1, "LOCK TABLE held IN EXCLUSIVE MODE").await;
        let calls: Arc<Mutex<Vec<Vec<i32>>>> = Default::default();
        let write = updating("SET lock_timeout = 1000", calls.clone());
        // The group's limit (`write_timeout`) passes during the first item's own wait: past
        // one lock time-out with room to spare, short of two.
        let batcher = Batcher::spawn(
            pool.clone(),
            1,
            64,
            Some(Duration::from_millis(1500)),
            write,
        );
        let started = Instant::now();
        let answers = [1, 1, 1, 1].map(|id| batcher.send(id));
        let mut outcomes = Vec::new();
        for answer in answers {
            outcomes.push(match answer.await {
                Err(StoreError::Db(sqlx::Error::Database(db))) => {
                    db.code().unwrap_or_default().into_owned()
                }
                Err(StoreError::TimedOut) => "timed out".to_owned(),
                other => format!("{other:?}"),
            });
        }
        assert_eq!(outcomes, ["55P03", "timed out", "timed out", "timed out"]);
        assert_eq!(
            *calls.lock().unwrap(),
            [vec![1, 1, 1, 1], vec![1]],
            "the group, then its first item alone"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        locker.rollback().await.unwrap();
        assert!(batcher.write(1).await.unwrap(), "the writer goes on");
    }

    /// A group with no answer at all (a server that cannot even cancel) fails with
    /// `TimedOut` once the writer's own limit passes, and the next group takes a fresh
    /// connection: the abandoned one may be in the middle of a statement.
    #[sqlx::test]
    async fn a_group_with_no_answer_fails_in_time_on_a_connection_given_up(pool: PgPool) {
        let write: WriteFn<u32, i32> = write_fn(|conn, items: Arc<Vec<u32>>| {
            Box::pin(async move {
                let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                    .fetch_one(&mut *conn)
                    .await?;
                if items.contains(&0) {
                    std::future::pending::<()>().await;
                }
                Ok(vec![pid; items.len()])
            })
        });
        let batcher = Batcher::spawn(pool, 1, 64, Some(Duration::from_millis(200)), write);
        let first = batcher.write(1).await.unwrap();
        let started = Instant::now();
        let stuck = batcher.write(0).await;
        assert!(matches!(stuck, Err(StoreError::TimedOut)), "{stuck:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let next = batcher.write(2).await.unwrap();
        assert_ne!(next, first, "the connection given up on is not used again");
    }
}
