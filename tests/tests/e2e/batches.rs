//! Batches as a resource (`/v1/batches`): submitted once whatever the retries, created in
//! chunks after the answer, counted, listed as JSONL, cancelled, followed over SSE, finished
//! by another API process after a crash mid-way.

use std::collections::HashSet;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};

use agentfleet_shared::store::tenants;
use agentfleet_tests::harness::*;
use agentfleet_tests::mock_llm::script;

/// Quick sweeps and progress, so waits are short.
const FAST: &[(&str, &str)] = &[
    ("api.batch_sweep_interval_ms", "200"),
    ("api.batch_progress_interval_ms", "200"),
    ("api.batch_lease_ms", "2000"),
];

/// Item `i`: a run whose scripted model answers `answer i` at once.
fn item(i: usize) -> Value {
    json!({"custom_id": format!("line-{i}"),
           "input": script(json!([{"content": format!("answer {i}")}])),
           "agent": {"model": "mock"}})
}

fn batch_body(n: usize) -> Value {
    json!({"runs": (0..n).map(item).collect::<Vec<_>>(), "metadata": {"job": "nightly"}})
}

async fn submit_to(
    http: &reqwest::Client,
    base: &str,
    api_key: &str,
    body: &Value,
    key: Option<&str>,
) -> reqwest::Result<(u16, Value)> {
    let mut req = http
        .post(format!("{base}/v1/batches"))
        .bearer_auth(api_key)
        .json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

async fn submit(app: &TestApp, body: &Value, key: Option<&str>) -> (u16, Value) {
    submit_to(&app.http, &app.address, &app.api_key, body, key)
        .await
        .expect("request")
}

async fn get_batch(app: &TestApp, id: &str) -> Value {
    let resp = app.get(&format!("/v1/batches/{id}")).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

async fn wait_batch(app: &TestApp, id: &str, status: &str, timeout: Duration) -> Value {
    wait_for(&format!("batch {status}"), timeout, || async {
        let b = get_batch(app, id).await;
        (b["status"] == status).then_some(b)
    })
    .await
}

async fn results(app: &TestApp, id: &str) -> Vec<Value> {
    let resp = app.get(&format!("/v1/batches/{id}/results")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    let text = resp.text().await.unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "whole lines");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

async fn one(env: &TestEnv, sql: &str, id: &str) -> i64 {
    sqlx::query_as::<_, (i64,)>(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(uuid::Uuid::parse_str(id).unwrap())
        .fetch_one(&env.pool)
        .await
        .expect("query")
        .0
}

fn counts_sum(batch: &Value) -> i64 {
    batch["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum()
}

/// The test: 2,000 runs submitted twice with one key make 2,000 runs, all complete, and
/// the results list every custom_id once with its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_submitted_twice_with_one_key_runs_once_to_completion() {
    const N: usize = 2000;
    let env = TestEnv::with(FAST).await;
    let app = env.spawn_api().await;
    let _w1 = env.spawn_worker_with(&[("worker.concurrency", "16")]).await;
    let _w2 = env.spawn_worker_with(&[("worker.concurrency", "16")]).await;
    let body = batch_body(N);
    let (status, first) = submit(&app, &body, Some("nightly-2026-11-23")).await;
    assert_eq!(status, 202, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(first["total"], N);
    assert_eq!(first["metadata"], json!({"job": "nightly"}));
    assert_eq!(counts_sum(&first), N as i64);
    // A retry (the first answer timed out, say): the same batch, nothing new.
    let (status, again) = submit(&app, &body, Some("nightly-2026-11-23")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], first["id"]);
    // The same key with another body is refused.
    let (status, err) = submit(&app, &batch_body(3), Some("nightly-2026-11-23")).await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"]["code"], "idempotency_key_reused");

    let done = wait_batch(&app, &id, "completed", Duration::from_secs(240)).await;
    assert_eq!(done["counts"]["completed"], N, "{done}");
    assert_eq!(counts_sum(&done), N as i64, "{done}");
    assert!(done["started_at"].is_string() && done["finished_at"].is_string());
    assert!(
        done["usage"]["total_tokens"].as_i64().unwrap() > 0,
        "{done}"
    );
    assert_eq!(
        one(&env, "SELECT count(*) FROM runs WHERE batch_id = $1", &id).await,
        N as i64
    );
    let (all,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(all, N as i64, "no run beyond the batch's");
    assert_eq!(
        one(&env, "SELECT count(*) FROM batches WHERE id <> $1", &id).await,
        0
    );

    let lines = results(&app, &id).await;
    assert_eq!(lines.len(), N);
    let mut seen = HashSet::new();
    let mut runs = HashSet::new();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            line["custom_id"],
            format!("line-{i}"),
            "in submission order"
        );
        assert!(seen.insert(line["custom_id"].as_str().unwrap().to_owned()));
        assert!(runs.insert(line["run_id"].as_str().unwrap().to_owned()));
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["output"], format!("answer {i}"), "{line}");
        assert!(line["error"].is_null());
    }
    let finished = app
        .get(&format!("/v1/batches/{id}/results?status=finished"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(finished.lines().count(), N);
}

/// Errors name the field; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_batch_is_refused_naming_the_field() {
    let env = TestEnv::with(&[("api.max_batch_items", "3")]).await;
    let app = env.spawn_api().await;
    let message = |v: &Value| {
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let mut dup = batch_body(3);
    dup["runs"][2]["custom_id"] = json!("line-0");
    let (status, err) = submit(&app, &dup, None).await;
    assert_eq!(status, 422);
    assert!(message(&err).starts_with("runs[2].custom_id:"), "{err}");
    let (status, err) = submit(&app, &batch_body(4), None).await;
    assert_eq!(
        (status, message(&err)),
        (422, "runs: must hold 1 to 3 runs".into())
    );
    let (status, err) = submit(&app, &json!({"runs": []}), None).await;
    assert_eq!(status, 422, "{err}");
    assert!(message(&err).starts_with("runs:"), "{err}");
    let mut long = batch_body(1);
    long["runs"][0]["custom_id"] = json!("x".repeat(129));
    let (status, err) = submit(&app, &long, None).await;
    assert_eq!(status, 422);
    assert!(message(&err).starts_with("runs[0].custom_id:"), "{err}");
    let mut bad = batch_body(2);
    bad["runs"][1]["agent"]["model"] = json!("nope");
    let (status, err) = submit(&app, &bad, None).await;
    assert_eq!(status, 422);
    assert!(message(&err).starts_with("runs[1].agent.model"), "{err}");
    let mut missing = batch_body(1);
    missing["runs"][0]
        .as_object_mut()
        .unwrap()
        .remove("custom_id");
    let (status, err) = submit(&app, &missing, None).await;
    assert_eq!(status, 422, "{err}");
    assert!(message(&err).contains("custom_id"), "{err}");
    let mut thread = batch_body(1);
    thread["runs"][0]["thread_id"] = json!(uuid::Uuid::now_v7());
    let (status, err) = submit(&app, &thread, None).await;
    assert_eq!(status, 404, "{err}");
    assert!(message(&err).starts_with("runs[0].thread_id"), "{err}");
    let (batches,): (i64,) = sqlx::query_as("SELECT count(*) FROM batches")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(batches, 0, "nothing was written");
}

/// A cancel stops the creation and cancels every run made; nothing is left active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_creates_nothing_more_and_leaves_nothing_active() {
    const N: usize = 2000;
    // Small chunks: the creation takes a while, so the cancel lands mid-way.
    let mut settings = FAST.to_vec();
    settings.push(("api.batch_chunk_size", "10"));
    let env = TestEnv::with(&settings).await;
    let app = env.spawn_api().await;
    let (status, batch) = submit(&app, &batch_body(N), None).await;
    assert_eq!(status, 202);
    let id = batch["id"].as_str().unwrap().to_owned();
    let resp = app
        .post(&format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let cancelling: Value = resp.json().await.unwrap();
    assert!(
        matches!(
            cancelling["status"].as_str(),
            Some("cancelling" | "cancelled")
        ),
        "{cancelling}"
    );
    let done = wait_batch(&app, &id, "cancelled", Duration::from_secs(120)).await;
    assert_eq!(done["counts"]["cancelled"], N, "{done}");
    assert!(done["finished_at"].is_string());
    let created = one(&env, "SELECT count(*) FROM runs WHERE batch_id = $1", &id).await;
    assert!(
        created < N as i64,
        "the cancel landed after all {N} runs were created; nothing was tested"
    );
    assert_eq!(
        one(
            &env,
            "SELECT count(*) FROM runs WHERE batch_id = $1 AND status <> 'cancelled'",
            &id
        )
        .await,
        0
    );
    assert_eq!(
        one(
            &env,
            "SELECT count(*) FROM batch_items WHERE batch_id = $1 AND run_id IS NOT NULL",
            &id
        )
        .await,
        created,
        "every run is an item's, and no item got a run after the cancel"
    );
    let lines = results(&app, &id).await;
    assert_eq!(lines.len(), N);
    assert!(lines.iter().all(|l| l["status"] == "cancelled"));
    assert_eq!(
        lines.iter().filter(|l| l["run_id"].is_null()).count() as i64,
        N as i64 - created
    );
    // Repeating it is harmless.
    let resp = app
        .post(&format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let again: Value = resp.json().await.unwrap();
    assert_eq!(again["status"], "cancelled");
    assert_eq!(
        one(&env, "SELECT count(*) FROM runs WHERE batch_id = $1", &id).await,
        created
    );
}

/// The events stream reports progress, then `batch_completed`, and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_stream_reports_progress_then_completion() {
    const N: usize = 40;
    let env = TestEnv::with(FAST).await;
    let app = env.spawn_api().await;
    let (status, batch) = submit(&app, &batch_body(N), None).await;
    assert_eq!(status, 202);
    let id = batch["id"].as_str().unwrap().to_owned();
    let resp = app.get(&format!("/v1/batches/{id}/events")).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream().eventsource();
    // The first event is the batch as it stands (no worker yet: nothing ran).
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("first event in time")
        .expect("an event")
        .expect("well-formed");
    assert_eq!(first.event, "progress");
    let _worker = env.spawn_worker().await;
    let mut events = vec![first];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while let Some(ev) = tokio::time::timeout_at(deadline, stream.next())
        .await
        .expect("the stream ends in time")
    {
        events.push(ev.expect("well-formed"));
    }
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds.last(), Some(&"batch_completed"), "{kinds:?}");
    assert!(kinds[..kinds.len() - 1].iter().all(|k| *k == "progress"));
    let last: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(last["status"], "completed");
    assert_eq!(last["counts"]["completed"], N);
    let progress: Vec<Value> = events
        .iter()
        .filter(|e| e.event == "progress")
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert_eq!(
        progress.last(),
        Some(&last),
        "the last progress is the final state"
    );
    for pair in progress.windows(2) {
        assert_ne!(pair[0], pair[1], "progress only when something changed");
    }
}

/// Another tenant's batch (or an unknown one) is 404 on every batch endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_batch_is_not_found() {
    let env = TestEnv::with(FAST).await;
    let app = env.spawn_api().await;
    let (status, batch) = submit(&app, &batch_body(2), None).await;
    assert_eq!(status, 202);
    let id = batch["id"].as_str().unwrap().to_owned();
    let other = env.new_tenant_key().await;
    let unknown = uuid::Uuid::now_v7().to_string();
    for batch in [&id, &unknown] {
        for path in ["", "/results", "/events"] {
            let resp = app
                .get_as(&format!("/v1/batches/{batch}{path}"), &other)
                .await;
            assert_eq!(resp.status(), 404, "{path}");
        }
        let resp = app
            .http
            .post(app.url(&format!("/v1/batches/{batch}/cancel")))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
    }
    let listed: Value = app
        .get_as("/v1/batches", &other)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["batches"], json!([]));
    let mine: Value = app.get("/v1/batches").await.json().await.unwrap();
    assert_eq!(mine["batches"][0]["id"], id.as_str());
    // The same idempotency key is each tenant's own.
    let (status, _) = submit(&app, &batch_body(1), Some("k")).await;
    assert_eq!(status, 202);
    let (status, _) = submit_to(&app.http, &app.address, &other, &batch_body(1), Some("k"))
        .await
        .unwrap();
    assert_eq!(status, 202);
}

/// `POST /v1/runs/batch` stays synchronous and names its batch, which the batch endpoints
/// serve (custom_id = the run's index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_synchronous_batch_has_a_batch_handle() {
    let env = TestEnv::with(FAST).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let runs: Vec<Value> = (0..3)
        .map(|i| {
            let mut v = item(i);
            v.as_object_mut().unwrap().remove("custom_id");
            v
        })
        .collect();
    let resp = app.post("/v1/runs/batch", &json!({ "runs": runs })).await;
    assert_eq!(resp.status(), 202);
    let created: Value = resp.json().await.unwrap();
    let id = created["batch_id"].as_str().unwrap().to_owned();
    wait_batch(&app, &id, "completed", Duration::from_secs(60)).await;
    let lines = results(&app, &id).await;
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["0", "1", "2"]);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["run_id"], created["runs"][i]["id"]);
        assert_eq!(line["output"], format!("answer {i}"));
    }
}

