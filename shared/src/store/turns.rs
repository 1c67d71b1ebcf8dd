//! Committing a model turn: the assistant message, its tool calls, the iteration counter and
//! the usage, fenced by the holder's attempt, in one statement; for a final answer, the run's
//! end too.
//!
//! One statement instead of a transaction of six round trips (BEGIN, fence lock, message,
//! one INSERT per call, counters, COMMIT): it is the hottest write of the loop. The fence row
//! is locked first (`FOR UPDATE`); every other part selects from it, so a stale holder writes
//! nothing at all.

use serde_json::Value;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

#[cfg(doc)]
use super::tool_calls::NewToolCall;
use super::{Fence, StoreError};

/// A model turn to commit. Owned: it may wait to be written with other runs' turns (see
/// [`super::group_commit`]).
pub struct Turn {
    pub fence: Fence,
    pub thread_id: Uuid,
    pub iteration: i32,
    /// The assistant message as the OpenAI chat message object.
    pub message: Value,
    /// The calls, as [`NewToolCall::row`] makes them.
    pub tool_calls: Vec<Value>,
    /// Usage of the model call, clamped to `0..=MAX_TURN_TOKENS` (see [`Turn::usage`]).
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// The part of prompt + completion the worker estimated (the provider reported no usage).
    pub estimated_tokens: i64,
    /// The last event id the holder has appended: recorded so that ids continue past it if
    /// Redis loses the run's list and the holder dies.
    pub last_event_id: u64,
    /// The previous iteration's timing, written by this statement instead of one of its own.
    pub timing: Option<IterationTiming>,
    /// Timings of other runs' final iterations that this statement carries (statistics: a
    /// final turn's timing closes only once its commit has answered, after the statement that
    /// could have written it; see [`Turn::ends`]).
    pub carried: Vec<IterationTiming>,
    /// A final answer (no tool calls): the statement also ends the run `completed`, so a run's
    /// last turn and its end cost one write. The iteration's timing is written later, by a
    /// statement that carries it.
    pub ends: bool,
}

/// Most tokens one model call may add to the figures: a hostile or broken provider's usage
/// is clamped to `0..=MAX_TURN_TOKENS`, so the sums can never overflow `bigint`.
pub const MAX_TURN_TOKENS: i64 = 1_000_000_000;

/// What a committed turn brought the run and its tenant to, for the budget check that decides
/// whether another model call may start. Read back by the commit statement itself.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Committed {
    /// Prompt + completion tokens of the run so far.
    pub run_tokens: i64,
    /// Prompt + completion tokens of the run's tenant this UTC day, this turn included.
    pub tenant_tokens_today: i64,
    /// The tenant's own `tokens_per_day` (`tenants.limits`), as stored; `None`: the default.
    pub tenant_tokens_per_day: Option<Json<Value>>,
    /// For a turn that ended its run ([`Turn::ends`]): the run waiting for the thread that
    /// the end promoted (double-texting), to publish.
    pub promoted: Option<Uuid>,
}

impl Turn {
    /// Usage as the turn records it: clamped to `0..=MAX_TURN_TOKENS` each, and all of it
    /// counted as estimated when `estimated`.
    pub fn usage(prompt: i64, completion: i64, estimated: bool) -> (i64, i64, i64) {
        let (p, c) = (
            prompt.clamp(0, MAX_TURN_TOKENS),
            completion.clamp(0, MAX_TURN_TOKENS),
        );
        (p, c, if estimated { p + c } else { 0 })
    }
}

