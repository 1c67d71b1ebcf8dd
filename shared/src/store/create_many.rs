//! `-> queued` for many runs at once (`POST /v1/runs/batch`): the runs on new threads are
//! written by one statement that inserts every thread, every run and every user message from
//! arrays, instead of one statement (and round trip) per run. The rows and columns are those
//! of `transitions::create`; runs on an existing thread keep that per-run path (its thread
//! lock and active-run check), in the same transaction as this statement when a batch mixes
//! both.

use std::borrow::Borrow;

use sqlx::types::Json;
use sqlx::{Connection, PgConnection};
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
const RUNS_ON_NEW_THREADS: &str = "
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::jsonb[], $5::jsonb[],
                         $6::text[], $7::bytea[], $8::int4[], $9::jsonb[], $10::bool[],
                         $12::text[], $16::bool[]) WITH ORDINALITY
        AS t(id, tenant_id, thread_id, agent, metadata, idempotency_key, request_hash,
             max_iterations, body, fair, traceparent, windowed, ord)),
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
    // One configuration per process: the first run under the fair share gives its arguments.
    let share = super::fair_dispatch::share_args(runs.iter().find_map(|r| r.borrow().share));
    for run in runs {
        let run = run.borrow();
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
        .fetch_all(executor)
        .await?;
    in_order(&ids, rows)
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
/// (nothing of it is written). With a limited tenant in the group, the write is a transaction
/// that takes the creation locks of the limited tenants first (`active_runs::lock_and_count`,
/// one round trip for all of them), so concurrent creates can never together pass a limit;
/// without one it is the single statement.
pub async fn create_within_limits(
    conn: &mut PgConnection,
    items: &[LimitedRun],
) -> Result<Vec<Result<RunRow, StoreError>>, StoreError> {
    let mut limited: Vec<Uuid> = items
        .iter()
        .filter(|i| i.max_active.is_some())
        .map(|i| i.run.tenant_id)
        .collect();
    if limited.is_empty() {
        let runs: Vec<&NewRun> = items.iter().map(|i| &i.run).collect();
        return Ok(create_on_new_threads(conn, &runs)
            .await?
            .into_iter()
            .map(Ok)
            .collect());
    }
    limited.sort_unstable();
    limited.dedup();
    let mut tx = conn.begin().await?;
    let mut active = active_runs::lock_and_count(&mut tx, &limited).await?;
    let mut refusals = Vec::with_capacity(items.len());
    let mut admitted = Vec::with_capacity(items.len());
    for item in items {
        if let Some(max) = item.max_active {
            let n = active.entry(item.run.tenant_id).or_default();
            if let Err(refused) = active_runs::check(*n, max, 1) {
                refusals.push(Some(refused));
                continue;
            }
            *n += 1;
        }
        refusals.push(None);
        admitted.push(&item.run);
    }
    let rows = create_on_new_threads(&mut *tx, &admitted).await?;
    tx.commit().await?;
    let mut rows = rows.into_iter();
    refusals
        .into_iter()
        .map(|refused| match refused {
            Some(e) => Ok(Err(e)),
            None => rows.next().map(Ok).ok_or_else(|| {
                StoreError::Db(sqlx::Error::Protocol(
                    "a created run was not returned".into(),
                ))
            }),
        })
        .collect()
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
}
