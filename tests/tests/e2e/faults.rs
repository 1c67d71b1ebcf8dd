//! The fault suite: real processes crash, stall and drain; the invariants hold.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(45);

/// The checker every scenario ends with.
async fn check_invariants(app: &TestApp, env: &TestEnv, run_ids: &[String]) {
    for id in run_ids {
        let run = app.run(id).await;
        let status = run["status"].as_str().unwrap();
        assert!(
            [
                "completed",
                "failed",
                "cancelled",
                "waiting_for_input",
                "waiting_for_confirmation"
            ]
            .contains(&status),
            "run {id} is stuck {status}"
        );
        let events = app.events(id, 0, T).await;
        assert_gap_free(&events);
        let finals = types(&events)
            .iter()
            .filter(|k| k.as_str() == "run_completed")
            .count();
        assert!(finals <= 1, "run {id} completed {finals} times");
    }
    // A finished side effect is never repeated: keys seen more than once must belong to calls
    // that were in flight at a crash (dispatched more than once).
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for c in env.tools.calls() {
        if let Some(k) = c.idempotency_key {
            *per_key.entry(k).or_default() += 1;
        }
    }
    for (key, seen) in per_key.into_iter().filter(|(_, n)| *n > 1) {
        let (_, call_id) = key.split_once(':').unwrap();
        let (dispatches,): (i32,) =
            sqlx::query_as("SELECT dispatch_count FROM tool_calls WHERE tool_call_id = $1")
                .bind(call_id)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert_eq!(
            dispatches as usize, seen,
            "key {key} was sent {seen} times but dispatched {dispatches} times"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_a_model_stream() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"content": "streaming a long answer slowly so the worker can die mid-way", "chunks": 30, "chunk_delay_ms": 100},
               {"content": "unused"}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("message_delta", T).await;
    a.kill();
    let _b = env.spawn_worker_process(&[]);
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 2);
    let recovered = watch.wait_type("run_recovered", T).await;
    assert_eq!(recovered["data"]["attempt"], 2);
    let (recoveries,): (i32,) = sqlx::query_as("SELECT recoveries FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(recoveries, 1);
    // The interrupted iteration was redone: one assistant message, not two.
    let msgs = app.messages(run["thread_id"].as_str().unwrap()).await;
    assert_eq!(msgs.iter().filter(|m| m["role"] == "assistant").count(), 1);
    check_invariants(&app, &env, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_a_tool_call() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([
            {"tool_calls": [{"name": "echo", "arguments": {"step": 1}}]},
            {"tool_calls": [{"name": "slow", "arguments": {"ms": 1500}}]},
            {"content": "done"}
        ]),
        json!([
            http_tool(&env, "echo", "/echo"),
            http_tool(&env, "slow", "/slow")
        ]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    wait_for("the slow call to reach the tool", T, || async {
        (!env.tools.calls_to("/slow").is_empty()).then_some(())
    })
    .await;
    a.kill();
    let _b = env.spawn_worker_process(&[]);
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    // The finished call was not run again; the one in flight was, with the same key.
    assert_eq!(env.tools.calls_to("/echo").len(), 1);
    let slow = env.tools.calls_to("/slow");
    assert_eq!(slow.len(), 2, "the in-flight call is dispatched again");
    assert_eq!(slow[0].idempotency_key, slow[1].idempotency_key);
    check_invariants(&app, &env, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_past_its_lease_cannot_write_when_it_resumes() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "effect", "arguments": {}}], "delay_ms": 1000}, {"content": "finished"}]),
        json!([http_tool(&env, "effect", "/side-effect")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("iteration_started", T).await;
    a.signal("STOP");
    // B takes over once A's lease (3 s) expires, and finishes the run.
    let b = env.spawn_worker().await;
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 2);
    let before = app.events(&id, 0, T).await;
    // A wakes up with a model answer in hand; every write it tries must be refused.
    a.signal("CONT");
    a.signal("TERM");
    assert_eq!(a.wait_exit(T).await, Some(0));
    b.shutdown().await;
    let after = app.events(&id, 0, T).await;
    assert_eq!(
        after, before,
        "the stale worker added nothing to the stream"
    );
    let run = app.run(&id).await;
    assert_eq!(
        (run["status"].as_str(), run["attempt"].as_i64()),
        (Some("completed"), Some(2))
    );
    let (assistant,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM messages WHERE role = 'assistant'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        assistant, 2,
        "one assistant message per iteration, none from the stale worker"
    );
    assert_eq!(env.tools.calls_to("/side-effect").len(), 1);
    check_invariants(&app, &env, &[id]).await;
}