/// Commits turns of several runs in one statement; per turn, `None` if its fence did not
/// hold, else the usage figures the budget check needs. The fence is the `UPDATE runs`
/// itself: it locks each run's row (a concurrent claim waits, or has already bumped `attempt`
/// and the update skips the row), and every insert joins what it returned, so a stale holder
/// writes nothing at all. The update changes no indexed column, so it is a HOT update (see
/// migration 0003).
///
/// Usage rides along: the run's counters, and one upsert per tenant of the group into the
/// day's shard of this connection (`usage_shards`, migration 0017: groups on other
/// connections lock other rows, so they do not wait for this one's commit), summed first so a
/// row is touched once, in tenant order so two groups that do share a shard wait instead of
/// deadlocking. The tenant's figure for the day after this group is the shard's `RETURNING`
/// plus the other rows of the day as this statement sees them.
///
/// A turn that `ends` also moves its run to `completed` (lease released, `finished_at`),
/// as [`super::transitions::end_many`] would, and reads the run its end promoted the same way.
/// Setting `status` to itself on the other rows keeps their update HOT (the value is unchanged)
/// and fires no trigger (each trigger's `WHEN` asks for a change of status).
pub async fn record_many<'e>(
    db: impl sqlx::PgExecutor<'e>,
    turns: &[Turn],
) -> Result<Vec<Option<Committed>>, StoreError> {
    let held: Vec<CommittedRow> = sqlx::query_as(concat!(
        "WITH input AS (
            SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::uuid[], $4::int[], $5::jsonb[],
                                 $6::jsonb[], $7::int8[], $8::int8[], $9::int8[], $10::jsonb[],
                                 $11::int8[], $13::bool[])
                AS t(run_id, attempt, thread_id, iteration, message, calls, prompt_tokens,
                     completion_tokens, last_event_id, timing, estimated_tokens, ends)),
         held AS (
            UPDATE runs r SET iteration = t.iteration,
                              prompt_tokens = r.prompt_tokens + t.prompt_tokens,
                              completion_tokens = r.completion_tokens + t.completion_tokens,
                              estimated_tokens = r.estimated_tokens + t.estimated_tokens,
                              tool_calls = r.tool_calls + jsonb_array_length(t.calls),
                              updated_at = now(),
                              last_event_id = GREATEST(r.last_event_id, t.last_event_id),
                              handbacks = 0,
                              status = CASE WHEN t.ends THEN 'completed' ELSE r.status END,
                              error = CASE WHEN t.ends THEN NULL ELSE r.error END,
                              lease_owner = CASE WHEN t.ends THEN NULL ELSE r.lease_owner END,
                              lease_expires_at = CASE WHEN t.ends THEN NULL
                                                      ELSE r.lease_expires_at END,
                              finished_at = CASE WHEN t.ends THEN now() ELSE r.finished_at END
            FROM input t
            WHERE r.id = ANY($1) AND r.id = t.run_id AND r.attempt = t.attempt
              AND r.status = $12
            RETURNING r.id, r.tenant_id, r.thread_id, t.ends,
                      r.prompt_tokens + r.completion_tokens AS run_tokens),
         shard AS (
            INSERT INTO usage_shards AS u (tenant_id, day, shard, prompt_tokens,
                                           completion_tokens, estimated_tokens, tool_calls, runs)
            SELECT held.tenant_id, (now() AT TIME ZONE 'UTC')::date,
                   (pg_backend_pid() % 32)::smallint,
                   sum(t.prompt_tokens)::bigint, sum(t.completion_tokens)::bigint,
                   sum(t.estimated_tokens)::bigint, sum(jsonb_array_length(t.calls))::bigint,
                   -- A turn of iteration 1 commits once per run (a stale holder writes nothing).
                   count(*) FILTER (WHERE t.iteration = 1)
            FROM input t JOIN held ON held.id = t.run_id
            GROUP BY held.tenant_id
            ORDER BY held.tenant_id
            ON CONFLICT (tenant_id, day, shard) DO UPDATE SET
                prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
                completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
                estimated_tokens = u.estimated_tokens + EXCLUDED.estimated_tokens,
                tool_calls = u.tool_calls + EXCLUDED.tool_calls,
                runs = u.runs + EXCLUDED.runs
            RETURNING u.tenant_id, u.day, u.shard,
                      u.prompt_tokens + u.completion_tokens AS shard_tokens),
         daily AS (
            SELECT s.tenant_id,
                   s.shard_tokens
                   + coalesce((SELECT sum(o.prompt_tokens + o.completion_tokens)::bigint
                               FROM usage_shards o
                               WHERE o.tenant_id = s.tenant_id AND o.day = s.day
                                 AND o.shard <> s.shard), 0)
                   + coalesce((SELECT o.prompt_tokens + o.completion_tokens
                               FROM usage_daily o
                               WHERE o.tenant_id = s.tenant_id AND o.day = s.day), 0)
                   AS tenant_tokens_today
            FROM shard s),
         message AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, iteration)
            SELECT t.thread_id, t.run_id, 'assistant', true, t.message, t.iteration
            FROM input t JOIN held ON held.id = t.run_id),
         calls AS (
            INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name,
                                    raw_arguments, arguments, risk, status, dispatch_count,
                                    started_at)
            SELECT c.id, t.run_id, c.tool_call_id, t.iteration, c.position, c.name,
                   c.raw_arguments, c.arguments, c.risk, c.status, c.dispatch_count,
                   CASE WHEN c.dispatch_count > 0 THEN now() END
            FROM input t JOIN held ON held.id = t.run_id,
                 jsonb_to_recordset(t.calls) AS c(id uuid, tool_call_id text, position int,
                     name text, raw_arguments text, arguments jsonb, risk text, status text,
                     dispatch_count int)),
         ",
        timing_cte!(),
        "
         SELECT held.id, held.run_tokens, daily.tenant_tokens_today,
                ten.limits -> 'tokens_per_day' AS tenant_tokens_per_day, w.id AS promoted
         FROM held JOIN daily ON daily.tenant_id = held.tenant_id
                   LEFT JOIN tenants ten ON ten.id = held.tenant_id
                   LEFT JOIN LATERAL (
                      SELECT id FROM runs w WHERE held.ends AND w.thread_id = held.thread_id
                         AND w.status = 'waiting_for_thread'
                       ORDER BY w.enqueued_at, w.id LIMIT 1) w ON true",
    ))
    .bind(turns.iter().map(|t| t.fence.run_id).collect::<Vec<_>>())
    .bind(turns.iter().map(|t| t.fence.attempt).collect::<Vec<_>>())
    .bind(turns.iter().map(|t| t.thread_id).collect::<Vec<_>>())
    .bind(turns.iter().map(|t| t.iteration).collect::<Vec<_>>())
    .bind(turns.iter().map(|t| Json(&t.message)).collect::<Vec<_>>())
    .bind(
        turns
            .iter()
            .map(|t| Json(&t.tool_calls))
            .collect::<Vec<_>>(),
    )
    .bind(turns.iter().map(|t| t.prompt_tokens).collect::<Vec<_>>())
    .bind(
        turns
            .iter()
            .map(|t| t.completion_tokens)
            .collect::<Vec<_>>(),
    )
    .bind(
        turns
            .iter()
            .map(|t| t.last_event_id as i64)
            .collect::<Vec<_>>(),
    )
    .bind(
        turns
            .iter()
            .map(|t| Json(t.timing.iter().chain(&t.carried).collect::<Vec<_>>()))
            .collect::<Vec<_>>(),
    )
    .bind(turns.iter().map(|t| t.estimated_tokens).collect::<Vec<_>>())
    .bind(super::RUNNING)
    .bind(turns.iter().map(|t| t.ends).collect::<Vec<_>>())
    .fetch_all(db)
    .await?;
    let mut by_run: std::collections::HashMap<Uuid, Committed> =
        held.into_iter().map(|r| (r.id, r.committed)).collect();
    Ok(turns
        .iter()
        .map(|t| by_run.remove(&t.fence.run_id))
        .collect())
}

