//! Autoscaling as Kubernetes does it, with real worker processes: a scale-out from 1 to 4
//! workers under load, then a scale-in back to 1 by SIGTERM (the drain), while runs keep
//! flowing. No run is lost or repeated, and every slot of every worker was used.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use agentfleet_tests::harness::*;

const SLOTS: i64 = 4;
const RUNS: usize = 160;
const T: Duration = Duration::from_secs(120);

/// The busiest each worker has been, as Postgres saw it: running runs by lease owner.
async fn record_busiest(env: &TestEnv, busiest: &Mutex<HashMap<String, i64>>) {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT lease_owner, count(*) FROM runs WHERE status = 'running' GROUP BY lease_owner",
    )
    .fetch_all(&env.pool)
    .await
    .expect("running runs by owner");
    let mut busiest = busiest.lock().unwrap();
    for (owner, n) in rows {
        let seen = busiest.entry(owner).or_default();
        *seen = (*seen).max(n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_to_four_workers_and_back_to_one_loses_and_repeats_nothing() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let slots = SLOTS.to_string();
    let extra = [("worker.concurrency", slots.as_str())];
    let mut first = env.spawn_worker_process(&extra);
    let mut ids = Vec::new();
    for i in 0..RUNS {
        // A slow model turn keeps each slot busy long enough to be seen.
        let body = scripted_run(
            json!([{"tool_calls": [{"name": "effect", "arguments": {"i": i}}], "delay_ms": 400},
                   {"content": "done"}]),
            json!([http_tool(&env, "effect", "/side-effect")]),
        );
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let busiest: Mutex<HashMap<String, i64>> = Mutex::default();
    wait_for("the first worker to fill its slots", T, || {
        let (busiest, env) = (&busiest, &env);
        async move {
            record_busiest(env, busiest).await;
            let busiest = busiest.lock().unwrap();
            busiest.values().any(|&n| n >= SLOTS).then_some(())
        }
    })
    .await;

    // Scale out: three more replicas.
    let mut added: Vec<ChildProcess> = (0..3).map(|_| env.spawn_worker_process(&extra)).collect();
    wait_for("every slot of four workers busy", T, || {
        let (busiest, env) = (&busiest, &env);
        async move {
            record_busiest(env, busiest).await;
            let busiest = busiest.lock().unwrap();
            (busiest.values().filter(|&&n| n >= SLOTS).count() >= 4).then_some(())
        }
    })
    .await;
    let busiest = busiest.into_inner().unwrap();
    assert_eq!(busiest.len(), 4, "four workers held runs: {busiest:?}");

    // Scale in while runs are in flight: the drain hands back or finishes what they hold.
    let remaining = sqlx::query_as::<_, (i64,)>(
        "SELECT count(*) FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap()
    .0;
    assert!(remaining > 0, "the scale-in happens under load");
    for w in &added {
        w.signal("TERM");
    }
    for w in &mut added {
        assert_eq!(w.wait_exit(T).await, Some(0), "a drained worker exits 0");
    }

    // The one left finishes everything, each run exactly once.
    let mut owners = HashSet::new();
    for id in &ids {
        let run = app.wait_status(id, &["completed", "failed"], T).await;
        assert_eq!(run["status"], "completed", "{run}");
        let events = app.events(id, 0, Duration::from_secs(30)).await;
        assert_gap_free(&events);
        let kinds = types(&events);
        assert_eq!(
            kinds.iter().filter(|k| *k == "run_completed").count(),
            1,
            "{kinds:?}"
        );
        for e in events
            .iter()
            .filter(|e| e["type"] == "run_started" || e["type"] == "run_recovered")
        {
            owners.insert(e["data"]["worker"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(
        owners.len(),
        4,
        "runs started on each of the four workers: {owners:?}"
    );
    let per_key = env.tools.calls_per_key("/side-effect");
    assert_eq!(per_key.len(), RUNS, "every run's side effect happened");
    let repeated: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    // A call is re-sent only when a drain cut it mid-flight, and then with the same key; the
    // drain here hands back between iterations, so none is.
    assert!(repeated.is_empty(), "side effects repeated: {repeated:?}");
    // Nothing is stranded in the queue. It may still hold duplicates for finished runs: while
    // the backlog outlasts `worker.requeue_after_ms` (3 s in tests) the sweeper re-publishes
    // queued runs, and the one worker left drops those copies as it reaches them.
    let queue = format!("{}.runs", env.prefix);
    wait_for("the queue to drain", T, || {
        let (env, queue) = (&env, &queue);
        async move { (env.queue_depth(queue).await == 0).then_some(()) }
    })
    .await;
    first.signal("TERM");
    assert_eq!(first.wait_exit(T).await, Some(0));
}
