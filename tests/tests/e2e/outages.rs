//! Outages of the shared servers under load: RabbitMQ, Postgres and Redis restart while runs
//! are submitted and executed. A restart would break every other test running at that moment,
//! so these are `#[ignore]`d: `scripts/test` runs them in a phase of their own, one at a time,
//! after the parallel suite (`cargo test -p agentfleet-tests --test e2e -- --ignored
//! --test-threads=1`). They need root to restart the services, as CI has.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use agentfleet_tests::harness::*;

pub(crate) const T: Duration = Duration::from_secs(90);

/// Submits runs in the background, retrying 503s as a client would; collects accepted ids.
pub(crate) struct Load {
    accepted: Arc<Mutex<Vec<String>>>,
    unavailable: Arc<Mutex<usize>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    pub(crate) fn start(base: String, key: String, body: serde_json::Value, total: usize) -> Load {
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let unavailable = Arc::new(Mutex::new(0));
        let (acc, una) = (accepted.clone(), unavailable.clone());
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            while acc.lock().unwrap().len() < total {
                let resp = http
                    .post(format!("{base}/v1/runs"))
                    .bearer_auth(&key)
                    .json(&body)
                    .send()
                    .await;
                match resp {
                    Ok(r) if r.status() == 202 => {
                        let v: serde_json::Value = r.json().await.unwrap();
                        acc.lock()
                            .unwrap()
                            .push(v["id"].as_str().unwrap().to_string());
                    }
                    Ok(r) if r.status() == 503 => {
                        assert!(
                            r.headers().contains_key("retry-after"),
                            "503 carries a retry hint"
                        );
                        *una.lock().unwrap() += 1;
                    }
                    Ok(r) => panic!("unexpected answer {}", r.status()),
                    Err(_) => *una.lock().unwrap() += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Load {
            accepted,
            unavailable,
            task,
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    pub(crate) async fn finish(self) -> Vec<String> {
        self.task.await.unwrap();
        self.accepted.lock().unwrap().clone()
    }
}

pub(crate) async fn all_complete(app: &TestApp, ids: &[String]) {
    for id in ids {
        let run = app.wait_status(id, &["completed", "failed"], T).await;
        assert_eq!(run["status"], "completed", "{run}");
        let events = app.events(id, 0, T).await;
        assert!(
            events
                .iter()
                .map(|e| e["id"].as_u64().unwrap())
                .collect::<Vec<_>>()
                .windows(2)
                .all(|w| w[1] > w[0])
        );
        assert_eq!(
            events
                .iter()
                .filter(|e| e["type"] == "run_completed")
                .count(),
            1,
            "run {id}"
        );
    }
}

/// Throughput is back after the fault: every slot of the fleet works at once again. Each of
/// `slots` runs holds its slot on a slow model call, so all of them can be `running` together
/// only if every worker's consumer came back with its full prefetch (a consumer that never
/// reconnected, a leaked slot or a stuck channel caps this below `slots`). Counting busy slots
/// instead of timing keeps the check exact on a loaded machine.
pub(crate) async fn assert_full_capacity(env: &TestEnv, app: &TestApp, slots: usize) {
    let body = scripted_run(
        json!([{"content": "holding a slot", "delay_ms": 4000}]),
        json!([]),
    );
    let mut ids = Vec::new();
    for _ in 0..slots {
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    wait_for("every slot of the fleet to be busy at once", T, || async {
        let (running,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM runs WHERE status = 'running' AND id = ANY($1::uuid[])",
        )
        .bind(&ids)
        .fetch_one(&env.pool)
        .await
        .ok()?;
        (running as usize == slots).then_some(())
    })
    .await;
    for id in &ids {
        let run = app.wait_status(id, &["completed", "failed"], T).await;
        assert_eq!(run["status"], "completed", "{run}");
    }
}

/// Slots of the two workers the RabbitMQ and Postgres tests run (`worker.concurrency` is 8
/// in tests).
pub(crate) const SLOTS: usize = 2 * 8;

pub(crate) fn run_body(env: &TestEnv) -> serde_json::Value {
    scripted_run(
        json!([{"tool_calls": [{"name": "effect", "arguments": {}}], "delay_ms": 50}, {"content": "ok"}]),
        json!([http_tool(env, "effect", "/side-effect")]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared servers: scripts/test runs it alone, after the parallel phase"]
async fn rabbitmq_restart_under_load() {
    let env = TestEnv::with(&[]).await;
    let (_api, base) = env.spawn_api_process(&[]).await;
    let app = env.spawn_api().await;
    let key = app.api_key.clone();
    let _w1 = env.spawn_worker_process(&[]);
    let _w2 = env.spawn_worker_process(&[]);
    let load = Load::start(base.clone(), key, run_body(&env), 60);
    wait_for("load to start", T, || async {
        (load.count() >= 15).then_some(())
    })
    .await;
    servers::rabbitmq_stop();
    let http = reqwest::Client::new();
    // Readiness is checked in the background (api.readiness_interval_ms): it turns within a
    // round or two.
    not_ready_soon(&http, &base, "readyz tells the truth during the outage").await;
    servers::rabbitmq_start().await;
    wait_for("readyz to recover", T, || {
        let req = http.get(format!("{base}/readyz")).send();
        async move { req.await.ok().filter(|r| r.status() == 200) }
    })
    .await;
    let ids = load.finish().await;
    assert_eq!(ids.len(), 60);
    all_complete(&app, &ids).await;
    assert_eq!(
        env.tools.state().side_effect_count(),
        60,
        "each side effect happened once"
    );
    assert_full_capacity(&env, &app, SLOTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared servers: scripts/test runs it alone, after the parallel phase"]
async fn postgres_restart_under_load() {
    let env = TestEnv::with(&[("database.connect_timeout_ms", "1000")]).await;
    let (_api, base) = env.spawn_api_process(&[]).await;
    let key = agentfleet_shared::store::tenants::create(&env.pool, "t")
        .await
        .unwrap()
        .api_key;
    let _w1 = env.spawn_worker_process(&[]);
    let _w2 = env.spawn_worker_process(&[]);
    let load = Load::start(base.clone(), key.clone(), run_body(&env), 60);
    wait_for("load to start", T, || async {
        (load.count() >= 15).then_some(())
    })
    .await;
    servers::postgres_stop();
    let http = reqwest::Client::new();
    wait_for("a 503 while Postgres is down", T, || async {
        (*load.unavailable.lock().unwrap() > 0).then_some(())
    })
    .await;
    not_ready_soon(&http, &base, "readyz says not ready while Postgres is down").await;
    servers::postgres_start().await;
    let ids = load.finish().await;
    assert_eq!(ids.len(), 60);
    // Check through an API in this process (a fresh pool).
    let mut app = env.spawn_api().await;
    app.api_key = key;
    all_complete(&app, &ids).await;
    let effects = env.tools.state().side_effect_count();
    assert_eq!(effects, 60, "each accepted run's side effect happened once");
    assert_full_capacity(&env, &app, SLOTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared servers: scripts/test runs it alone, after the parallel phase"]
async fn redis_restart_while_runs_stream() {
    let env = TestEnv::with(&[]).await;
    let app = env.spawn_api().await;
    let _w = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"content": "streaming through a redis restart", "chunks": 20, "chunk_delay_ms": 50,
                "tool_calls": [{"name": "effect", "arguments": {}}]}, {"content": "done"}]),
        json!([http_tool(&env, "effect", "/side-effect")]),
    );
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let watch = app.watch(&ids[0]);
    watch.wait_type("message_delta", T).await;
    servers::redis_restart().await;
    for id in &ids {
        let run = app.wait_status(id, &["completed", "failed"], T).await;
        assert_eq!(run["status"], "completed");
        // A reconnecting client gets a consistent stream: increasing ids ending in run_completed.
        let events = app.events(id, 0, T).await;
        let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[1] > w[0]), "{ids:?}");
        assert_eq!(events.last().unwrap()["type"], "run_completed");
    }
    assert_eq!(env.tools.state().side_effect_count(), 10);
    assert_full_capacity(&env, &app, SLOTS / 2).await;
}

/// Waits until the API at `base` answers `/readyz` with 503 (its background check has seen the
/// outage).
async fn not_ready_soon(http: &reqwest::Client, base: &str, what: &str) {
    wait_for(what, T, || {
        let req = http.get(format!("{base}/readyz")).send();
        async move { req.await.ok().filter(|r| r.status() == 503) }
    })
    .await;
}
