//! Bad input gets a clear 4xx naming the field, and nothing is written.

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.expect("error bodies are JSON");
    (status, body["error"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_clear_errors_and_write_nothing() {
    let env = TestEnv::with(&[
        ("api.max_body_bytes", "4096"),
        ("api.max_input_bytes", "1024"),
    ])
    .await;
    let app = env.spawn_api().await;
    let post_raw = |body: &'static str| {
        app.http
            .post(app.url("/v1/runs"))
            .bearer_auth(&app.api_key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let (status, err) = error_of(post_raw("{not json").await.unwrap()).await;
    assert_eq!(status, 400);
    assert_eq!(err["code"], "malformed_json");

    let (status, err) = error_of(
        app.post("/v1/runs", &json!({"agent": {"model": "mock"}}))
            .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(err["message"].as_str().unwrap().contains("input"), "{err}");

    let (status, err) = error_of(
        app.post(
            "/v1/runs",
            &json!({"input": "hi", "agent": {"model": "gpt-unknown"}}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        err["message"].as_str().unwrap().starts_with("agent.model"),
        "{err}"
    );

    let (status, err) = error_of(
        app.post(
            "/v1/runs",
            &json!({"input": "  ", "agent": {"model": "mock"}}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        err["message"].as_str().unwrap().starts_with("input"),
        "{err}"
    );

    let bad_tool = json!({"input": "hi", "agent": {"model": "mock", "tools": [{"name": "t", "kind": "http", "url": "file:///etc"}]}});
    let (status, err) = error_of(app.post("/v1/runs", &bad_tool).await).await;
    assert_eq!(status, 422);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .starts_with("agent.tools[0].url"),
        "{err}"
    );

    let unknown_field = json!({"input": "hi", "agent": {"model": "mock"}, "colour": "red"});
    let (status, err) = error_of(app.post("/v1/runs", &unknown_field).await).await;
    assert_eq!(status, 422);
    assert!(err["message"].as_str().unwrap().contains("colour"), "{err}");

    let long_input = json!({"input": "x".repeat(2000), "agent": {"model": "mock"}});
    let (status, err) = error_of(app.post("/v1/runs", &long_input).await).await;
    assert_eq!(status, 422);
    assert!(err["message"].as_str().unwrap().contains("1024"), "{err}");

    let oversize = json!({"input": "x".repeat(10_000), "agent": {"model": "mock"}});
    let (status, err) = error_of(app.post("/v1/runs", &oversize).await).await;
    assert_eq!(status, 413);
    assert_eq!(err["code"], "payload_too_large");

    let unknown_thread =
        json!({"input": "hi", "agent": {"model": "mock"}, "thread_id": uuid::Uuid::new_v4()});
    let (status, _) = error_of(app.post("/v1/runs", &unknown_thread).await).await;
    assert_eq!(status, 404);

    let resp = app
        .http
        .post(app.url("/v1/runs"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(status, 401);
    assert_eq!(err["code"], "unauthorized");

    let (status, err) = error_of(app.get("/v1/runs/not-a-uuid").await).await;
    assert_eq!(status, 422);
    assert!(err["message"].as_str().unwrap().starts_with("id"), "{err}");

    let (status, _) = error_of(app.get("/v1/runs?status=bogus").await).await;
    assert_eq!(status, 422);

    // Nothing was half written.
    let (runs, threads, messages): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM threads), (SELECT count(*) FROM messages)",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!((runs, threads, messages), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_same_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let body = json!({"input": "hi", "agent": {"model": "mock"}});
    let send = |b: &Value| {
        app.http
            .post(app.url("/v1/runs"))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "k-1")
            .json(b)
            .send()
    };
    let first: Value = send(&body).await.unwrap().json().await.unwrap();
    let second = send(&body).await.unwrap();
    assert_eq!(second.status(), 202);
    let second: Value = second.json().await.unwrap();
    assert_eq!(first["id"], second["id"]);
    let other = json!({"input": "something else", "agent": {"model": "mock"}});
    let (status, err) = error_of(send(&other).await.unwrap()).await;
    assert_eq!(status, 409);
    assert_eq!(err["code"], "idempotency_key_reused");
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_newest_first_with_cursor_pagination() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let run = app
            .start_run(&json!({"input": format!("run {i}"), "agent": {"model": "mock"}}))
            .await;
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    let page1: Value = app.get("/v1/runs?limit=3").await.json().await.unwrap();
    let page1_ids: Vec<&str> = page1["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        page1_ids,
        [ids[4].as_str(), ids[3].as_str(), ids[2].as_str()]
    );
    let cursor = page1["next_cursor"].as_str().unwrap();
    let page2: Value = app
        .get(&format!("/v1/runs?limit=3&cursor={cursor}"))
        .await
        .json()
        .await
        .unwrap();
    let page2_ids: Vec<&str> = page2["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(page2_ids, [ids[1].as_str(), ids[0].as_str()]);
    assert!(page2["next_cursor"].is_null());
    let queued: Value = app
        .get("/v1/runs?status=queued")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(queued["data"].as_array().unwrap().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_all_or_nothing_and_its_runs_complete() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let good = |i: usize| json!({"input": format!("run {i}"), "agent": {"model": "mock"}});
    // One bad run refuses the whole batch, naming it.
    let mut runs: Vec<Value> = (0..5).map(good).collect();
    runs[3]["agent"]["model"] = json!("nope");
    let (status, err) = error_of(app.post("/v1/runs/batch", &json!({"runs": runs})).await).await;
    assert_eq!(status, 422);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .starts_with("runs[3].agent.model"),
        "{err}"
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let (status, _) = error_of(app.post("/v1/runs/batch", &json!({"runs": []})).await).await;
    assert_eq!(status, 422);
    // A good batch: 202, in order, and every run completes.
    let _worker = env.spawn_worker().await;
    let resp = app
        .post(
            "/v1/runs/batch",
            &json!({"runs": (0..20).map(good).collect::<Vec<_>>()}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    let ids: Vec<String> = body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 20);
    for id in &ids {
        let run = app
            .wait_status(id, &["completed"], std::time::Duration::from_secs(30))
            .await;
        assert_eq!(run["status"], "completed");
    }
}
