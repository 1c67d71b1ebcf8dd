//! The `plan` section (`--only plan`).

use std::time::Duration;

use futures_util::{StreamExt, stream};
use serde_json::{Value, json};

use agentfleet_tests::harness::wait_for;
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// What a plan-and-solve round costs the fleet, under load: `--plan-parents` planners in flight
/// at once, each planning `--plan-rounds` rounds of `--plan-tasks` no-op tasks (one instant
/// model answer each, all of a round in parallel), then `complete` and a summary turn, on
/// `--workers` worker processes of `--slots` slots. By default every task in flight has a slot
/// (30 × 4 of 2 × 64), so the figures are a round's own cost rather than a backlog's wait.
/// Every phase of a round is read from timestamps the
/// fleet itself wrote, after the runs ended, so measuring adds no load but the completion
/// poll (a look-up of the planners' rows, at most every 100 ms):
///
/// - commit: the tasks' `created_at` (the `now()` of the planner's round transaction);
/// - a task running: its `started_at` (its claim);
/// - the last task ended: the round's latest `finished_at` (the transaction whose trigger makes
///   the planner `queued` again);
/// - the planner running again: the `started_at` of the timing row its next holding writes for
///   the `plan` call's iteration (the worker's clock, right after the claim);
/// - the round taken up: the `plan` call's `finished_at` (its result, the round's outcomes,
///   recorded).
pub async fn plan_rounds(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let smoke = ctx.args.smoke;
    let parents = ctx.args.plan_parents.unwrap_or(if smoke { 4 } else { 30 });
    let tasks = ctx.args.plan_tasks.unwrap_or(if smoke { 3 } else { 4 });
    let rounds = ctx.args.plan_rounds.unwrap_or(if smoke { 2 } else { 5 });
    let workers_n = ctx.args.workers();
    let slots = ctx.args.slots();
    let concurrency = slots.to_string();
    let _workers = ctx.workers(
        workers_n,
        &[
            ("worker.concurrency", concurrency.as_str()),
            ("database.max_connections", "20"),
        ],
    );
    if parents * tasks > workers_n * slots {
        // Then a round's tasks wait for slots behind other rounds' and the phases measure
        // that backlog, not what a round costs.
        println!(
            "plan: {} tasks in flight at once exceed the {} slots: the phases include queueing",
            parents * tasks,
            workers_n * slots
        );
    }
    // Let the workers connect before the planners arrive (the figures do not depend on it:
    // every round starts after a worker claimed its planner).
    tokio::time::sleep(Duration::from_millis(if smoke { 300 } else { 1500 })).await;
    let body = planner(rounds, tasks);
    // 32 requests in flight, as the e2e section submits; the ids keep the completion poll and
    // the figures' query to index look-ups.
    let ids: Vec<anyhow::Result<uuid::Uuid>> = stream::iter(0..parents)
        .map(|_| async {
            let run = ctx.post("/v1/runs", &body).await?;
            let id = run["id"].as_str().unwrap_or_default();
            id.parse::<uuid::Uuid>()
                .map_err(|e| anyhow::anyhow!("POST /v1/runs answered id {id:?}: {e}"))
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let ids = ids.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let limit = Duration::from_secs(if smoke { 60 } else { 600 });
    let ended = wait_for("the planners to end", limit, || async {
        let counted: Result<(i64, i64), _> = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled')),
                    count(*) FILTER (WHERE status = 'completed')
               FROM runs WHERE id = ANY($1)",
        )
        .bind(&ids)
        .fetch_one(&ctx.env.pool)
        .await;
        counted.ok().filter(|(ended, _)| *ended >= parents as i64)
    })
    .await;
    anyhow::ensure!(
        ended.1 == parents as i64,
        "{} of {parents} planners did not complete",
        parents as i64 - ended.1
    );
    // One row per round: the phases' timestamps as epoch seconds. The planner's next holding
    // is the earliest timing row of the `plan` call's iteration that started after the round's
    // last task ended (the planning holding's own row, if written, started before the commit).
    let rows: Vec<Round> = sqlx::query_as(
        "WITH round AS (
             SELECT t.parent_run_id AS parent, t.plan_round AS round,
                    min(t.created_at) AS committed, min(t.started_at) AS first_started,
                    max(t.started_at) AS last_started, max(t.finished_at) AS last_ended,
                    count(*) FILTER (WHERE t.status <> 'completed') AS not_completed
               FROM runs t WHERE t.parent_run_id = ANY($1)
              GROUP BY 1, 2)
         SELECT extract(epoch FROM r.committed)::float8 AS committed,
                extract(epoch FROM r.first_started)::float8 AS first_started,
                extract(epoch FROM r.last_started)::float8 AS last_started,
                extract(epoch FROM r.last_ended)::float8 AS last_ended,
                extract(epoch FROM (
                    SELECT min(i.started_at) FROM iterations i
                     WHERE i.run_id = r.parent AND i.iteration = c.iteration
                       AND i.started_at >= r.last_ended))::float8 AS resumed,
                extract(epoch FROM c.finished_at)::float8 AS taken_up,
                r.not_completed
           FROM round r
           LEFT JOIN tool_calls c
             ON c.run_id = r.parent AND c.name = 'plan' AND c.status = 'succeeded'
            AND (c.result ->> 'round')::int = r.round",
    )
    .bind(&ids)
    .fetch_all(&ctx.env.pool)
    .await?;
    let expected = parents * rounds;
    anyhow::ensure!(
        rows.len() == expected,
        "{} rounds found, {expected} expected",
        rows.len()
    );
    let failed: i64 = rows.iter().map(|r| r.not_completed).sum();
    anyhow::ensure!(failed == 0, "{failed} tasks did not complete");
    let ms = |from: f64, to: f64| (to - from) * 1000.0;
    let to_first = sorted(
        rows.iter()
            .map(|r| ms(r.committed, r.first_started))
            .collect(),
    );
    let to_all = sorted(
        rows.iter()
            .map(|r| ms(r.committed, r.last_started))
            .collect(),
    );
    let resumed = sorted(
        rows.iter()
            .filter_map(|r| r.resumed.map(|at| ms(r.last_ended, at)))
            .collect(),
    );
    let taken_up = sorted(
        rows.iter()
            .filter_map(|r| r.taken_up.map(|at| ms(r.last_ended, at)))
            .collect(),
    );
    let whole = sorted(
        rows.iter()
            .filter_map(|r| r.taken_up.map(|at| ms(r.committed, at)))
            .collect(),
    );
    let work = sorted(
        rows.iter()
            .map(|r| ms(r.first_started, r.last_ended))
            .collect(),
    );
    println!(
        "plan: {parents} planners in flight × {rounds} rounds × {tasks} no-op tasks, \
         {workers_n} workers × {slots} slots; {} rounds measured",
        rows.len()
    );
    let load = [
        (
            "offered: planners in flight at once",
            parents as f64,
            "runs",
        ),
        (
            "offered: tasks per round (all in parallel)",
            tasks as f64,
            "runs",
        ),
        ("offered: rounds per planner", rounds as f64, "rounds"),
        ("offered: worker processes", workers_n as f64, "processes"),
        ("offered: slots per worker", slots as f64, "slots"),
    ];
    for (metric, value, unit) in load {
        report.add("plan", metric, value, unit, None);
    }
    let phases: [(&str, &[f64]); 5] = [
        ("round commit to first task running", &to_first),
        ("round commit to last task running", &to_all),
        ("last task ended to planner running", &resumed),
        ("last task ended to round results recorded", &taken_up),
        ("round commit to round results recorded", &whole),
    ];
    for (phase, values) in phases {
        if values.len() < rows.len() {
            // A round whose later timestamps were not found (a timing row not yet written)
            // is left out of that phase only.
            println!("plan: {phase}: {} of {} rounds", values.len(), rows.len());
        }
        report.add(
            "plan",
            &format!("{phase} p50"),
            percentile(values, 0.5),
            "ms",
            None,
        );
        report.add(
            "plan",
            &format!("{phase} p99"),
            percentile(values, 0.99),
            "ms",
            None,
        );
    }
    report.add(
        "plan",
        "tasks' time, first running to last ended p50",
        percentile(&work, 0.5),
        "ms",
        None,
    );
    Ok(())
}

