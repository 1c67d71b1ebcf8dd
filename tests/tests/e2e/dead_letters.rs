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
    worker.kill();
    let dead = format!("{}.runs.dead", env.prefix);
    wait_for("the dead-lettered message", T, || async {
        (env.queue_depth(&dead).await == 1).then_some(())
    })
    .await;

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
