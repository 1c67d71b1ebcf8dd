//! Fair share with the shipped configuration: no tenant has a limit, yet a tenant that arrives
//! behind another's backlog starts within the fleet's window, and a tenant alone fills the
//! fleet. Ordering and counts only, no wall clock.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_shared::store::tenants;
use agentfleet_tests::harness::*;

use crate::fairness::{batch, count};

/// Each test worker's slots (the harness's `worker.concurrency`).
const SLOTS_PER_WORKER: i64 = 8;
/// The slots of each of the two workers behind the backlog: more than the harness's, so what
/// A's runs dispatch while B's create commits and publishes (a few, on a loaded machine) stays
/// small beside the bound (2 × the slots).
const BACKLOG_SLOTS_PER_WORKER: i64 = 32;

/// Waits until `n` workers have registered their slots: the windows count them from then on.
async fn workers_registered(env: &TestEnv, n: i64) {
    wait_for("the workers' slots", Duration::from_secs(30), || async {
        let (registered,): (i64,) = sqlx::query_as("SELECT count(*) FROM fleet_workers")
            .fetch_one(&env.pool)
            .await
            .expect("count");
        (registered == n).then_some(())
    })
    .await;
}

/// The shipped defaults (no limit for anyone): A submits 3,000 runs, then B submits 5. Of A's
/// runs not yet started when B's first run was created, at most 2 × the fleet's slots start
/// before B's last run starts, and A's backlog waits held in Postgres, not in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_arriving_behind_a_backlog_starts_within_the_fleets_window() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let concurrency = BACKLOG_SLOTS_PER_WORKER.to_string();
    let extra = [("worker.concurrency", concurrency.as_str())];
    let _workers = [
        env.spawn_worker_with(&extra).await,
        env.spawn_worker_with(&extra).await,
    ];
    workers_registered(&env, 2).await;
    let slots = 2 * BACKLOG_SLOTS_PER_WORKER;
    let a = app.tenant_id;
    let b = tenants::create(&env.pool, "late tenant")
        .await
        .expect("tenant");

    for _ in 0..3 {
        batch(&app, &app.api_key, 1000).await;
    }
    batch(&app, &b.api_key, 5).await;
    let (b_created,): (chrono::DateTime<chrono::Utc>,) =
        sqlx::query_as("SELECT min(created_at) FROM runs WHERE tenant_id = $1")
            .bind(b.tenant_id)
            .fetch_one(&env.pool)
            .await
            .expect("B's first run");
    wait_for("B's runs all started", Duration::from_secs(120), || async {
        let started = count(
            &env,
            "SELECT count(*) FROM runs WHERE tenant_id = $1 AND started_at IS NOT NULL",
            b.tenant_id,
        )
        .await;
        (started == 5).then_some(())
    })
    .await;
    let (not_started_then, overtaking): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE started_at IS NULL OR started_at > $2),
                count(*) FILTER (WHERE started_at > $2 AND started_at <=
                    (SELECT max(started_at) FROM runs WHERE tenant_id = $3))
         FROM runs WHERE tenant_id = $1",
    )
    .bind(a)
    .bind(b_created)
    .bind(b.tenant_id)
    .fetch_one(&env.pool)
    .await
    .expect("counts");
    assert!(
        not_started_then > 1000,
        "A still had a backlog when B arrived ({not_started_then} runs not started): else this \
         test shows nothing"
    );
    eprintln!("{overtaking} of A's {not_started_then} waiting runs started before B's last");
    assert!(
        overtaking <= 2 * slots,
        "{overtaking} of A's {not_started_then} waiting runs started before B's last run; at \
         most {} may (2 × the fleet's {slots} slots)",
        2 * slots
    );

    wait_for(
        "all of A's runs completed",
        Duration::from_secs(600),
        || async {
            let done = count(
                &env,
                "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status = 'completed'",
                a,
            )
            .await;
            (done == 3000).then_some(())
        },
    )
    .await;
}

/// Work-conserving: a tenant alone fills every slot of the fleet, while no more than its window
/// (2 runs per slot) is ever in flight, so the queue stays short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_alone_fills_the_fleet_and_its_window_bounds_the_queue() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    workers_registered(&env, 1).await;
    let window = 2 * SLOTS_PER_WORKER;
    let body = scripted_run(
        json!([{"content": "working", "tool_calls": [{"name": "slow", "arguments": {"ms": 300}}]},
               {"content": "done"}]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    let runs: Vec<Value> = (0..60).map(|_| body.clone()).collect();
    let resp = app.post("/v1/runs/batch", &json!({ "runs": runs })).await;
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    let in_flight = "SELECT count(*) FROM runs WHERE tenant_id = $1
                     AND status IN ('queued', 'running') AND NOT held";
    wait_for(
        "all 60 runs completed",
        Duration::from_secs(120),
        || async {
            let flying = count(&env, in_flight, app.tenant_id).await;
            assert!(
                flying <= window,
                "{flying} runs in flight past the window of {window}"
            );
            let depth = env.queue_depth(&format!("{}.runs", env.prefix)).await as i64;
            assert!(depth <= window, "the queue holds {depth} runs");
            let done = count(
                &env,
                "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status = 'completed'",
                app.tenant_id,
            )
            .await;
            (done == 60).then_some(())
        },
    )
    .await;
    // The most of the tenant's runs running at once: at each start, the runs started and not
    // yet finished.
    let most_running = count(
        &env,
        "SELECT coalesce(max(n), 0) FROM (
             SELECT (SELECT count(*) FROM runs o WHERE o.tenant_id = $1
                       AND o.started_at <= r.started_at AND o.finished_at > r.started_at) AS n
             FROM runs r WHERE r.tenant_id = $1) x",
        app.tenant_id,
    )
    .await;
    assert_eq!(
        most_running, SLOTS_PER_WORKER,
        "a tenant alone runs on every slot of the fleet"
    );
}

/// A single run's create is held only past the window: with no backlog it is published at
/// once, and once the tenant has held runs, a new run waits behind them rather than overtaking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_creates_are_held_only_past_the_window() {
    // No worker: nothing leaves the window; min_window is the whole window.
    let env = TestEnv::with(&[("fair_share.min_window", "3")]).await;
    let app = env.spawn_api().await;
    let run = scripted_run(json!([{"content": "done"}]), json!([]));
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app.start_run(&run).await["id"].as_str().unwrap().to_owned());
    }
    let held: Vec<(String, bool)> =
        sqlx::query_as("SELECT id::text, held FROM runs WHERE tenant_id = $1 ORDER BY created_at")
            .bind(app.tenant_id)
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let flags: Vec<bool> = held.iter().map(|(_, h)| *h).collect();
    assert_eq!(flags, [false, false, false, true, true], "{held:?}");
    assert_eq!(env.queue_depth(&format!("{}.runs", env.prefix)).await, 3);
    // A worker joins: its slots widen the window, and the held runs are dispatched in order.
    let _worker = env.spawn_worker().await;
    for id in &ids {
        app.wait_status(id, &["completed"], Duration::from_secs(30))
            .await;
    }
}
