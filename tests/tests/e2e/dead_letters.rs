//! Dead letters and stuck work, as an operator sees them: `agentfleet-api admin …`, and the
//! metrics the dashboard and alerts read.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

/// A run that crashed its workers too often is listed with its reason, replayed by the
/// operator (a new, counted attempt; its dead-lettered message taken out), and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_letter_completes() {
    let env = TestEnv::with(&[("worker.max_recoveries", "1")]).await;
    let app = env.spawn_api().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "crash", "arguments": {}}]}, {"content": "survived"}]),
        json!([http_tool(&env, "crash", "/echo")]),
    );
    let id = app.start_run(&body).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut worker = env.spawn_worker_process_with_failpoints(&[], "tool:crash");
    wait_for("the poison run to fail", Duration::from_secs(90), || {
        if worker.has_exited() {
            worker = env.spawn_worker_process_with_failpoints(&[], "tool:crash");
        }
        let (app, id) = (&app, id.clone());
        async move { (app.run(&id).await["status"] == "failed").then_some(()) }
    })
    .await;
    // The worker that failed the run commits the failure, then dead-letters the delivery:
    // killed in between, its message would go back to the queue instead (and be acked as
    // stale by the next claim), so it is killed only once the message is in the DLQ.
    let dead = format!("{}.runs.dead", env.prefix);
    wait_for("the dead-lettered message", T, || async {
        (env.queue_depth(&dead).await == 1).then_some(())
    })
    .await;
    worker.kill();

    let listed: Value = serde_json::from_str(
        &api_cli(&env, &["--json", "admin", "dead-letters", "list"], true).await,
    )
    .unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["run_id"], id.as_str());
    assert!(
        listed[0]["reason"].as_str().unwrap().contains("taken over"),
        "{listed:?}"
    );
    let attempts_before = listed[0]["attempt"].as_i64().unwrap();
    assert_eq!(listed[0]["replays"], 0);

    // Not a dead letter: refused by name, exit status 1, nothing changed.
    let other = app
        .start_run(&scripted_run(json!([{"content": "hi"}]), json!([])))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let refused = api_cli(&env, &["admin", "dead-letters", "replay", &other], false).await;
    assert!(refused.contains("is not a dead letter"), "{refused}");

    let replayed: Value = serde_json::from_str(
        &api_cli(
            &env,
            &["--json", "admin", "dead-letters", "replay", &id],
            true,
        )
        .await,
    )
    .unwrap();
    assert_eq!(replayed["replayed"], json!([id]));
    assert_eq!(env.queue_depth(&dead).await, 0, "its message left the DLQ");

    let worker = env.spawn_worker_process(&[]);
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        done["attempt"].as_i64().unwrap() > attempts_before,
        "a new attempt: {done}"
    );
    let again: Value = serde_json::from_str(
        &api_cli(&env, &["--json", "admin", "dead-letters", "list"], true).await,
    )
    .unwrap();
    assert_eq!(again, json!([]), "no longer a dead letter");
    let replays: (i32,) = sqlx::query_as("SELECT replays FROM runs WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(replays.0, 1, "the replay is counted");
    drop(worker);
}

/// Fails `run` as poison, as a worker does after too many take-overs (the crash path itself
/// is `a_replayed_dead_letter_completes`'s).
async fn fail_as_poison(env: &TestEnv, run: &str) {
    let failed = sqlx::query(
        "UPDATE runs SET status = 'failed', finished_at = now(), updated_at = now(),
                         error = jsonb_build_object('code', 'poison_run',
                                                    'message', 'taken over too often')
         WHERE id = $1::uuid AND status = 'queued'",
    )
    .bind(run)
    .execute(&env.pool)
    .await
    .unwrap();
    assert_eq!(failed.rows_affected(), 1, "{run} was queued");
}

fn id_of(run: &Value) -> String {
    run["id"].as_str().unwrap().to_string()
}

/// A replayed run of a tenant with a running limit goes back held: it waits for a free slot
/// of that limit like any new run of the tenant, instead of being published past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_run_waits_for_a_free_slot_of_its_tenants_running_limit() {
    let env = TestEnv::with(&[("limits.max_running_runs", "1")]).await;
    let app = env.spawn_api().await;
    let poison = id_of(
        &app.start_run(&scripted_run(json!([{"content": "replayed"}]), json!([])))
            .await,
    );
    fail_as_poison(&env, &poison).await;
    // Takes the tenant's one slot (published; no worker yet).
    let busy = id_of(
        &app.start_run(&scripted_run(
            json!([{"content": "first", "delay_ms": 1000}]),
            json!([]),
        ))
        .await,
    );
    let out: Value = serde_json::from_str(
        &api_cli(
            &env,
            &["--json", "admin", "dead-letters", "replay", &poison],
            true,
        )
        .await,
    )
    .unwrap();
    assert_eq!(out["replayed"], json!([poison]), "{out}");
    assert_eq!(out["held"], json!([poison]), "waits for the slot: {out}");
    let _worker = env.spawn_worker_process(&[]);
    let done = app.wait_status(&poison, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (overlap,): (bool,) = sqlx::query_as(
        "SELECT p.started_at < b.finished_at FROM runs p, runs b
         WHERE p.id = $1::uuid AND b.id = $2::uuid",
    )
    .bind(&poison)
    .bind(&busy)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(
        !overlap,
        "the replayed run started only once the slot was free"
    );
}

