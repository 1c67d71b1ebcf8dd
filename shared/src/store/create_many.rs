//! `-> queued` for many runs at once (`POST /v1/runs/batch`): the runs on new threads are
//! written by one statement that inserts every thread, every run and every user message from
//! arrays, instead of one statement (and round trip) per run. The rows and columns are those
//! of `transitions::create`; runs on an existing thread keep that per-run path (its thread
//! lock and active-run check), in the same transaction as this statement when a batch mixes
//! both.

use std::borrow::Borrow;

use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::StoreError;
use super::active_runs;
use super::messages;
use super::runs::RunRow;
use super::transitions::NewRun;

/// The threads, the runs and their user messages as CTEs of one statement over `UNNEST`ed
/// arrays (one element per run). One statement rather than three in a transaction: outside a
/// transaction it is one round trip and one commit. Foreign keys are checked at the
/// statement's end, when all rows exist. `EXPLAIN (ANALYZE, BUFFERS)` of 1,000 rows found it
/// no more expensive than `jsonb_to_recordset` over one document (which also needs the
/// hashes hex-encoded) or three statements.
///
/// A run is held when its tenant has a running limit (`fair`), or when it is under the fair
/// share (`windowed`) and past what is left of its tenant's window: `fair_share_room` once per
/// tenant ($13..$15: `fair_share_window`'s arguments), the first that many runs of the tenant
/// in the statement published, the rest held.
///
/// A run with a `max_active_runs` ($17, 0: none) is written only if its tenant stays within
/// it: `lock_and_count_active` (migration 0033) takes the creation locks of those tenants,
/// held until the statement commits, and counts their active runs; of each tenant's runs in
/// the statement, the first that fit are written and the rest are left out (not returned).
/// The function runs only when a run has a limit.
const RUNS_ON_NEW_THREADS: &str = "
WITH given AS (
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::jsonb[], $5::jsonb[],
                         $6::text[], $7::bytea[], $8::int4[], $9::jsonb[], $10::bool[],
                         $12::text[], $16::bool[], $17::int8[]) WITH ORDINALITY
        AS t(id, tenant_id, thread_id, agent, metadata, idempotency_key, request_hash,
             max_iterations, body, fair, traceparent, windowed, max_active, ord)),
 counted AS (
    SELECT c.tenant_id, c.active
    FROM (SELECT ARRAY(SELECT DISTINCT tenant_id FROM given WHERE max_active > 0) AS ts) l,
         LATERAL lock_and_count_active(l.ts) c
    WHERE cardinality(l.ts) > 0),
 input AS (
    SELECT g.* FROM (
        SELECT g.*, row_number() OVER (PARTITION BY g.tenant_id, g.max_active > 0
                                       ORDER BY g.ord) AS nth
        FROM given g) g
    LEFT JOIN counted c ON c.tenant_id = g.tenant_id
    WHERE g.max_active <= 0 OR COALESCE(c.active, 0) + g.nth <= g.max_active),
 room AS (
    SELECT t.tenant_id, fair_share_room(t.tenant_id, w.n) AS free
    FROM (SELECT DISTINCT tenant_id FROM input WHERE windowed AND NOT fair) t,
         (SELECT fair_share_window($13, $14, $15) AS n) w),
 placed AS (
    SELECT i.*, row_number() OVER (PARTITION BY i.tenant_id, i.windowed AND NOT i.fair
                                   ORDER BY i.ord) AS pos
    FROM input i),
 thread AS (
    INSERT INTO threads (id, tenant_id) SELECT thread_id, tenant_id FROM input),
 run AS (
    INSERT INTO runs (id, tenant_id, thread_id, status, agent, metadata,
                      idempotency_key, request_hash, max_iterations, held, fair, batch_id,
                      traceparent)
    SELECT p.id, p.tenant_id, p.thread_id, 'queued', p.agent, p.metadata,
           p.idempotency_key, p.request_hash, p.max_iterations,
           p.fair OR (p.windowed AND p.pos > COALESCE(r.free, 0)), p.fair OR p.windowed,
           $11::uuid, p.traceparent
    FROM placed p LEFT JOIN room r ON r.tenant_id = p.tenant_id
    RETURNING *),
 message AS (
    INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
    SELECT thread_id, id, 'user', true, body FROM input)
SELECT * FROM run";

