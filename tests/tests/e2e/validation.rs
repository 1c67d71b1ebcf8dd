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

/// The largest batch: every run is queued with its own thread and user message, has exactly
/// one event (`run_queued`, id 1, the shape a single run's has), and its message is on the
/// queue when the answer comes (the sweeper is held off, so completing proves the publish).
/// Without the fair share, which would hold what is past the tenant's window (`fair_share::`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_1000_is_committed_announced_and_published_and_completes() {
    let env = TestEnv::with(&[
        ("worker.requeue_after_ms", "600000"),
        ("fair_share.window_per_slot", "0"),
    ])
    .await;
    let app = env.spawn_api().await;
    let single = app
        .start_run(&json!({"input": "single", "agent": {"model": "mock"}}))
        .await;
    let single_id = single["id"].as_str().unwrap().to_string();
    let n = 1000;
    let runs: Vec<Value> = (0..n)
        .map(|i| {
            json!({"input": format!("run {i}"), "agent": {"model": "mock", "max_iterations": 3},
                        "metadata": {"i": i}})
        })
        .collect();
    let resp = app.post("/v1/runs/batch", &json!({"runs": runs})).await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    let created = body["runs"].as_array().unwrap();
    assert_eq!(created.len(), n);
    let ids: Vec<uuid::Uuid> = created
        .iter()
        .map(|r| r["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(created.iter().all(|r| r["status"] == "queued"));

    // Postgres: each run queued, in request order, on a thread of its own with its message.
    let rows: Vec<(uuid::Uuid, String, i32, Value, uuid::Uuid, Value, i64)> = sqlx::query_as(
        "SELECT r.id, r.status, r.max_iterations, r.metadata, t.tenant_id, m.body,
                (SELECT count(*) FROM runs o WHERE o.thread_id = r.thread_id)
         FROM runs r JOIN threads t ON t.id = r.thread_id
         JOIN messages m ON m.run_id = r.id AND m.thread_id = r.thread_id
         WHERE r.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), n, "one run, thread and message per run");
    let by_id: std::collections::HashMap<_, _> = rows.into_iter().map(|r| (r.0, r)).collect();
    for (i, id) in ids.iter().enumerate() {
        let (_, status, max_iterations, metadata, tenant, message, on_thread) = &by_id[id];
        assert_eq!(status, "queued");
        assert_eq!(*max_iterations, 3);
        assert_eq!(metadata, &json!({"i": i}));
        assert_eq!(*tenant, app.tenant_id);
        assert_eq!(
            message,
            &json!({"role": "user", "content": format!("run {i}")})
        );
        assert_eq!(*on_thread, 1, "a new thread per run");
    }
    let (threads,): (i64,) = sqlx::query_as("SELECT count(DISTINCT thread_id) FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(threads, n as i64 + 1);

    // Redis: exactly one event per run, `run_queued` with id 1, shaped as a single run's.
    let shape = |raw: &str| {
        let mut v: Value = serde_json::from_str(raw).unwrap();
        let obj = v.as_object_mut().unwrap();
        for k in ["run_id", "thread_id", "at"] {
            assert!(obj.remove(k).is_some(), "{raw} lacks {k}");
        }
        v
    };
    let single_events = env.raw_events(&single_id).await;
    assert_eq!(single_events.len(), 1);
    let expected = shape(&single_events[0]);
    assert_eq!(expected["id"], 1);
    assert_eq!(expected["type"], "run_queued");
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    for id in &ids {
        pipe.cmd("LRANGE")
            .arg(format!("{}:run:{{{id}}}:events", env.prefix))
            .arg(0)
            .arg(-1);
    }
    let lists: Vec<Vec<String>> = pipe.query_async(&mut conn).await.unwrap();
    for ((id, events), run) in ids.iter().zip(&lists).zip(created) {
        assert_eq!(events.len(), 1, "run {id}: {events:?}");
        let event: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(event["run_id"], id.to_string());
        assert_eq!(event["thread_id"], run["thread_id"]);
        assert_eq!(shape(&events[0]), expected);
    }

    // RabbitMQ: every message confirmed before the answer; a worker completes them all.
    let queue = format!("{}.runs", env.prefix);
    assert_eq!(env.queue_depth(&queue).await, n as u32 + 1);
    let _worker = env.spawn_worker_with(&[("worker.concurrency", "64")]).await;
    wait_for(
        "every run of the batch to complete",
        std::time::Duration::from_secs(300),
        || async {
            let (done,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM runs WHERE id = ANY($1) AND status = 'completed'",
            )
            .bind(&ids)
            .fetch_one(&env.pool)
            .await
            .ok()?;
            (done == n as i64).then_some(())
        },
    )
    .await;
}

/// Runs on existing threads keep their checks inside the batch's one transaction: a busy or
/// unknown thread refuses the whole batch naming the run, and nothing of the new-thread runs
/// is written, announced or published; a free thread takes its run beside new-thread runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixing_new_and_existing_threads_is_all_or_nothing() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let first = app
        .start_run(&json!({"input": "first", "agent": {"model": "mock"}}))
        .await;
    let busy = first["thread_id"].as_str().unwrap().to_string();
    let new = |i: usize| json!({"input": format!("new {i}"), "agent": {"model": "mock"}});
    let on =
        |thread: &str| json!({"input": "more", "thread_id": thread, "agent": {"model": "mock"}});
    let counts = || async {
        let (threads, runs, messages): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM threads), (SELECT count(*) FROM runs),
                    (SELECT count(*) FROM messages)",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        [threads, runs, messages]
    };
    let before = counts().await;
    assert_eq!(before, [1, 1, 1]);
    let queue = format!("{}.runs", env.prefix);

    let runs = vec![new(0), new(1), on(&busy), new(3)];
    let (status, err) = error_of(app.post("/v1/runs/batch", &json!({"runs": runs})).await).await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["code"], "thread_busy");
    let message = err["message"].as_str().unwrap();
    assert!(message.starts_with("runs[2]: thread "), "{message}");
    assert!(message.contains(first["id"].as_str().unwrap()), "{message}");
    assert_eq!(counts().await, before, "nothing written");
    assert_eq!(env.queue_depth(&queue).await, 1, "nothing published");

    let unknown = uuid::Uuid::new_v4().to_string();
    let runs = vec![new(0), on(&unknown), new(2)];
    let (status, err) = error_of(app.post("/v1/runs/batch", &json!({"runs": runs})).await).await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["message"], "runs[1].thread_id: thread not found");
    assert_eq!(counts().await, before, "nothing written");

    // Two runs on one free thread: the second finds the first active.
    let cancel = app
        .post(
            &format!("/v1/runs/{}/cancel", first["id"].as_str().unwrap()),
            &json!({}),
        )
        .await;
    assert_eq!(cancel.status(), 200);
    let runs = vec![new(0), on(&busy), new(2), on(&busy)];
    let (status, err) = error_of(app.post("/v1/runs/batch", &json!({"runs": runs})).await).await;
    assert_eq!(status, 409, "{err}");
    assert!(
        err["message"].as_str().unwrap().starts_with("runs[3]: "),
        "{err}"
    );
    assert_eq!(counts().await, before, "nothing written");

    // A free thread beside new ones: accepted, in request order.
    let runs = vec![new(0), on(&busy), new(2)];
    let resp = app.post("/v1/runs/batch", &json!({"runs": runs})).await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    let created = body["runs"].as_array().unwrap();
    assert_eq!(created.len(), 3);
    assert_eq!(created[1]["thread_id"], busy.as_str());
    assert_ne!(created[0]["thread_id"], busy.as_str());
    assert_ne!(created[0]["thread_id"], created[2]["thread_id"]);
    assert_eq!(counts().await, [3, 4, 4]);
    for (i, run) in created.iter().enumerate() {
        let id = run["id"].as_str().unwrap();
        let events = env.raw_events(id).await;
        assert_eq!(events.len(), 1, "{events:?}");
        let event: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(
            (&event["id"], &event["type"]),
            (&json!(1), &json!("run_queued"))
        );
        let (input,): (String,) =
            sqlx::query_as("SELECT body->>'content' FROM messages WHERE run_id = $1::uuid")
                .bind(id)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert_eq!(
            input,
            if i == 1 {
                "more".to_string()
            } else {
                format!("new {i}")
            }
        );
    }
    assert_eq!(env.queue_depth(&queue).await, 4);
}

