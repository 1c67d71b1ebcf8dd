//! Plan-and-solve (docs/architecture.md "Plan and solve"): a planner's round of tasks, created
//! by the `plan` call's turn commit, and what the fan-in and the API read of them.
//!
//! The fan-in itself is the trigger `runs_task_ended` (migration 0034): the transaction that
//! ends a round's last task makes the planner `queued` again, whoever ends the task.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::turns::{self, Committed, Turn};
use super::{StoreError, messages};
use crate::domain::{AgentSpec, RunStatus};

/// One task of a `plan` call, as the model gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub title: String,
    pub input: String,
}

/// A round to create with the planner's turn.
pub struct NewRound {
    pub round: i32,
    pub tasks: Vec<NewTask>,
    /// The agent every task runs (`AgentSpec::executor`).
    pub executor: AgentSpec,
    pub max_iterations: i32,
    /// Tasks of the round in flight at once; the others are created `waiting_for_slot`.
    pub max_parallel: i32,
    /// The configured `limits.max_active_runs` (the tenant's own limit, if set, wins).
    pub max_active_runs: u32,
}

/// A task as its round's creation made it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CreatedTask {
    pub id: Uuid,
    pub thread_id: Uuid,
    pub task_index: i32,
    pub status: RunStatus,
    pub held: bool,
}

/// Commits the planner's turn and its round in one transaction: the turn (as
/// [`turns::record_many`] writes it, fenced), one run per task (each on a new thread, with its
/// input as the user message; `queued` up to `max_parallel`, the rest `waiting_for_slot`; held
/// for fair dispatch when the planner is `fair`), and the planner `waiting_for_tasks` with no
/// lease. `None` if the fence did not hold: nothing is written. A round is created once: a
/// stale holder's turn writes nothing, and `runs_tasks` refuses a second copy.
///
/// The tasks are runs of the planner's tenant: under the tenant's creation lock, as any create,
/// they are refused ([`StoreError::TooManyActiveRuns`], nothing written) when they would take
/// it past its `max_active_runs` (the worker checks [`room_for_tasks`] first and gives the
/// model the refusal; this only loses a race with a concurrent create).
pub async fn commit_round(
    pool: &PgPool,
    turn: Turn,
    round: NewRound,
) -> Result<Option<(Committed, Vec<CreatedTask>)>, StoreError> {
    let fence = turn.fence;
    let mut tx = pool.begin().await?;
    let (tenant, max) = max_active_runs(&mut *tx, fence.run_id, round.max_active_runs).await?;
    if max > 0 {
        super::active_runs::reserve(&mut tx, tenant, max, round.tasks.len()).await?;
    }
    let Some(committed) = turns::record_many(&mut *tx, std::slice::from_ref(&turn))
        .await?
        .pop()
        .flatten()
    else {
        return Ok(None);
    };
    let n = round.tasks.len();
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    let threads: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    let indexes: Vec<i32> = (0..n as i32).collect();
    let titles: Vec<&str> = round.tasks.iter().map(|t| t.title.as_str()).collect();
    let bodies: Vec<Json<serde_json::Value>> = round
        .tasks
        .iter()
        .map(|t| Json(messages::user_body(&t.input)))
        .collect();
    let created: Vec<CreatedTask> = sqlx::query_as(
        "WITH parent AS (
            SELECT id, tenant_id, fair, traceparent FROM runs WHERE id = $1),
         input AS (
            SELECT * FROM UNNEST($2::uuid[], $3::uuid[], $4::int[], $5::text[], $6::jsonb[])
                AS t(id, thread_id, task_index, title, body)),
         thread AS (
            INSERT INTO threads (id, tenant_id)
            SELECT t.thread_id, p.tenant_id FROM input t, parent p),
         task AS (
            INSERT INTO runs (id, tenant_id, thread_id, status, agent, metadata, max_iterations,
                              held, fair, traceparent, parent_run_id, plan_round, task_index,
                              task_title)
            SELECT t.id, p.tenant_id, t.thread_id,
                   CASE WHEN t.task_index < $9 THEN 'queued' ELSE 'waiting_for_slot' END,
                   $7, '{}'::jsonb, $8, t.task_index < $9 AND p.fair, p.fair, p.traceparent,
                   p.id, $10, t.task_index, t.title
            FROM input t, parent p
            RETURNING id, thread_id, task_index, status, held),
         message AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
            SELECT t.thread_id, t.id, 'user', true, t.body FROM input t)
         SELECT id, thread_id, task_index, status, held FROM task ORDER BY task_index",
    )
    .bind(fence.run_id)
    .bind(&ids)
    .bind(&threads)
    .bind(&indexes)
    .bind(&titles)
    .bind(&bodies)
    .bind(Json(&round.executor))
    .bind(round.max_iterations)
    .bind(round.max_parallel)
    .bind(round.round)
    .fetch_all(&mut *tx)
    .await?;
    let waiting = sqlx::query(
        "UPDATE runs SET status = 'waiting_for_tasks', plan_round = $3, lease_owner = NULL,
                         lease_expires_at = NULL, updated_at = now()
         WHERE id = $1 AND attempt = $2 AND status = 'running'",
    )
    .bind(fence.run_id)
    .bind(fence.attempt)
    .bind(round.round)
    .execute(&mut *tx)
    .await?;
    if waiting.rows_affected() != 1 {
        return Ok(None);
    }
    tx.commit().await?;
    Ok(Some((committed, created)))
}