/// `-> queued` for runs that each start a new thread (`thread_id` must be `None`): a thread,
/// the run and its user message per run, all in one statement, so all or none are written.
/// Returns the rows in the order of `runs`. Pass a transaction to make it part of a larger
/// all-or-nothing write, or the pool for a single round trip.
pub async fn create_on_new_threads<'e, R: Borrow<NewRun>>(
    executor: impl sqlx::PgExecutor<'e>,
    runs: &[R],
) -> Result<Vec<RunRow>, StoreError> {
    create_on_new_threads_in(executor, runs, None).await
}

/// [`create_on_new_threads`], the runs belonging to batch `batch` (`runs.batch_id`; `None`:
/// no batch) from their insert on, so no later update touches the hot rows.
pub async fn create_on_new_threads_in<'e, R: Borrow<NewRun>>(
    executor: impl sqlx::PgExecutor<'e>,
    runs: &[R],
    batch: Option<Uuid>,
) -> Result<Vec<RunRow>, StoreError> {
    let rows = insert(executor, runs, |_| None, batch).await?;
    let ids: Vec<Uuid> = runs.iter().map(|r| r.borrow().id).collect();
    in_order(&ids, rows)
}

/// The statement ([`RUNS_ON_NEW_THREADS`]) for `runs`, each within `limit(i)` (its tenant's
/// `max_active_runs`, `None`: no limit); the rows written, in no order.
async fn insert<'e, R: Borrow<NewRun>>(
    executor: impl sqlx::PgExecutor<'e>,
    runs: &[R],
    limit: impl Fn(usize) -> Option<u32>,
    batch: Option<Uuid>,
) -> Result<Vec<RunRow>, StoreError> {
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    debug_assert!(runs.iter().all(|r| r.borrow().thread_id.is_none()));
    let n = runs.len();
    let mut ids = Vec::with_capacity(n);
    let mut tenants = Vec::with_capacity(n);
    let mut threads = Vec::with_capacity(n);
    let mut agents = Vec::with_capacity(n);
    let mut metadata = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut hashes = Vec::with_capacity(n);
    let mut max_iterations = Vec::with_capacity(n);
    let mut bodies = Vec::with_capacity(n);
    let mut fair = Vec::with_capacity(n);
    let mut traceparents = Vec::with_capacity(n);
    let mut windowed = Vec::with_capacity(n);
    let mut max_active: Vec<i64> = Vec::with_capacity(n);
    // One configuration per process: the first run under the fair share gives its arguments.
    let share = super::fair_dispatch::share_args(runs.iter().find_map(|r| r.borrow().share));
    for (i, run) in runs.iter().enumerate() {
        let run = run.borrow();
        max_active.push(limit(i).map_or(0, i64::from));
        ids.push(run.id);
        tenants.push(run.tenant_id);
        threads.push(Uuid::now_v7());
        agents.push(Json(&run.agent));
        metadata.push(Json(&run.metadata));
        keys.push(run.idempotency_key.as_deref());
        hashes.push(run.request_hash.as_deref());
        max_iterations.push(run.max_iterations);
        bodies.push(Json(messages::user_body(&run.input)));
        fair.push(run.fair);
        traceparents.push(run.traceparent.as_deref());
        windowed.push(run.share.is_some());
    }
    let rows = sqlx::query_as::<_, RunRow>(RUNS_ON_NEW_THREADS)
        .bind(&ids)
        .bind(&tenants)
        .bind(&threads)
        .bind(&agents)
        .bind(&metadata)
        .bind(&keys)
        .bind(&hashes)
        .bind(&max_iterations)
        .bind(&bodies)
        .bind(&fair)
        .bind(batch)
        .bind(&traceparents)
        .bind(share.0)
        .bind(share.1)
        .bind(share.2)
        .bind(&windowed)
        .bind(&max_active)
        .fetch_all(executor)
        .await?;
    Ok(rows)
}

/// A run to create on a new thread, with its tenant's `limits.max_active_runs` (`None`: no
/// limit).
#[derive(Clone)]
pub struct LimitedRun {
    pub run: NewRun,
    pub max_active: Option<u32>,
}