/// Tool schemas are held per request: their patterns are estimated from their structure (a
/// UUID's pattern, refused while every counted repetition multiplied, is accepted), the
/// distinct schemas of a batch share one limit (each agent had its own, so a batch of
/// 10,000 agents with their own patterns compiled 10,000 times the limit), and what is
/// refused names its field and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_schemas_share_one_pattern_limit_per_request() {
    let env = TestEnv::with(&[
        ("api.max_schema_patterns", "4"),
        ("api.max_schema_pattern_states", "20000"),
    ])
    .await;
    let app = env.spawn_api().await;
    let uuid = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
    let run = |i: usize, patterns: &[String]| {
        let properties: serde_json::Map<String, Value> = patterns
            .iter()
            .enumerate()
            .map(|(j, p)| (format!("p{j}"), json!({"type": "string", "pattern": p})))
            .collect();
        json!({"input": format!("run {i}"), "agent": {"model": "mock", "tools": [
            {"name": "t", "kind": "http", "url": "http://tools.example/t",
             "parameters": {"type": "object", "properties": properties}}]}})
    };
    let count = || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
            .fetch_one(&env.pool)
            .await
            .unwrap();
        n
    };
    let resp = app.post("/v1/runs", &run(0, &[uuid.to_owned()])).await;
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    // The same three patterns in every run of a batch count once.
    let same: Vec<String> = (0..3).map(|j| format!("^{uuid}{j}")).collect();
    let runs: Vec<Value> = (0..50).map(|i| run(i, &same)).collect();
    let resp = app.post("/v1/runs/batch", &json!({"runs": runs})).await;
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    let written = count().await;
    assert_eq!(written, 51);
    // Three runs with two patterns of their own each: six distinct patterns, over four.
    let runs: Vec<Value> = (0..3)
        .map(|i| run(i, &[format!("^a{i}$"), format!("^b{i}$")]))
        .collect();
    let (status, err) = error_of(app.post("/v1/runs/batch", &json!({"runs": runs})).await).await;
    assert_eq!(status, 422, "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.starts_with("runs[2].agent.tools[0].parameters")
            && message.contains("more than 4 patterns")
            && message.contains("batch's distinct tool schemas"),
        "{err}"
    );
    let items: Vec<Value> = (0..3)
        .map(|i| {
            let mut item = run(i, &[format!("^a{i}$"), format!("^b{i}$")]);
            item["custom_id"] = json!(format!("c{i}"));
            item
        })
        .collect();
    let (status, err) = error_of(app.post("/v1/batches", &json!({"runs": items})).await).await;
    assert_eq!(status, 422, "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .starts_with("runs[2].agent.tools[0].parameters"),
        "{err}"
    );
    // One pattern whose counted repetition compiles large: refused by its estimated states.
    let (status, err) = error_of(
        app.post("/v1/runs", &run(1, &["(ab|cd|ef){5000}".to_owned()]))
            .await,
    )
    .await;
    assert_eq!(status, 422, "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.starts_with("agent.tools[0].parameters") && message.contains("states"),
        "{err}"
    );
    assert_eq!(count().await, written, "nothing written by a refusal");
}