/// The API dies right after the first chunk of runs commits; a restarted API takes the batch
/// over once the lease expires and creates the rest, without creating any run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_way_is_finished_by_the_next_api_without_duplicates() {
    const N: usize = 500;
    let mut settings = FAST.to_vec();
    settings.push(("api.batch_chunk_size", "100"));
    let env = TestEnv::with(&settings).await;
    let tenant = tenants::create(&env.pool, "t").await.unwrap();
    let http = reqwest::Client::new();
    let body = batch_body(N);
    let (mut crashing, base) = env
        .spawn_api_process(&[("AGENTFLEET_FAILPOINTS", "batch_after_chunk")])
        .await;
    // The process may die before its answer is sent: a retry with the key is the remedy.
    let first = submit_to(&http, &base, &tenant.api_key, &body, Some("k")).await;
    let code = crashing.wait_exit(Duration::from_secs(30)).await;
    assert_ne!(code, Some(0), "aborted at the failpoint");
    let created = wait_for("the batch row", Duration::from_secs(5), || async {
        let row: Option<(uuid::Uuid, String)> = sqlx::query_as("SELECT id, status FROM batches")
            .fetch_optional(&env.pool)
            .await
            .unwrap();
        row
    })
    .await;
    let (id, status) = created;
    assert_eq!(status, "creating");
    let made = one(
        &env,
        "SELECT count(*) FROM runs WHERE batch_id = $1",
        &id.to_string(),
    )
    .await;
    assert_eq!(made, 100, "exactly the first chunk before the crash");
    if let Ok((status, answer)) = first {
        assert_eq!(
            (status, answer["id"].as_str()),
            (202, Some(id.to_string().as_str()))
        );
    }

    let (_api, base) = env.spawn_api_process(&[]).await;
    let _worker = env.spawn_worker().await;
    let (status, again) = submit_to(&http, &base, &tenant.api_key, &body, Some("k"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], id.to_string());
    let done = wait_for("the batch completes", Duration::from_secs(180), || {
        let req = http
            .get(format!("{base}/v1/batches/{id}"))
            .bearer_auth(&tenant.api_key)
            .send();
        async move {
            let b: Value = req.await.ok()?.json().await.ok()?;
            (b["status"] == "completed").then_some(b)
        }
    })
    .await;
    assert_eq!(done["counts"]["completed"], N, "{done}");
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs),
                (SELECT count(DISTINCT run_id) FROM batch_items WHERE batch_id = $1),
                (SELECT count(*) FROM batch_items WHERE batch_id = $1 AND run_id IS NULL)",
    )
    .bind(id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(counts, (N as i64, N as i64, 0));
}