/// The tenant of run `run` and its effective `max_active_runs` (0: none) over the configured
/// `default`.
async fn max_active_runs<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    run: Uuid,
    default: u32,
) -> Result<(Uuid, u32), StoreError> {
    let (tenant, max): (Uuid, i64) = sqlx::query_as(
        "SELECT t.id, COALESCE((t.limits ->> 'max_active_runs')::int8, $2)
         FROM runs r JOIN tenants t ON t.id = r.tenant_id WHERE r.id = $1",
    )
    .bind(run)
    .bind(i64::from(default))
    .fetch_one(executor)
    .await?;
    Ok((tenant, u32::try_from(max).unwrap_or(u32::MAX)))
}

/// Whether the tenant of planner `run` has room for `tasks` more runs under its
/// `max_active_runs` (over the configured `default`), counted without a lock: the
/// [`StoreError::TooManyActiveRuns`] the model is told of. [`commit_round`] checks again under
/// the tenant's creation lock.
pub async fn room_for_tasks(
    pool: &PgPool,
    run: Uuid,
    default: u32,
    tasks: usize,
) -> Result<(), StoreError> {
    let (tenant, max) = max_active_runs(pool, run, default).await?;
    if max == 0 {
        return Ok(());
    }
    let active = super::active_runs::count(pool, tenant).await?;
    super::active_runs::check(active, max, tasks)
}

/// How one task of a round ended, for the planner's `plan` call result.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TaskResult {
    pub id: Uuid,
    pub task_index: i32,
    pub title: Option<String>,
    pub status: RunStatus,
    pub error: Option<Json<serde_json::Value>>,
    /// The task's last assistant text, if any.
    pub output: Option<String>,
}

/// The tasks of `round` of the planner `parent`, in task order, with their outputs.
pub async fn round_results(
    pool: &PgPool,
    parent: Uuid,
    round: i32,
) -> Result<Vec<TaskResult>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT r.id, r.task_index, r.task_title AS title, r.status, r.error,
                (SELECT m.body ->> 'content' FROM messages m
                  WHERE m.thread_id = r.thread_id AND m.run_id = r.id AND m.role = 'assistant'
                    AND jsonb_typeof(m.body -> 'content') = 'string'
                  ORDER BY m.id DESC LIMIT 1) AS output
         FROM runs r
         WHERE r.parent_run_id = $1 AND r.plan_round = $2
         ORDER BY r.task_index",
    )
    .bind(parent)
    .bind(round)
    .fetch_all(pool)
    .await?)
}

/// A task as the API lists it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TaskRow {
    pub id: Uuid,
    pub thread_id: Uuid,
    pub plan_round: i32,
    pub task_index: i32,
    pub title: Option<String>,
    pub status: RunStatus,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Every task of a planner of `tenant`, by round and place (through `runs_tasks`).
pub async fn tasks_of(
    pool: &PgPool,
    tenant: Uuid,
    parent: Uuid,
) -> Result<Vec<TaskRow>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, thread_id, plan_round, task_index, task_title AS title, status,
                prompt_tokens, completion_tokens, created_at, started_at, finished_at
         FROM runs WHERE parent_run_id = $1 AND tenant_id = $2
         ORDER BY plan_round, task_index",
    )
    .bind(parent)
    .bind(tenant)
    .fetch_all(pool)
    .await?)
}

