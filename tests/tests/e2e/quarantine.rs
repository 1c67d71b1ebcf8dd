//! Quarantine: a run taken over more than `worker.max_recoveries` times runs once more alone
//! in a worker, and is failed as poison only if that worker dies holding it. A run that crashes
//! its workers still ends as poison; a run whose workers were killed from outside completes.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

/// What Postgres says of a run's take-overs and quarantine.
#[derive(Debug, sqlx::FromRow)]
struct Holding {
    status: String,
    attempt: i32,
    recoveries: i32,
    lease_owner: Option<String>,
    quarantine_attempt: Option<i32>,
}

async fn holding(env: &TestEnv, run: &str) -> Holding {
    sqlx::query_as(
        "SELECT status::text AS status, attempt, recoveries, lease_owner, quarantine_attempt
         FROM runs WHERE id = $1::uuid",
    )
    .bind(run)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

/// Runs held by `worker` right now, by id.
async fn held_by(env: &TestEnv, worker: &str) -> Vec<String> {
    sqlx::query_as::<_, (String,)>(
        "SELECT id::text FROM runs WHERE lease_owner = $1 AND status = 'running' ORDER BY id",
    )
    .bind(worker)
    .fetch_all(&env.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(id,)| id)
    .collect()
}

fn id_of(run: &Value) -> String {
    run["id"].as_str().unwrap().to_string()
}

/// A run that aborts its worker at every attempt (a failpoint at its tool) shares its first
/// workers with two innocent runs, which die with it. Once over the limit it runs alone (the
/// test sees its worker hold nothing else), kills that worker too and is failed as poison; the
/// innocent runs, taken over as often, are not: they complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_crashes_its_worker_alone_in_quarantine_is_poison() {
    let env = TestEnv::with(&[("worker.max_recoveries", "1")]).await;
    let app = env.spawn_api().await;
    let poison = id_of(
        &app.start_run(&scripted_run(
            json!([{"tool_calls": [{"name": "crash", "arguments": {}}]}]),
            json!([http_tool(&env, "crash", "/echo")]),
        ))
        .await,
    );
    let step = json!({"tool_calls": [{"name": "echo", "arguments": {}}], "delay_ms": 700});
    let innocent_body = scripted_run(
        json!([step, step, {"content": "done", "delay_ms": 700}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let mut innocents = Vec::new();
    for _ in 0..2 {
        innocents.push(id_of(&app.start_run(&innocent_body).await));
    }
    // Like a Deployment: a worker is restarted whenever it dies. The quarantined attempt
    // waits 1.5 s alone before it goes on, for the test to look at its worker.
    let failpoints = "tool:crash,delay:quarantine:alone@1500";
    let mut worker = env.spawn_worker_process_with_failpoints(&[], failpoints);
    let mut crashes = 0;
    // What the quarantined attempt's worker held, each time the test looked.
    let seen_alone: std::sync::Mutex<Vec<Vec<String>>> = Default::default();
    let done = wait_for("the poison run to fail", Duration::from_secs(120), || {
        if worker.has_exited() {
            crashes += 1;
            worker = env.spawn_worker_process_with_failpoints(&[], failpoints);
        }
        let (app, env, poison, seen_alone) = (&app, &env, poison.clone(), &seen_alone);
        async move {
            let h = holding(env, &poison).await;
            if h.status == "running" && h.quarantine_attempt == Some(h.attempt) {
                let worker = h.lease_owner.expect("held");
                let held = held_by(env, &worker).await;
                seen_alone.lock().unwrap().push(held);
            }
            let run = app.run(&poison).await;
            (run["status"] == "failed").then_some(run)
        }
    })
    .await;
    assert_eq!(done["error"]["code"], "poison_run", "{done}");
    assert_eq!(done["quarantined"], true, "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .unwrap()
            .contains("alone in quarantine"),
        "{done}"
    );
    assert!(
        crashes >= 3,
        "two crashes to the limit, one alone: {crashes}"
    );
    let seen_alone = seen_alone.into_inner().unwrap();
    assert!(!seen_alone.is_empty(), "the quarantined attempt was seen");
    for held in &seen_alone {
        assert_eq!(held, &vec![poison.clone()], "its worker held nothing else");
    }
    let h = holding(&env, &poison).await;
    assert_eq!(h.quarantine_attempt, Some(h.attempt - 1), "{h:?}");
    let dead = format!("{}.runs.dead", env.prefix);
    wait_for(
        "the poison run's message in the dead-letter queue",
        T,
        || async { (env.queue_depth(&dead).await == 1).then_some(()) },
    )
    .await;

    // The innocent runs finish, each alone in its turn (killing the worker now could kill
    // one of them in quarantine, which would rightly make it poison).
    for id in &innocents {
        let run = wait_for("an innocent run to finish", Duration::from_secs(60), || {
            if worker.has_exited() {
                worker = env.spawn_worker_process_with_failpoints(&[], failpoints);
            }
            let (app, id) = (&app, id.clone());
            async move {
                let run = app.run(&id).await;
                ["completed", "failed"]
                    .contains(&run["status"].as_str().unwrap())
                    .then_some(run)
            }
        })
        .await;
        assert_eq!(run["status"], "completed", "{run}");
    }
    let listed: Value = serde_json::from_str(
        &api_cli(&env, &["--json", "admin", "dead-letters", "list"], true).await,
    )
    .unwrap();
    let listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec![poison.as_str()], "only the cause is poison");
}

/// A run whose workers are killed from outside (the run does nothing wrong) reaches the limit
/// and is quarantined; its quarantine worker is then stopped gracefully (SIGTERM: it drains
/// and hands the run back), which is no crash and spends no take-over; the next worker
/// quarantines it again and it completes, not poison.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_innocent_run_whose_workers_are_killed_is_quarantined_then_completes() {
    let env = TestEnv::with(&[("worker.max_recoveries", "1")]).await;
    let app = env.spawn_api().await;
    let run = id_of(
        &app.start_run(&scripted_run(
            json!([{"tool_calls": [{"name": "echo", "arguments": {}}], "delay_ms": 1500},
                   {"content": "survived", "delay_ms": 500}]),
            json!([http_tool(&env, "echo", "/echo")]),
        ))
        .await,
    );
    let held_at = |attempt: i32| {
        let (env, run) = (&env, run.clone());
        async move {
            let h = holding(env, &run).await;
            (h.status == "running" && h.attempt == attempt).then_some(h)
        }
    };
    // Killed in the middle of its first model call, twice: two take-overs, one past the limit.
    for attempt in 1..=2 {
        let mut worker = env.spawn_worker_process(&[]);
        let h = wait_for("the run to be held", T, || held_at(attempt)).await;
        assert_eq!(h.quarantine_attempt, None, "{h:?}");
        worker.kill();
    }
    // This one waits 3 s alone before the run goes on: long enough to stop it meanwhile.
    let mut worker = env.spawn_worker_process_with_failpoints(&[], "delay:quarantine:alone@3000");
    let h = wait_for("the run to be held alone", T, || async {
        held_at(3)
            .await
            .filter(|h| h.quarantine_attempt == Some(h.attempt))
    })
    .await;
    assert_eq!(h.recoveries, 2, "{h:?}");
    assert_eq!(
        held_by(&env, h.lease_owner.as_deref().unwrap()).await,
        vec![run.clone()]
    );
    let listed: Value =
        serde_json::from_str(&api_cli(&env, &["--json", "admin", "quarantine"], true).await)
            .unwrap();
    assert_eq!(listed[0]["run_id"], run.as_str(), "{listed}");
    assert_eq!(listed[0]["running_alone"], true, "{listed}");
    assert_eq!(app.run(&run).await["quarantined"], true);

    // A graceful stop of the quarantine worker: the run is handed back, not counted.
    worker.signal("TERM");
    assert_eq!(worker.wait_exit(T).await, Some(0), "drained and exited");
    let after = holding(&env, &run).await;
    assert_eq!(
        (after.status.as_str(), after.recoveries),
        ("queued", 2),
        "{after:?}"
    );

    let _worker = env.spawn_worker_process(&[]);
    let done = app.wait_status(&run, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["quarantined"], true, "{done}");
    let h = holding(&env, &run).await;
    assert_eq!((h.recoveries, h.attempt), (2, 4), "{h:?}");
    assert_eq!(h.quarantine_attempt, Some(4), "quarantined again: {h:?}");
    let events = app.events(&run, 0, T).await;
    let alone: Vec<i64> = events
        .iter()
        .filter(|e| e["data"]["quarantined"] == true)
        .map(|e| e["data"]["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(alone, vec![3, 4], "{:?}", types(&events));
    assert_eq!(events.last().unwrap()["type"], "run_completed");
    let dead: Value = serde_json::from_str(
        &api_cli(&env, &["--json", "admin", "dead-letters", "list"], true).await,
    )
    .unwrap();
    assert_eq!(dead, json!([]), "not poison");
    let all: Value = serde_json::from_str(
        &api_cli(&env, &["--json", "admin", "quarantine", "--all"], true).await,
    )
    .unwrap();
    assert_eq!(all[0]["status"], "completed", "{all}");
    let active: Value =
        serde_json::from_str(&api_cli(&env, &["--json", "admin", "quarantine"], true).await)
            .unwrap();
    assert_eq!(
        active,
        json!([]),
        "finished runs are listed with --all only"
    );
}