/// `POST /v1/batches` has its own body limit (`api.max_batch_body_bytes`); the other routes
/// keep `api.max_body_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_has_a_body_limit_of_its_own() {
    let env = TestEnv::with(&[
        ("api.max_body_bytes", "1048576"),
        ("api.max_batch_body_bytes", "2097152"),
    ])
    .await;
    let app = env.spawn_api().await;
    // About 1.5 MiB: over the general limit, within the batch's.
    let big = |n: usize| {
        let runs: Vec<Value> = (0..n)
            .map(|i| {
                json!({"custom_id": format!("c{i}"), "input": "x".repeat(200_000),
                       "agent": {"model": "mock"}})
            })
            .collect();
        json!({ "runs": runs })
    };
    let (status, batch) = submit(&app, &big(8), None).await;
    assert_eq!(status, 202, "{batch}");
    assert_eq!(batch["total"], 8);
    let resp = app.post("/v1/runs/batch", &big(8)).await;
    assert_eq!(
        resp.status(),
        413,
        "the synchronous batch keeps api.max_body_bytes"
    );
    let (status, err) = submit(&app, &big(12), None).await;
    assert_eq!(status, 413);
    assert_eq!(err["error"]["code"], "payload_too_large");
}

/// A tenant with a running limit: its batch's runs are created held and dispatched in turn,
/// never more than the limit at once, and all of them complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_respects_the_tenants_running_limit() {
    const N: usize = 120;
    let mut settings = FAST.to_vec();
    settings.push(("limits.max_running_runs", "4"));
    settings.push(("api.batch_chunk_size", "50"));
    let env = TestEnv::with(&settings).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_with(&[("worker.concurrency", "16")]).await;
    let (status, batch) = submit(&app, &batch_body(N), None).await;
    assert_eq!(status, 202);
    let id = batch["id"].as_str().unwrap().to_owned();
    let done = wait_batch(&app, &id, "completed", Duration::from_secs(120)).await;
    assert_eq!(done["counts"]["completed"], N, "{done}");
    assert_eq!(
        one(
            &env,
            "SELECT count(*) FROM runs WHERE batch_id = $1 AND fair",
            &id
        )
        .await,
        N as i64,
        "created fair (held until dispatched)"
    );
    let most = one(
        &env,
        "SELECT coalesce(max(n), 0) FROM (
             SELECT (SELECT count(*) FROM runs o WHERE o.batch_id = $1
                       AND o.started_at <= r.started_at AND o.finished_at > r.started_at) AS n
             FROM runs r WHERE r.batch_id = $1) x",
        &id,
    )
    .await;
    assert!((1..=4).contains(&most), "at most 4 at once, saw {most}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_runs_are_not_created_yet_counts_against_max_active_runs() {
    let mut settings = FAST.to_vec();
    settings.push(("limits.max_active_runs", "3"));
    let env = TestEnv::with(&settings).await;
    let app = env.spawn_api().await;
    // Hold off run creation: the driver's chunk insert waits for this lock, so the first
    // batch's items stay items (not yet runs) while the second batch is submitted.
    let mut hold = env.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE runs IN SHARE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let (status, first) = submit(&app, &batch_body(3), None).await;
    assert_eq!(status, 202, "{first}");
    let first_id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(
        one(
            &env,
            "SELECT count(*) FROM runs WHERE batch_id = $1",
            &first_id
        )
        .await,
        0,
        "no run yet: the items alone fill the quota"
    );
    let (status, refused) = submit(&app, &batch_body(1), None).await;
    assert_eq!(status, 429, "3 pending items + 1 is past 3: {refused}");
    assert_eq!(
        refused["error"]["code"], "too_many_active_runs",
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it has 3, and this request adds 1"),
        "{refused}"
    );
    hold.rollback().await.unwrap();
    // Once they are runs (queued: no worker), they still count, once each.
    wait_batch(&app, &first_id, "in_progress", Duration::from_secs(60)).await;
    let (status, refused) = submit(&app, &batch_body(1), None).await;
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it has 3,"),
        "{refused}"
    );
    assert_eq!(
        one(
            &env,
            "SELECT count(*) FROM batches WHERE id <> $1",
            &first_id
        )
        .await,
        0,
        "nothing written for the refused batches"
    );
}