/// After the end of a task of `round`: the planner and the round's tasks that are `queued` and
/// not held (made runnable by the end's trigger when its planner is not `fair`), to publish.
/// Publishing one twice is harmless (the second claim finds nothing).
pub async fn runnable_after_task(
    pool: &PgPool,
    parent: Uuid,
    round: i32,
) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM runs WHERE id = $1 AND status = 'queued' AND NOT held
         UNION ALL
         SELECT id FROM runs WHERE parent_run_id = $1 AND plan_round = $2
            AND status = 'queued' AND NOT held",
    )
    .bind(parent)
    .bind(round)
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::store::transitions::{self, Cancelled, Ending, NewRun};
    use crate::store::{Fence, runs, tenants};

    const LEASE: Duration = Duration::from_secs(10);

    /// A claimed planner (`fair` = false, so nothing is held).
    async fn planner(pool: &PgPool) -> runs::RunRow {
        let tenant = tenants::create(pool, "t").await.unwrap();
        let mut new = NewRun::for_test(tenant.tenant_id);
        new.agent =
            serde_json::from_value(json!({"model": "m", "mode": "plan_and_solve"})).expect("agent");
        new.max_iterations = 5;
        let run = transitions::create_on_new_thread(pool, new).await.unwrap();
        let claimed = transitions::claim(pool, run.id, "w", LEASE).await.unwrap();
        claimed.expect("claimed").run
    }

    fn plan_turn(run: &runs::RunRow) -> Turn {
        Turn {
            fence: Fence {
                run_id: run.id,
                attempt: run.attempt,
            },
            thread_id: run.thread_id,
            iteration: 1,
            message: json!({"role": "assistant", "content": null}),
            tool_calls: vec![json!({
                "id": Uuid::now_v7(), "tool_call_id": "call_plan", "position": 0,
                "name": "plan", "raw_arguments": "{}", "arguments": {}, "risk": "low",
                "status": "running", "dispatch_count": 1})],
            prompt_tokens: 1,
            completion_tokens: 1,
            estimated_tokens: 0,
            last_event_id: 3,
            timing: None,
            carried: Vec::new(),
            ends: false,
        }
    }

    fn round(n: usize, max_parallel: i32) -> NewRound {
        NewRound {
            round: 1,
            tasks: (0..n)
                .map(|i| NewTask {
                    title: format!("t{i}"),
                    input: format!("do {i}"),
                })
                .collect(),
            executor: serde_json::from_value(json!({"model": "m"})).unwrap(),
            max_iterations: 3,
            max_parallel,
            max_active_runs: 0,
        }
    }

    async fn status(pool: &PgPool, id: Uuid) -> RunStatus {
        runs::get(pool, id).await.unwrap().status
    }

    /// Ends a claimed task (`completed`, as a holder's end does).
    async fn end(pool: &PgPool, task: &runs::RunRow) {
        let ended = transitions::end_many(
            pool,
            &[Ending {
                fence: Fence {
                    run_id: task.id,
                    attempt: task.attempt,
                },
                status: RunStatus::Completed,
                last_event_id: 1,
                timing: None,
            }],
        )
        .await
        .unwrap();
        assert!(ended[0].held);
    }

    /// The round commits with the turn, once: the tasks up to `max_parallel` queued, the rest
    /// waiting, the planner waiting for them; the same turn again (a stale holder) writes
    /// nothing.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_round_is_created_once_with_its_turn(pool: PgPool) {
        let run = planner(&pool).await;
        let (_, created) = commit_round(&pool, plan_turn(&run), round(3, 2))
            .await
            .unwrap()
            .expect("the fence held");
        let statuses: Vec<RunStatus> = created.iter().map(|c| c.status).collect();
        assert_eq!(
            statuses,
            [
                RunStatus::Queued,
                RunStatus::Queued,
                RunStatus::WaitingForSlot
            ]
        );
        let parent = runs::get(&pool, run.id).await.unwrap();
        assert_eq!(
            (parent.status, parent.plan_round, parent.lease_owner),
            (RunStatus::WaitingForTasks, 1, None)
        );
        assert!(
            commit_round(&pool, plan_turn(&run), round(3, 2))
                .await
                .unwrap()
                .is_none(),
            "a replayed turn creates nothing"
        );
        assert_eq!(
            tasks_of(&pool, run.tenant_id, run.id).await.unwrap().len(),
            3
        );
        let task = runs::get(&pool, created[0].id).await.unwrap();
        assert_eq!(task.parent_run_id, Some(run.id));
        assert_eq!(task.task_title.as_deref(), Some("t0"));
        assert_eq!(
            crate::store::active_runs::count(&pool, run.tenant_id)
                .await
                .unwrap(),
            4,
            "the waiting planner and its tasks, the waiting one included, have not ended"
        );
    }

    /// A round that would take the tenant past its `max_active_runs` (its own limit over the
    /// configured one) writes nothing, not even the turn; one that fits is created.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_round_past_the_tenants_active_runs_limit_is_refused(pool: PgPool) {
        let run = planner(&pool).await;
        sqlx::query("UPDATE tenants SET limits = '{\"max_active_runs\": 3}' WHERE id = $1")
            .bind(run.tenant_id)
            .execute(&pool)
            .await
            .unwrap();
        let limited = |n| NewRound {
            max_active_runs: 1000,
            ..round(n, 2)
        };
        assert!(matches!(
            room_for_tasks(&pool, run.id, 1000, 3).await,
            Err(StoreError::TooManyActiveRuns {
                max: 3,
                active: 1,
                new_runs: 3
            })
        ));
        assert!(matches!(
            commit_round(&pool, plan_turn(&run), limited(3)).await,
            Err(StoreError::TooManyActiveRuns {
                max: 3,
                active: 1,
                new_runs: 3
            })
        ));
        let parent = runs::get(&pool, run.id).await.unwrap();
        assert_eq!(
            (parent.status, parent.iteration),
            (RunStatus::Running, run.iteration)
        );
        assert!(
            tasks_of(&pool, run.tenant_id, run.id)
                .await
                .unwrap()
                .is_empty()
        );
        room_for_tasks(&pool, run.id, 1000, 2).await.unwrap();
        let (_, created) = commit_round(&pool, plan_turn(&run), limited(2))
            .await
            .unwrap()
            .expect("the fence held");
        assert_eq!(created.len(), 2);
        // The configured limit applies where the tenant has none of its own.
        sqlx::query("UPDATE tenants SET limits = '{}' WHERE id = $1")
            .bind(run.tenant_id)
            .execute(&pool)
            .await
            .unwrap();
        assert!(room_for_tasks(&pool, run.id, 3, 1).await.is_err());
        room_for_tasks(&pool, run.id, 0, 100).await.unwrap();
    }

    /// Each end releases the round's next waiting task; the planner becomes runnable exactly
    /// when the last task ended, also when two tasks end at once, and counts their tokens.
    #[sqlx::test(migrations = "../migrations")]
    async fn the_last_end_of_a_round_makes_the_planner_runnable(pool: PgPool) {
        let run = planner(&pool).await;
        let (_, created) = commit_round(&pool, plan_turn(&run), round(3, 2))
            .await
            .unwrap()
            .unwrap();
        let claim = |id| transitions::claim(&pool, id, "w", LEASE);
        let a = claim(created[0].id).await.unwrap().unwrap().run;
        let b = claim(created[1].id).await.unwrap().unwrap().run;
        end(&pool, &a).await;
        assert_eq!(status(&pool, created[2].id).await, RunStatus::Queued);
        assert_eq!(status(&pool, run.id).await, RunStatus::WaitingForTasks);
        let c = claim(created[2].id).await.unwrap().unwrap().run;
        // The round's last two end at once, in two transactions.
        tokio::join!(end(&pool, &b), end(&pool, &c));
        let parent = runs::get(&pool, run.id).await.unwrap();
        assert_eq!(parent.status, RunStatus::Queued);
        assert!(!parent.held);
        assert_eq!(
            runnable_after_task(&pool, run.id, 1).await.unwrap(),
            [run.id],
            "the planner, to publish"
        );
        let results = round_results(&pool, run.id, 1).await.unwrap();
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(|r| r.status == RunStatus::Completed));
    }

    /// Cancelling the planner cancels its unfinished tasks, running or waiting, with it.
    #[sqlx::test(migrations = "../migrations")]
    async fn cancelling_the_planner_cancels_its_tasks(pool: PgPool) {
        let run = planner(&pool).await;
        let (_, created) = commit_round(&pool, plan_turn(&run), round(3, 1))
            .await
            .unwrap()
            .unwrap();
        transitions::claim(&pool, created[0].id, "w", LEASE)
            .await
            .unwrap()
            .unwrap();
        let Cancelled::Now {
            previous, tasks, ..
        } = transitions::cancel(&pool, run.tenant_id, run.id)
            .await
            .unwrap()
        else {
            panic!("not cancelled now");
        };
        assert_eq!(previous, RunStatus::WaitingForTasks);
        let mut was: Vec<RunStatus> = tasks.iter().map(|t| t.previous).collect();
        was.sort_by_key(|s| s.as_str());
        assert_eq!(
            was,
            [
                RunStatus::Running,
                RunStatus::WaitingForSlot,
                RunStatus::WaitingForSlot
            ]
        );
        for c in &created {
            assert_eq!(status(&pool, c.id).await, RunStatus::Cancelled);
        }
        assert_eq!(status(&pool, run.id).await, RunStatus::Cancelled);
    }

    /// A task ended long ago is kept while its planner waits (the planner reads its result
    /// when the round ends), and goes by its window once the planner ended.
    #[sqlx::test(migrations = "../migrations")]
    async fn retention_keeps_the_tasks_of_a_planner_not_yet_ended(pool: PgPool) {
        use crate::store::retention;
        let run = planner(&pool).await;
        let (_, created) = commit_round(&pool, plan_turn(&run), round(2, 2))
            .await
            .unwrap()
            .unwrap();
        let first = transitions::claim(&pool, created[0].id, "w", LEASE)
            .await
            .unwrap()
            .unwrap()
            .run;
        end(&pool, &first).await;
        sqlx::query("UPDATE tenants SET retention = '{\"finished_runs_secs\": 1}' WHERE id = $1")
            .bind(run.tenant_id)
            .execute(&pool)
            .await
            .unwrap();
        let age = |id: Uuid| {
            sqlx::query("UPDATE runs SET finished_at = now() - interval '1 hour' WHERE id = $1")
                .bind(id)
                .execute(&pool)
        };
        age(first.id).await.unwrap();
        let settings = crate::config::Settings::load_with(None, Vec::new(), false)
            .expect("the defaults load")
            .retention;
        let removed = retention::remove_due(&pool, &settings).await.unwrap();
        assert_eq!(removed.runs, 0, "{removed:?}");
        assert_eq!(status(&pool, first.id).await, RunStatus::Completed);

        // The planner ends (cancelled: its other task with it); all three go.
        transitions::cancel(&pool, run.tenant_id, run.id)
            .await
            .unwrap();
        for id in [run.id, created[0].id, created[1].id] {
            age(id).await.unwrap();
        }
        let removed = retention::remove_due(&pool, &settings).await.unwrap();
        assert_eq!(removed.runs, 3, "{removed:?}");
    }

    /// A dead-lettered task, replayed and ended again, counts its tokens in its planner's
    /// `task_tokens` once.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_replayed_task_counts_its_tokens_once(pool: PgPool) {
        let run = planner(&pool).await;
        let (_, created) = commit_round(&pool, plan_turn(&run), round(2, 2))
            .await
            .unwrap()
            .unwrap();
        let task_tokens = |id: Uuid| {
            sqlx::query_scalar::<_, i64>("SELECT task_tokens FROM runs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
        };
        // Poisoned after 7 tokens: failed and dead-lettered, its tokens join the planner's.
        sqlx::query(
            "UPDATE runs SET status = 'failed', finished_at = now(), prompt_tokens = 5,
                             completion_tokens = 2,
                             error = '{\"code\": \"poison_run\", \"message\": \"x\"}'
             WHERE id = $1",
        )
        .bind(created[0].id)
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(task_tokens(run.id).await.unwrap(), 7);
        crate::store::dead_letters::replay(&pool, created[0].id, false)
            .await
            .unwrap();
        assert_eq!(task_tokens(run.id).await.unwrap(), 0);
        let task = transitions::claim(&pool, created[0].id, "w", LEASE)
            .await
            .unwrap()
            .unwrap()
            .run;
        sqlx::query("UPDATE runs SET prompt_tokens = 9 WHERE id = $1")
            .bind(task.id)
            .execute(&pool)
            .await
            .unwrap();
        end(&pool, &task).await;
        assert_eq!(task_tokens(run.id).await.unwrap(), 11, "9 + 2, once");
    }

    /// An erasure cancels a waiting planner before anything else active (its cancel takes its
    /// tasks with it; ending its tasks first would make it runnable again).
    #[sqlx::test(migrations = "../migrations")]
    async fn an_erasure_cancels_the_waiting_planner_first(pool: PgPool) {
        use crate::store::erasure::runs_to_cancel;
        let run = planner(&pool).await;
        commit_round(&pool, plan_turn(&run), round(3, 2))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            runs_to_cancel(&pool, run.tenant_id, 10, true)
                .await
                .unwrap(),
            [run.id]
        );
        transitions::cancel(&pool, run.tenant_id, run.id)
            .await
            .unwrap();
        assert!(
            runs_to_cancel(&pool, run.tenant_id, 10, true)
                .await
                .unwrap()
                .is_empty(),
            "its tasks, the waiting one included, went with it"
        );
    }
}