/// [`create_on_new_threads`] for single creates grouped together (`POST /v1/runs`), each within
/// its tenant's `max_active_runs`: per run, in order, its row, or
/// [`StoreError::TooManyActiveRuns`] for a run that would take its tenant past the limit
/// (nothing of it is written). Still one statement: it takes the creation locks of the limited
/// tenants itself (see [`RUNS_ON_NEW_THREADS`]), so concurrent creates, on any replica, can
/// never together pass a limit.
pub async fn create_within_limits(
    conn: &mut PgConnection,
    items: &[LimitedRun],
) -> Result<Vec<Result<RunRow, StoreError>>, StoreError> {
    let runs: Vec<&NewRun> = items.iter().map(|i| &i.run).collect();
    let rows = insert(&mut *conn, &runs, |i| items[i].max_active, None).await?;
    let mut by_id: std::collections::HashMap<Uuid, RunRow> =
        rows.into_iter().map(|r| (r.id, r)).collect();
    let mut answers = Vec::with_capacity(items.len());
    // Left out by the limit (rare): the count it went by, for the refusal's message, read
    // again without the lock.
    let mut counts = std::collections::HashMap::new();
    for item in items {
        if let Some(row) = by_id.remove(&item.run.id) {
            answers.push(Ok(row));
            continue;
        }
        let Some(max) = item.max_active else {
            return Err(StoreError::Db(sqlx::Error::Protocol(format!(
                "run {} was inserted but not returned",
                item.run.id
            ))));
        };
        let tenant = item.run.tenant_id;
        let active = match counts.get(&tenant) {
            Some(n) => *n,
            None => {
                let n = active_runs::count(&mut *conn, tenant).await?;
                counts.insert(tenant, n);
                n
            }
        };
        answers.push(Err(StoreError::TooManyActiveRuns {
            max,
            active: active.max(i64::from(max)),
            new_runs: 1,
        }));
    }
    Ok(answers)
}