/// A chunk that fails the same way every time is not retried for ever: after
/// `api.batch_max_chunk_failures` failures in a row (each take-over tries once more), the items
/// still without a run get an `internal_error` and the batch finishes; their places in the
/// tenant's active-runs quota are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_chunks_keep_failing_gives_its_items_an_error_and_finishes() {
    let mut settings = FAST.to_vec();
    settings.push(("api.batch_max_chunk_failures", "3"));
    settings.push(("limits.max_active_runs", "3"));
    let env = TestEnv::with(&settings).await;
    let (_api, base) = env
        .spawn_api_process(&[("AGENTFLEET_FAILPOINTS", "error:batch:chunk")])
        .await;
    let app = env.app_at(&base, reqwest::Client::new()).await;
    let (status, batch) = submit(&app, &batch_body(3), None).await;
    assert_eq!(status, 202, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    wait_batch(&app, &id, "completed", Duration::from_secs(60)).await;
    let lines = results(&app, &id).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(line["status"], "failed", "{line}");
        assert_eq!(line["error"]["code"], "internal_error", "{line}");
        assert!(line["run_id"].is_null(), "{line}");
    }
    assert_eq!(
        one(
            &env,
            "SELECT chunk_failures::int8 FROM batches WHERE id = $1",
            &id
        )
        .await,
        3,
        "given up at the third failure in a row"
    );
    assert_eq!(
        one(&env, "SELECT count(*) FROM runs WHERE batch_id = $1", &id).await,
        0
    );
    // Its items hold no place in the quota any more.
    let (status, again) = submit(&app, &batch_body(3), None).await;
    assert_eq!(status, 202, "{again}");
}
