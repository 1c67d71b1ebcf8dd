//! Cancellation, model-call failures and tool deadlines.

use std::time::{Duration, Instant};

use serde_json::json;

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_run_in_the_middle_of_a_model_stream() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"content": "a very long answer that takes a while", "chunks": 40, "chunk_delay_ms": 100}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("message_delta", T).await;
    let resp = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "cancelled");
    // The worker lets go at once: its drain finishes long before the stream would have.
    let started = Instant::now();
    worker.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "worker still busy {:?} after the cancel",
        started.elapsed()
    );
    let events = app.events(&id, 0, T).await;
    assert_eq!(events.last().unwrap()["type"], "run_cancelled");
    assert_gap_free(&events);
    // Repeating the cancel is harmless.
    let again = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(app.events(&id, 0, T).await, events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_run_in_the_middle_of_a_tool_call() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "slow", "arguments": {"ms": 5000}}]}, {"content": "never"}]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("tool_started", T).await;
    assert_eq!(
        app.post(&format!("/v1/runs/{id}/cancel"), &json!({}))
            .await
            .status(),
        200
    );
    let started = Instant::now();
    worker.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "worker still busy {:?} after the cancel",
        started.elapsed()
    );
    assert_eq!(
        env.llm.requests().len(),
        1,
        "the model was not called again"
    );
    assert_eq!(app.run(&id).await["status"], "cancelled");
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM tool_calls")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        status, "failed",
        "the abandoned call is closed, not left running"
    );
    assert!(error.unwrap().contains("cancelled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_and_waiting_runs_are_cancelled_at_once_and_final_runs_refuse() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // Queued: no worker yet.
    let queued = app
        .start_run(&scripted_run(json!([{"content": "x"}]), json!([])))
        .await;
    let qid = queued["id"].as_str().unwrap().to_string();
    let resp = app
        .post(&format!("/v1/runs/{qid}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.run(&qid).await["status"], "cancelled");
    // Waiting.
    let _worker = env.spawn_worker().await;
    let waiting = app
        .start_run(&scripted_run(
            json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "?"}}]}]),
            json!([]),
        ))
        .await;
    let wid = waiting["id"].as_str().unwrap().to_string();
    app.wait_status(&wid, &["waiting_for_input"], T).await;
    assert_eq!(
        app.post(&format!("/v1/runs/{wid}/cancel"), &json!({}))
            .await
            .status(),
        200
    );
    let cancelled = app.run(&wid).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["pending"].is_null());
    assert_eq!(
        app.post(&format!("/v1/runs/{wid}/resume"), &json!({"input": "late"}))
            .await
            .status(),
        409
    );
    let events = app.events(&wid, 0, T).await;
    assert_eq!(events.last().unwrap()["type"], "run_cancelled");
    // The cancelled queued run is never executed, even though its message is still delivered.
    let done = app
        .start_run(&scripted_run(json!([{"content": "y"}]), json!([])))
        .await;
    let did = done["id"].as_str().unwrap().to_string();
    app.wait_status(&did, &["completed"], T).await;
    assert_eq!(app.run(&qid).await["attempt"], 0);
    // A completed run cannot be cancelled.
    let resp = app
        .post(&format!("/v1/runs/{did}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_429_with_retry_after_is_retried_then_succeeds() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"content": "finally", "status": 429, "fail_times": 2, "retry_after": 0}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(env.llm.requests().len(), 3, "two failures, then the answer");
}

/// An error status whose body then stalls (a proxy under load) is judged by its status after
/// `worker.model_idle_timeout_ms`, and retried, instead of holding the call until its total
/// deadline (which is not retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_error_whose_body_stalls_is_retried_after_the_idle_timeout() {
    let env = TestEnv::with(&[
        ("worker.model_idle_timeout_ms", "1000"),
        ("worker.model_total_timeout_ms", "30000"),
    ])
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"content": "recovered", "status": 503, "fail_times": 1, "stall_error_body": true}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        env.llm.requests().len(),
        2,
        "the stalled error, then the answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_failing_fails_the_run_clearly() {
    let env = TestEnv::with(&[("worker.model_max_retries", "2")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"status": 503, "error_message": "overloaded"}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["error"]["code"], "model_http_error");
    assert_eq!(
        done["error"]["message"], "the model answered HTTP 503",
        "{done}"
    );
    assert!(
        !done.to_string().contains("overloaded"),
        "the provider's body stays in the logs: {done}"
    );
    assert_eq!(env.llm.requests().len(), 3, "one call and two retries");
    // A 400 is not retried.
    let body = scripted_run(json!([{"status": 400}]), json!([]));
    let run = app.start_run(&body).await;
    app.wait_status(run["id"].as_str().unwrap(), &["failed"], T)
        .await;
    assert_eq!(env.llm.requests().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_silent_streams_fail_and_never_hang() {
    let env = TestEnv::with(&[("worker.model_idle_timeout_ms", "500")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let truncated = app
        .start_run(&scripted_run(
            json!([{"content": "cut short here", "chunks": 6, "truncate": true}]),
            json!([]),
        ))
        .await;
    let silent = app
        .start_run(&scripted_run(
            json!([{"content": "then nothing", "chunks": 6, "hang_after_chunks": 2}]),
            json!([]),
        ))
        .await;
    let t = app
        .wait_status(
            truncated["id"].as_str().unwrap(),
            &["completed", "failed"],
            T,
        )
        .await;
    assert_eq!(t["status"], "failed");
    assert_eq!(t["error"]["code"], "model_stream_error", "{t}");
    let s = app
        .wait_status(silent["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(s["status"], "failed");
    assert_eq!(s["error"]["code"], "model_timeout", "{s}");
    let events = app.events(silent["id"].as_str().unwrap(), 0, T).await;
    assert_eq!(events.last().unwrap()["type"], "run_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_past_its_deadline_fails_alone() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut slow = http_tool(&env, "slow", "/slow");
    slow["timeout_ms"] = json!(200);
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "slow", "arguments": {"ms": 3000}}, {"name": "echo", "arguments": {"ok": true}}]},
               {"content": "done"}]),
        json!([slow, http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed");
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT name, status, error FROM tool_calls ORDER BY position")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(rows[0].1, "failed");
    assert!(
        rows[0]
            .2
            .as_deref()
            .unwrap()
            .contains("did not answer within 200 ms"),
        "{rows:?}"
    );
    assert_eq!(rows[1].1, "succeeded");
}

/// What the API's cancel starts with.
const CANCEL: &str = "SELECT status, attempt, thread_id, last_event_id FROM runs";

/// A cancel that arrives while the final turn is being committed. The run's row is locked (by
/// this test) so both wait on it, queued in the order given; released, one wins (Postgres
/// decides: the lease renewal queued among them reorders them at times). Whichever wins, the
/// run ends once and as the cancel answered: completed (409 `run_finished`) with its answer
/// recorded, or cancelled (200) with nothing of the answer recorded. Its stream carries exactly
/// one terminal event, last, with gap-free ids.
async fn cancel_during_the_final_commit(turn_first: bool) {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"content": "the answer", "delay_ms": 1000}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let thread = run["thread_id"].as_str().unwrap().to_string();
    app.watch(&id).wait_type("iteration_started", T).await;
    let locker = env.lock_run_row(&id).await;
    let cancel = app
        .http
        .post(app.url(&format!("/v1/runs/{id}/cancel")))
        .bearer_auth(&app.api_key)
        .json(&json!({}));
    let cancelled = if turn_first {
        env.wait_for_lock_waiter("the final turn's commit", TURN_WRITE_SQL, T)
            .await;
        let cancelled = tokio::spawn(cancel.send());
        env.wait_for_lock_waiter("the cancel", CANCEL, T).await;
        cancelled
    } else {
        let cancelled = tokio::spawn(cancel.send());
        env.wait_for_lock_waiter("the cancel", CANCEL, T).await;
        env.wait_for_lock_waiter("the final turn's commit", TURN_WRITE_SQL, T)
            .await;
        cancelled
    };
    locker.rollback().await.unwrap();
    let answer = cancelled.await.unwrap().expect("the cancel answers");
    let (status, terminal, recorded) = match answer.status().as_u16() {
        409 => ("completed", "run_completed", 1),
        200 => ("cancelled", "run_cancelled", 0),
        other => panic!("the cancel answered {other}"),
    };
    let done = app.wait_status(&id, &[status], T).await;
    assert_eq!(done["status"], status, "{done}");
    let events = app.events(&id, 0, T).await;
    assert_gap_free(&events);
    let kinds = types(&events);
    let ends: Vec<&String> = kinds
        .iter()
        .filter(|k| k.as_str() == "run_completed" || k.as_str() == "run_cancelled")
        .collect();
    assert_eq!(ends, [terminal], "{kinds:?}");
    assert_eq!(kinds.last().unwrap(), terminal, "{kinds:?}");
    let answers = app
        .messages(&thread)
        .await
        .iter()
        .filter(|m| m["role"] == "assistant")
        .count();
    assert_eq!(answers, recorded, "the answer is recorded only if it won");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_queued_behind_the_final_commit_ends_the_run_once() {
    cancel_during_the_final_commit(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_queued_ahead_of_the_final_commit_ends_the_run_once() {
    cancel_during_the_final_commit(false).await;
}

/// With one call in flight at a time (`agent.max_parallel_tool_calls`), the second call of a
/// response is not recorded as running while it waits for the first: it stays `pending`
/// (never dispatched, no start time) until the first has ended, then runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_a_parallel_slot_is_not_shown_running() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut body = scripted_run(
        json!([{"tool_calls": [{"name": "slow", "arguments": {"ms": 1500}},
                               {"name": "slow", "arguments": {"ms": 10}}]},
               {"content": "both done"}]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    body["agent"]["max_parallel_tool_calls"] = json!(1);
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    app.watch(&id).wait_type("tool_started", T).await;
    let calls = |id: String| {
        let pool = env.pool.clone();
        async move {
            let rows: Vec<(i32, String, i32, bool)> = sqlx::query_as(
                "SELECT position, status::text, dispatch_count, started_at IS NOT NULL
                 FROM tool_calls WHERE run_id = $1::uuid ORDER BY position",
            )
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
            rows
        }
    };
    let during = calls(id.clone()).await;
    assert_eq!(
        during,
        [
            (0, "running".to_owned(), 1, true),
            (1, "pending".to_owned(), 0, false)
        ],
        "the second call waits for the first's slot"
    );
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let after = calls(id.clone()).await;
    assert_eq!(
        after,
        [
            (0, "succeeded".to_owned(), 1, true),
            (1, "succeeded".to_owned(), 1, true)
        ]
    );
}