/// One round's timestamps, in seconds since the epoch (see [`plan_rounds`]).
#[derive(sqlx::FromRow)]
struct Round {
    committed: f64,
    first_started: f64,
    last_started: f64,
    last_ended: f64,
    /// The planner's next holding's start, if its timing row was found.
    resumed: Option<f64>,
    /// The `plan` call's result recorded.
    taken_up: Option<f64>,
    /// Tasks of the round that did not complete.
    not_completed: i64,
}

/// A plan-and-solve run whose scripted planner plans `rounds` rounds of `tasks` no-op tasks
/// (each answers at once), then completes and writes a summary.
fn planner(rounds: usize, tasks: usize) -> Value {
    let round: Vec<Value> = (0..tasks)
        .map(|i| json!({"title": format!("task {i}"), "input": script(json!([{"content": "done"}]))}))
        .collect();
    let plan = json!({"tool_calls": [{"name": "plan", "arguments": {"tasks": round}}]});
    let mut turns = vec![plan; rounds];
    turns.push(json!({"tool_calls": [{"name": "complete", "arguments": {"summary": "done"}}]}));
    turns.push(json!({"content": "summary"}));
    json!({
        "input": script(Value::Array(turns)),
        "agent": {
            "model": "mock",
            "mode": "plan_and_solve",
            // A `plan` turn, `complete` and the summary are iterations.
            "max_iterations": (rounds + 3).max(10),
            "plan": {"max_rounds": rounds, "max_tasks": tasks, "max_parallel": tasks},
        },
    })
}
