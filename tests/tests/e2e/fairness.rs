//! Fair dispatch: a tenant's runs beyond its running limit wait `held` in Postgres, so another
//! tenant's runs do not queue behind its backlog. Ordering and counts only, no wall clock.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::store::tenants;
use agentfleet_tests::harness::*;

const LIMIT: i64 = 8;

/// Submits `n` one-turn runs for the tenant of `key` in one `POST /v1/runs/batch`.
pub(crate) async fn batch(app: &TestApp, key: &str, n: usize) {
    let run = scripted_run(json!([{"content": "done"}]), json!([]));
    let runs: Vec<Value> = (0..n).map(|_| run.clone()).collect();
    let resp = app
        .http
        .post(app.url("/v1/runs/batch"))
        .bearer_auth(key)
        .json(&json!({ "runs": runs }))
        .send()
        .await
        .expect("request");
    assert_eq!(
        resp.status(),
        202,
        "{}",
        resp.text().await.unwrap_or_default()
    );
}

/// `sql`'s count, with `$1` the tenant.
pub(crate) async fn count(env: &TestEnv, sql: &str, tenant: Uuid) -> i64 {
    sqlx::query_as::<_, (i64,)>(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(tenant)
        .fetch_one(&env.pool)
        .await
        .expect("count")
        .0
}

/// The most of `tenant`'s runs that were running at once: at each run's start, the runs that
/// had started and not yet finished.
async fn most_at_once(env: &TestEnv, tenant: Uuid) -> i64 {
    count(
        env,
        "SELECT coalesce(max(n), 0) FROM (
             SELECT (SELECT count(*) FROM runs o WHERE o.tenant_id = $1
                       AND o.started_at <= r.started_at AND o.finished_at > r.started_at) AS n
             FROM runs r WHERE r.tenant_id = $1) x",
        tenant,
    )
    .await
}

/// Tenant A has 2,000 queued runs and a running limit of 8; tenant B's 5 runs all start while
/// A still has more than 1,500 not started, A never has more than 8 runs in flight, and every
/// run of A is dispatched in the end (each end dispatches the next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_tenant_is_not_stuck_behind_a_big_backlog() {
    let env = TestEnv::with(&[
        ("limits.max_running_runs", &LIMIT.to_string()),
        ("worker.concurrency", "16"),
    ])
    .await;
    let app = env.spawn_api().await;
    let a = app.tenant_id;
    let b = tenants::create(&env.pool, "small tenant")
        .await
        .expect("tenant");

    batch(&app, &app.api_key, 1000).await;
    batch(&app, &app.api_key, 1000).await;
    let held = count(
        &env,
        "SELECT count(*) FROM runs WHERE tenant_id = $1 AND held",
        a,
    )
    .await;
    assert!(
        held >= 2000 - LIMIT,
        "A's runs beyond its window are held: {held}"
    );
    assert!(
        env.queue_depth(&format!("{}.runs", env.prefix)).await as i64 <= LIMIT,
        "the queue holds only A's window"
    );

    let _worker = env.spawn_worker().await;
    batch(&app, &b.api_key, 5).await;
    let in_flight_sql = "SELECT count(*) FROM runs WHERE tenant_id = $1
                         AND status IN ('queued', 'running') AND NOT held";
    wait_for("B's runs all started", Duration::from_secs(60), || async {
        let started = count(
            &env,
            "SELECT count(*) FROM runs WHERE tenant_id = $1 AND started_at IS NOT NULL",
            b.tenant_id,
        )
        .await;
        let in_flight = count(&env, in_flight_sql, a).await;
        assert!(in_flight <= LIMIT, "A has {in_flight} runs in flight");
        (started == 5).then_some(())
    })
    .await;
    // A's runs that started before B's last one did.
    let a_before_b = count(
        &env,
        "SELECT count(*) FROM runs WHERE tenant_id = $1 AND started_at <=
             (SELECT max(started_at) FROM runs WHERE tenant_id <> $1)",
        a,
    )
    .await;
    assert!(
        a_before_b < 500,
        "B waited for {a_before_b} of A's runs; A still had {} queued",
        2000 - a_before_b
    );

    wait_for(
        "all of A's runs completed",
        Duration::from_secs(300),
        || async {
            let in_flight = count(&env, in_flight_sql, a).await;
            assert!(in_flight <= LIMIT, "A has {in_flight} runs in flight");
            let done = count(
                &env,
                "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status = 'completed'",
                a,
            )
            .await;
            (done == 2000).then_some(())
        },
    )
    .await;
    // Never more than the limit running at once.
    let most = most_at_once(&env, a).await;
    assert!(most <= LIMIT, "{most} of A's runs overlapped");
}