/// Replaying the dead-lettered run of a completed batch reopens the batch: in progress again
/// until the run ends, then completed with the run's new outcome counted. A run of a
/// cancelled batch is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_run_of_a_completed_batch_reopens_it() {
    let fast = [
        ("api.batch_sweep_interval_ms", "200"),
        ("api.batch_progress_interval_ms", "200"),
    ];
    let env = TestEnv::with(&fast).await;
    let app = env.spawn_api().await;
    let item = |i: usize| {
        json!({"custom_id": format!("line-{i}"),
               "input": agentfleet_tests::mock_llm::script(json!([{"content": "answer"}])),
               "agent": {"model": "mock"}})
    };
    let mut batches = Vec::new();
    for _ in 0..2 {
        let resp = app.post("/v1/batches", &json!({"runs": [item(0)]})).await;
        assert!(resp.status().is_success(), "{}", resp.status());
        let batch: Value = resp.json().await.unwrap();
        let id = batch["id"].as_str().unwrap().to_string();
        let run: (uuid::Uuid,) = wait_for("the batch's run", T, || async {
            sqlx::query_as(
                "SELECT run_id FROM batch_items WHERE batch_id = $1::uuid AND run_id IS NOT NULL",
            )
            .bind(&id)
            .fetch_optional(&env.pool)
            .await
            .unwrap()
        })
        .await;
        batches.push((id, run.0.to_string()));
    }
    let batch_status = |id: String| {
        let app = &app;
        async move {
            let b: Value = app
                .get(&format!("/v1/batches/{id}"))
                .await
                .json()
                .await
                .unwrap();
            b
        }
    };
    let (cancelled, cancelled_run) = &batches[1];
    let resp = app
        .post(&format!("/v1/batches/{cancelled}/cancel"), &json!({}))
        .await;
    assert!(resp.status().is_success(), "{}", resp.status());
    let (batch, run) = &batches[0];
    fail_as_poison(&env, run).await;
    wait_for("the batch to complete", T, || async {
        (batch_status(batch.clone()).await["status"] == "completed").then_some(())
    })
    .await;

    let out = api_cli(&env, &["admin", "dead-letters", "replay", run], true).await;
    assert!(out.contains("replayed 1 runs"), "{out}");
    let reopened = batch_status(batch.clone()).await;
    assert_eq!(reopened["status"], "in_progress", "{reopened}");
    let _worker = env.spawn_worker_process(&[]);
    let done = app.wait_status(run, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let finished = wait_for("the batch to complete again", T, || async {
        let b = batch_status(batch.clone()).await;
        (b["status"] == "completed").then_some(b)
    })
    .await;
    assert_eq!(finished["counts"]["completed"], 1, "{finished}");
    assert_eq!(finished["counts"]["failed"], 0, "{finished}");

    // The cancelled batch's run, failed as poison too, stays failed.
    let status: (String,) = sqlx::query_as("SELECT status::text FROM runs WHERE id = $1::uuid")
        .bind(cancelled_run)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    if status.0 == "queued" {
        fail_as_poison(&env, cancelled_run).await;
    } else {
        sqlx::query(
            "UPDATE runs SET status = 'failed',
                             error = jsonb_build_object('code', 'poison_run', 'message', 'x')
             WHERE id = $1::uuid",
        )
        .bind(cancelled_run)
        .execute(&env.pool)
        .await
        .unwrap();
    }
    let refused = api_cli(
        &env,
        &["admin", "dead-letters", "replay", cancelled_run],
        false,
    )
    .await;
    assert!(refused.contains("its batch was cancelled"), "{refused}");
}

/// `purge --all` empties the dead-letter queue and leaves the runs failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_empties_the_dead_letter_queue() {
    let env = TestEnv::new().await;
    let topology = agentfleet_shared::queue::Topology::new(&env.prefix);
    let conn = agentfleet_shared::queue::connect(&amqp_url(), "test")
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    topology.declare(&channel).await.unwrap();
    for _ in 0..3 {
        channel
            .basic_publish(
                "".into(),
                topology.dead_queue.as_str().into(),
                Default::default(),
                br#"{"run_id":"00000000-0000-0000-0000-000000000001"}"#,
                Default::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let dead = topology.dead_queue.clone();
    wait_for("three dead letters", T, || async {
        (env.queue_depth(&dead).await == 3).then_some(())
    })
    .await;
    let refused = api_cli(&env, &["admin", "dead-letters", "purge"], false).await;
    assert!(refused.contains("--all"), "{refused}");
    let out = api_cli(&env, &["admin", "dead-letters", "purge", "--all"], true).await;
    assert!(out.contains("purged 3"), "{out}");
    assert_eq!(env.queue_depth(&dead).await, 0);
    let _ = conn.close(200, "done".into()).await;
}

/// `admin stuck` lists runs unchanged past the threshold, oldest first, and no others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_lists_runs_unchanged_past_the_threshold() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // No worker: both stay queued.
    let old = app
        .start_run(&scripted_run(json!([{"content": "a"}]), json!([])))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let fresh = app
        .start_run(&scripted_run(json!([{"content": "b"}]), json!([])))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    sqlx::query("UPDATE runs SET updated_at = now() - interval '7 hours' WHERE id = $1::uuid")
        .bind(&old)
        .execute(&env.pool)
        .await
        .unwrap();
    let stuck: Value = serde_json::from_str(
        &api_cli(
            &env,
            &["--json", "admin", "stuck", "--older-than", "6h"],
            true,
        )
        .await,
    )
    .unwrap();
    let ids: Vec<&str> = stuck
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![old.as_str()], "{stuck}");
    assert_eq!(stuck[0]["status"], "queued");
    assert!(!ids.contains(&fresh.as_str()));
    let bad = api_cli(&env, &["admin", "stuck", "--older-than", "soon"], false).await;
    assert!(bad.contains("--older-than"), "{bad}");
}