/// A worker stopped during a tool call wakes up with the result in hand after another took
/// the run over: its outcome is refused, and nothing after it is written either (the next
/// model call starts before the outcome's answer, but the turn it would record waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_with_a_tool_result_in_hand_records_nothing_after_it() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([
            {"tool_calls": [{"name": "slow", "arguments": {"ms": 1000}}]},
            {"content": "finished"}
        ]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    wait_for("the slow call to reach the tool", T, || async {
        (!env.tools.calls_to("/slow").is_empty()).then_some(())
    })
    .await;
    a.signal("STOP");
    // B takes over once A's lease (3 s) expires, dispatches the call again and finishes.
    let b = env.spawn_worker().await;
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 2);
    let before = app.events(&id, 0, T).await;
    a.signal("CONT");
    a.signal("TERM");
    assert_eq!(a.wait_exit(T).await, Some(0));
    b.shutdown().await;
    assert_eq!(
        app.events(&id, 0, T).await,
        before,
        "the stale worker added nothing to the stream"
    );
    let roles: Vec<(String, i64)> = sqlx::query_as(
        "SELECT role, count(*) FROM messages WHERE role IN ('assistant', 'tool') \
         GROUP BY role ORDER BY role",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        roles,
        [("assistant".to_owned(), 2), ("tool".to_owned(), 1)],
        "one turn per iteration and one result, none from the stale worker"
    );
    let (iteration, attempt): (i32, i32) =
        sqlx::query_as("SELECT iteration, attempt FROM runs WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!((iteration, attempt), (2, 2));
    check_invariants(&app, &env, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_kills_its_worker_every_time_is_failed_and_dead_lettered() {
    let env = TestEnv::with(&[("worker.max_recoveries", "2")]).await;
    let app = env.spawn_api().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "crash", "arguments": {}}]}]),
        json!([http_tool(&env, "crash", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    // Like a Deployment, restart a worker whenever it dies, until the run is settled.
    let mut crashes = 0;
    let mut worker = env.spawn_worker_process_with_failpoints(&[], "tool:crash");
    let done = wait_for("the poison run to fail", Duration::from_secs(90), || {
        if worker.has_exited() {
            crashes += 1;
            worker = env.spawn_worker_process_with_failpoints(&[], "tool:crash");
        }
        let app = &app;
        let id = id.clone();
        async move {
            let run = app.run(&id).await;
            (run["status"] == "failed").then_some(run)
        }
    })
    .await;
    assert_eq!(done["error"]["code"], "poison_run", "{done}");
    // Two take-overs to the limit, then once more alone in quarantine.
    assert!(crashes >= 4, "crashed {crashes} times");
    assert_eq!(done["quarantined"], true, "{done}");
    let dead = format!("{}.runs.dead", env.prefix);
    wait_for("the message in the dead-letter queue", T, || async {
        (env.queue_depth(&dead).await == 1).then_some(())
    })
    .await;
    let events = app.events(&id, 0, T).await;
    assert_eq!(events.last().unwrap()["type"], "run_failed");
    check_invariants(&app, &env, &[id]).await;
}

/// A panic in a run's task (a bug its input reaches) ends that attempt only: the heartbeat
/// goes with it, so the lease lapses and the run is recovered, counted, quarantined once it has
/// panicked too often, and failed as poison when it panics alone too; the worker never dies
/// and its slots serve the next run.
/// (The heartbeat outlived a panicked run and renewed its lease for ever: it stayed `running`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_task_panics_is_recovered_then_failed_and_its_worker_goes_on() {
    let env = TestEnv::with(&[("worker.max_recoveries", "1")]).await;
    let app = env.spawn_api().await;
    let mut worker =
        env.spawn_worker_process_with_failpoints(&[("worker.concurrency", "1")], "panic:tool:boom");
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "boom", "arguments": {}}]}]),
        json!([http_tool(&env, "boom", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let done = app
        .wait_status(&id, &["completed", "failed"], Duration::from_secs(60))
        .await;
    assert_eq!(done["error"]["code"], "poison_run", "{done}");
    assert!(
        !worker.has_exited(),
        "a panic in a run must not end the worker"
    );
    // The one slot is free again: an ordinary run on the same worker completes.
    let next = app
        .start_run(&scripted_run(
            json!([{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"content": "done"}]),
            json!([http_tool(&env, "echo", "/echo")]),
        ))
        .await;
    let next = next["id"].as_str().unwrap().to_string();
    let finished = app.wait_status(&next, &["completed", "failed"], T).await;
    assert_eq!(finished["status"], "completed", "{finished}");
    check_invariants(&app, &env, &[id, next]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_between_iterations_without_spending_an_attempt() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "echo", "arguments": {}}], "delay_ms": 1000}, {"content": "done"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("iteration_started", T).await;
    a.signal("TERM");
    // The in-flight iteration finishes (its tool runs), then the run is handed back.
    assert_eq!(a.wait_exit(T).await, Some(0), "a draining worker exits 0");
    let handed_back = app.run(&id).await;
    assert_eq!(handed_back["status"], "queued", "{handed_back}");
    assert_eq!(env.tools.calls_to("/echo").len(), 1);
    let _b = env.spawn_worker().await;
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed");
    let (recoveries,): (i32,) = sqlx::query_as("SELECT recoveries FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(recoveries, 0, "a drain is not a crash");
    assert!(
        !types(&watch.snapshot()).contains(&"run_recovered".to_string()),
        "a clean hand-back needs no recovery"
    );
    assert_eq!(env.tools.calls_to("/echo").len(), 1);
    check_invariants(&app, &env, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_past_the_grace_period_hands_back_an_interrupted_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut a = env.spawn_worker_process(&[("worker.drain_grace_ms", "300")]);
    let body = scripted_run(
        json!([{"content": "slow thinking", "delay_ms": 4000}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("iteration_started", T).await;
    a.signal("TERM");
    assert_eq!(a.wait_exit(T).await, Some(0));
    let _b = env.spawn_worker().await;
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed");
    watch.wait_type("run_recovered", T).await;
    let (recoveries, attempt): (i32, i32) = sqlx::query_as("SELECT recoveries, attempt FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!((recoveries, attempt), (0, 2));
    check_invariants(&app, &env, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_dying_between_commit_and_publish_loses_no_run() {
    let env = TestEnv::new().await;
    let (mut api, base) = env
        .spawn_api_process(&[("AGENTFLEET_FAILPOINTS", "api_after_commit")])
        .await;
    let key = agentfleet_shared::store::tenants::create(&env.pool, "t")
        .await
        .unwrap()
        .api_key;
    let body = scripted_run(json!([{"content": "made it"}]), json!([]));
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/runs"))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await;
    assert!(
        resp.is_err() || !resp.unwrap().status().is_success(),
        "the API died before answering"
    );
    assert_eq!(
        api.wait_exit(T).await,
        None,
        "aborted by the failpoint (signal)"
    );
    let (id, status): (uuid::Uuid, String) = sqlx::query_as("SELECT id, status FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(status, "queued", "committed, never published");
    // The sweeper notices the idle queued run and publishes it.
    let _worker = env.spawn_worker().await;
    wait_for("the orphaned run to complete", T, || async {
        let (s,): (String,) = sqlx::query_as("SELECT status FROM runs WHERE id = $1")
            .bind(id)
            .fetch_one(&env.pool)
            .await
            .ok()?;
        (s == "completed").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_a_runs_keys_mid_run_loses_no_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _w = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "slow", "arguments": {"ms": 800}}]}, {"content": "finished after the flush"}]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("tool_started", T).await;
    let seen = watch.snapshot().last().unwrap()["id"].as_u64().unwrap();
    env.flush_redis_keys().await;
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed");
    // Ids continue past what clients saw: a reconnecting client gets new events, never old ids.
    let rest = app.events(&id, seen, T).await;
    assert!(!rest.is_empty());
    assert_eq!(rest.first().unwrap()["id"].as_u64(), Some(seen + 1));
    assert_eq!(rest.last().unwrap()["type"], "run_completed");
    assert_gap_free_from(&rest, seen + 1);
}

fn assert_gap_free_from(events: &[Value], first: u64) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["id"].as_u64(), Some(first + i as u64), "{events:#?}");
    }
}