/// `RETURNING` promises no order: the rows, arranged as `ids` lists them.
fn in_order(ids: &[Uuid], rows: Vec<RunRow>) -> Result<Vec<RunRow>, StoreError> {
    let mut by_id: std::collections::HashMap<Uuid, RunRow> =
        rows.into_iter().map(|r| (r.id, r)).collect();
    ids.iter()
        .map(|id| {
            by_id.remove(id).ok_or_else(|| {
                StoreError::Db(sqlx::Error::Protocol(format!(
                    "run {id} was inserted but not returned"
                )))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::AgentSpec;
    use crate::store::transitions;

    async fn tenant(pool: &sqlx::PgPool) -> Uuid {
        crate::store::tenants::create(pool, "t")
            .await
            .unwrap()
            .tenant_id
    }

    fn new_run(tenant_id: Uuid, i: usize) -> NewRun {
        let agent: AgentSpec = serde_json::from_value(json!({"model": "m"})).unwrap();
        NewRun {
            id: Uuid::now_v7(),
            tenant_id,
            thread_id: None,
            agent,
            max_iterations: 7,
            metadata: json!({"i": i}),
            idempotency_key: None,
            request_hash: Some(vec![i as u8; 32]),
            input: format!("hello {i}"),
            fair: false,
            share: None,
            traceparent: None,
        }
    }

    /// The same rows and columns as `transitions::create` writes for one run.
    #[sqlx::test(migrations = "../migrations")]
    async fn writes_what_the_per_run_path_writes(pool: sqlx::PgPool) {
        let tenant = tenant(&pool).await;
        let runs: Vec<NewRun> = (0..50).map(|i| new_run(tenant, i)).collect();
        let rows = create_on_new_threads(&pool, &runs).await.unwrap();
        assert_eq!(
            rows.iter().map(|r| r.id).collect::<Vec<_>>(),
            runs.iter().map(|r| r.id).collect::<Vec<_>>(),
            "in request order"
        );
        let mut conn = pool.acquire().await.unwrap();
        let one = transitions::create(&mut conn, new_run(tenant, 3))
            .await
            .unwrap();
        let many = &rows[3];
        assert_eq!(many.status, one.status);
        assert_eq!(many.agent.0, one.agent.0);
        assert_eq!(many.metadata.0, one.metadata.0);
        assert_eq!(many.request_hash, one.request_hash);
        assert_eq!(many.max_iterations, one.max_iterations);
        assert_eq!(many.idempotency_key, one.idempotency_key);
        let message = |run: Uuid| {
            sqlx::query_as::<_, (Uuid, String, bool, serde_json::Value, Option<i32>)>(
                "SELECT thread_id, role, is_llm_message, body, iteration FROM messages WHERE run_id = $1",
            )
            .bind(run)
            .fetch_one(&pool)
        };
        let (m_thread, m_role, m_llm, m_body, m_iter) = message(many.id).await.unwrap();
        let (_, o_role, o_llm, o_body, o_iter) = message(one.id).await.unwrap();
        assert_eq!(m_thread, many.thread_id);
        assert_eq!(
            (m_role, m_llm, m_body, m_iter),
            (o_role, o_llm, o_body, o_iter)
        );
        let threads: Vec<(Uuid,)> =
            sqlx::query_as("SELECT tenant_id FROM threads WHERE id = ANY($1)")
                .bind(rows.iter().map(|r| r.thread_id).collect::<Vec<_>>())
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(threads.len(), 50, "one new thread per run");
        assert!(threads.iter().all(|(t,)| *t == tenant));
    }

    /// A failing row writes nothing at all.
    #[sqlx::test(migrations = "../migrations")]
    async fn all_or_nothing(pool: sqlx::PgPool) {
        let tenant = tenant(&pool).await;
        let mut runs: Vec<NewRun> = (0..10).map(|i| new_run(tenant, i)).collect();
        runs[7].max_iterations = 0; // violates the check constraint
        assert!(create_on_new_threads(&pool, &runs).await.is_err());
        let counts: (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM threads), (SELECT count(*) FROM runs),
                    (SELECT count(*) FROM messages)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(counts, (0, 0, 0));
    }

    /// A run's agent (a few realistic tools: kilobytes of JSON) is compressed with lz4, not
    /// pglz, Postgres's default and several times dearer to write (migrations 0021-0023), on
    /// a server that has lz4 (Debian's has).
    #[sqlx::test(migrations = "../migrations")]
    async fn a_large_agent_is_compressed_with_lz4(pool: sqlx::PgPool) {
        let tenant = tenant(&pool).await;
        let tools: Vec<_> = (0..20)
            .map(|i| {
                json!({"name": format!("tool_{i}"), "kind": "http",
                       "description": format!("tool number {i} of the agent, described at length"),
                       "url": "http://tools.example/x",
                       "parameters": {"type": "object", "properties": {
                           "query": {"type": "string", "description": "what to look for"},
                           "limit": {"type": "integer", "minimum": 1, "maximum": 100}}}})
            })
            .collect();
        let mut run = new_run(tenant, 0);
        run.agent = serde_json::from_value(json!({"model": "m", "tools": tools})).unwrap();
        let rows = create_on_new_threads(&pool, &[run]).await.unwrap();
        let (lz4,): (bool,) = sqlx::query_as(
            "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let (method, size): (Option<String>, i32) = sqlx::query_as(
            "SELECT pg_column_compression(agent), pg_column_size(agent) FROM runs WHERE id = $1",
        )
        .bind(rows[0].id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let expected = if lz4 { "lz4" } else { "pglz" };
        assert_eq!(method.as_deref(), Some(expected), "stored in {size} bytes");
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_group_writes_what_fits_each_tenants_limit_and_nothing_of_the_rest(
        pool: sqlx::PgPool,
    ) {
        let (a, b) = (tenant(&pool).await, tenant(&pool).await);
        create_on_new_threads(&pool, &[new_run(a, 0)])
            .await
            .unwrap();
        let items: Vec<LimitedRun> = [
            (a, Some(3)),
            (b, None),
            (a, Some(3)),
            (a, Some(3)),
            (b, None),
        ]
        .iter()
        .enumerate()
        .map(|(i, (t, max))| LimitedRun {
            run: new_run(*t, i + 1),
            max_active: *max,
        })
        .collect();
        let mut conn = pool.acquire().await.unwrap();
        let answers = create_within_limits(&mut conn, &items).await.unwrap();
        // A had 1 of 3: its first two runs fit, its third does not; B has no limit.
        let written: Vec<bool> = answers.iter().map(|a| a.is_ok()).collect();
        assert_eq!(written, [true, true, true, false, true]);
        assert!(matches!(
            answers[3],
            Err(StoreError::TooManyActiveRuns {
                max: 3,
                active: 3,
                new_runs: 1
            })
        ));
        let left_out: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM runs WHERE id = $1) + (SELECT count(*) FROM messages WHERE run_id = $1)",
        )
        .bind(items[3].run.id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left_out, 0, "nothing of a refused run is written");
        let threads: i64 = sqlx::query_scalar("SELECT count(*) FROM threads WHERE tenant_id = $1")
            .bind(a)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(threads, 3, "no thread for the refused run");
    }
}