#[derive(sqlx::FromRow)]
struct CommittedRow {
    id: Uuid,
    #[sqlx(flatten)]
    committed: Committed,
}

/// What one iteration cost, for the framework-time statistics (`iterations`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct IterationTiming {
    pub run_id: Uuid,
    pub iteration: i32,
    pub attempt: i32,
    pub started: chrono::DateTime<chrono::Utc>,
    pub finished: chrono::DateTime<chrono::Utc>,
    pub model_us: i64,
    pub tools_us: i64,
    pub total_us: i64,
}

/// Records an iteration's timing once (a redone iteration keeps its first record).
pub async fn record_timing(pool: &PgPool, t: &IterationTiming) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO iterations (run_id, iteration, attempt, started_at, finished_at, model_us, tools_us, total_us)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8
         -- Not for a run that no longer exists (its tenant erased).
         WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1)
         ON CONFLICT DO NOTHING",
    )
    .bind(t.run_id)
    .bind(t.iteration)
    .bind(t.attempt)
    .bind(t.started)
    .bind(t.finished)
    .bind(t.model_us)
    .bind(t.tools_us)
    .bind(t.total_us)
    .execute(pool)
    .await?;
    Ok(())
}

/// Records timings that no statement carried (a worker with no turn to write them with), in
/// one statement; an iteration already recorded keeps its first record, and one of a run that
/// no longer exists (its tenant erased) is dropped.
pub async fn record_timings(pool: &PgPool, timings: &[IterationTiming]) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO iterations (run_id, iteration, attempt, started_at, finished_at, model_us,
                                 tools_us, total_us)
         SELECT x.run_id, x.iteration, x.attempt, x.started, x.finished, x.model_us, x.tools_us,
                x.total_us
         FROM jsonb_to_recordset($1) AS x(run_id uuid, iteration int, attempt int,
             started timestamptz, finished timestamptz, model_us bigint, tools_us bigint,
             total_us bigint)
         -- Written late, after the run's end: its tenant may have been erased since.
         WHERE EXISTS (SELECT 1 FROM runs r WHERE r.id = x.run_id)
         ON CONFLICT DO NOTHING",
    )
    .bind(Json(timings))
    .execute(pool)
    .await?;
    Ok(())
}

/// The parameter [`timing_cte`] reads.
pub(crate) fn timing_param(timing: Option<&IterationTiming>) -> Json<Vec<&IterationTiming>> {
    Json(timing.into_iter().collect())
}