/// A resumed run of a limited tenant waits its turn like a new one, and a cancelled one frees
/// its slot at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_frees_a_slot_and_held_runs_are_never_started() {
    let env = TestEnv::with(&[("limits.max_running_runs", "1")]).await;
    let app = env.spawn_api().await;
    // The first run asks its user; the pause frees its slot, so the second run starts while
    // the first waits.
    let ask = scripted_run(
        json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "Which one?"}}]},
               {"content": "thanks"}]),
        json!([]),
    );
    let first = app.start_run(&ask).await;
    let second = app
        .start_run(&scripted_run(json!([{"content": "two"}]), json!([])))
        .await;
    let third = app
        .start_run(&scripted_run(json!([{"content": "three"}]), json!([])))
        .await;
    let id = |v: &Value| v["id"].as_str().unwrap().to_owned();
    // No worker yet: one run dispatched, the others held.
    let run = app.run(&id(&second)).await;
    assert_eq!(run["status"], "queued");
    let held: i64 = count(
        &env,
        "SELECT count(*) FROM runs WHERE tenant_id = $1 AND held",
        app.tenant_id,
    )
    .await;
    assert_eq!(held, 2);
    // Cancelling a held run frees nothing and starts nothing.
    let resp = app
        .http
        .post(app.url(&format!("/v1/runs/{}/cancel", id(&third))))
        .bearer_auth(&app.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let _worker = env.spawn_worker().await;
    app.wait_status(&id(&first), &["waiting_for_input"], Duration::from_secs(30))
        .await;
    // The pause freed the slot: the second run runs to its end.
    app.wait_status(&id(&second), &["completed"], Duration::from_secs(30))
        .await;
    let resp = app
        .post(
            &format!("/v1/runs/{}/resume", id(&first)),
            &json!({"input": "this one"}),
        )
        .await;
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    app.wait_status(&id(&first), &["completed"], Duration::from_secs(30))
        .await;
    assert_eq!(app.run(&id(&third)).await["status"], "cancelled");
    let started: Option<(Option<chrono::DateTime<chrono::Utc>>,)> =
        sqlx::query_as("SELECT started_at FROM runs WHERE id = $1::uuid")
            .bind(id(&third))
            .fetch_optional(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        started,
        Some((None,)),
        "the cancelled held run never started"
    );
}

/// Faults in combination under a running limit: the worker holding a limited tenant's window
/// is killed while Redis loses the runs' lists. The crashed runs keep their slots until they
/// are recovered (so the limit still holds), and every run completes on the rescuer: nothing
/// held is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_neither_loses_held_runs_nor_breaks_the_limit() {
    let env = TestEnv::with(&[("limits.max_running_runs", "2")]).await;
    let app = env.spawn_api().await;
    let mut worker = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"content": "working", "tool_calls": [{"name": "slow", "arguments": {"ms": 1500}}]},
               {"content": "done"}]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let running = "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status = 'running'";
    wait_for(
        "the window to be running",
        Duration::from_secs(30),
        || async { (count(&env, running, app.tenant_id).await == 2).then_some(()) },
    )
    .await;
    env.flush_redis_keys().await;
    worker.kill();
    let _rescuer = env.spawn_worker_process(&[]);
    for id in &ids {
        let done = app
            .wait_status(id, &["completed", "failed"], Duration::from_secs(90))
            .await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    let recovered = count(
        &env,
        "SELECT count(*) FROM runs WHERE tenant_id = $1 AND attempt >= 2",
        app.tenant_id,
    )
    .await;
    assert!(recovered >= 1, "the killed worker's runs were recovered");
    let most = most_at_once(&env, app.tenant_id).await;
    assert!(most <= 2, "{most} runs overlapped under a limit of 2");
}

/// A suspended tenant's queued runs are held (none starts), the workers export the held
/// backlog per tenant, and once the suspension is lifted the sweeper dispatches them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspension_holds_queued_runs_and_the_backlog_is_exported() {
    let env = TestEnv::with(&[("worker.sweep_interval_ms", "200")]).await;
    let app = env.spawn_api().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let run = app
            .start_run(&scripted_run(json!([{"content": "done"}]), json!([])))
            .await;
        ids.push(run["id"].as_str().unwrap().to_owned());
    }
    // Suspended before any worker runs: the published messages will claim nothing.
    tenants::set_suspended(&env.pool, app.tenant_id, true)
        .await
        .unwrap();
    let listen = free_address();
    let _worker = env.spawn_worker_process(&[("worker.metrics_listen", &listen)]);
    let gauge = format!(
        "agentfleet_tenant_held_runs{{tenant=\"{}\"}} 4",
        app.tenant_id
    );
    wait_for(
        "the held backlog on /metrics",
        Duration::from_secs(30),
        || async {
            scrape_metrics(&listen)
                .await?
                .contains(&gauge)
                .then_some(())
        },
    )
    .await;
    // The worker has consumed the stale messages by now and started nothing.
    wait_for("the queue to be empty", Duration::from_secs(30), || async {
        (env.queue_depth(&format!("{}.runs", env.prefix)).await == 0).then_some(())
    })
    .await;
    let started = count(
        &env,
        "SELECT count(*) FROM runs WHERE tenant_id = $1 AND started_at IS NOT NULL",
        app.tenant_id,
    )
    .await;
    assert_eq!(started, 0, "nothing of a suspended tenant starts");

    tenants::set_suspended(&env.pool, app.tenant_id, false)
        .await
        .unwrap();
    for id in &ids {
        app.wait_status(id, &["completed"], Duration::from_secs(30))
            .await;
    }
}
