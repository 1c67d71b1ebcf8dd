//! Pausing for a human and resuming on any worker.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

fn risky_tool(env: &TestEnv, name: &str, path: &str) -> Value {
    let mut t = http_tool(env, name, path);
    t["risk"] = json!("high");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_on_worker_a_answer_handled_by_worker_b_after_a_is_killed() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut worker_a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "What is your name?"}}]}, {"content": "Hello, Ada"}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let first_part = app.events(&run_id, 0, T).await; // ends after input_required
    assert_eq!(first_part.last().unwrap()["type"], "input_required");
    assert_eq!(
        first_part.last().unwrap()["data"]["question"],
        "What is your name?"
    );
    let waiting = app.wait_status(&run_id, &["waiting_for_input"], T).await;
    assert_eq!(waiting["pending"]["kind"], "input");
    assert_eq!(waiting["pending"]["question"], "What is your name?");
    // The paused run's list now expires (24 h by default).
    let ttl = redis_ttl(&format!("{}:run:{{{run_id}}}:events", env.prefix)).await;
    assert!(ttl > 86_000 && ttl <= 86_400, "ttl {ttl}");

    worker_a.kill();
    let _worker_b = env.spawn_worker_process(&[]);
    let resp = app
        .post(
            &format!("/v1/runs/{run_id}/resume"),
            &json!({"input": "Ada"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["pending"].is_null());
    let ttl = redis_ttl(&format!("{}:run:{{{run_id}}}:events", env.prefix)).await;
    assert!(
        ttl > 86_000,
        "a finished run's list expires after the retention: ttl {ttl}"
    );

    // The reconnecting client gets the rest with no gap and no duplicate.
    let last_seen = first_part.last().unwrap()["id"].as_u64().unwrap();
    let rest = app.events(&run_id, last_seen, T).await;
    let mut all = first_part.clone();
    all.extend(rest.clone());
    assert_gap_free(&all);
    assert_eq!(all, app.events(&run_id, 0, T).await);
    assert_eq!(rest[0]["type"], "run_resumed");
    let workers: Vec<&str> = all
        .iter()
        .filter(|e| e["type"] == "run_started")
        .map(|e| e["data"]["worker"].as_str().unwrap())
        .collect();
    assert_eq!(workers.len(), 2);
    assert_ne!(workers[0], workers[1], "worker B continued the run");

    // The model's last request holds the whole history, question and answer included.
    let reqs = env.llm.requests();
    let last = reqs.last().unwrap()["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = last.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(last[2]["tool_calls"][0]["function"]["name"], "ask");
    assert_eq!(last[4]["content"], "Ada");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmation_runs_only_the_approved_call_once_with_the_stored_arguments() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut worker_a = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([
            {"tool_calls": [
                {"name": "transfer", "arguments": {"amount": 10, "to": "alice"}},
                {"name": "transfer", "arguments": {"amount": 99999, "to": "mallory"}},
                {"name": "lookup", "arguments": {"q": "rates"}}
            ]},
            {"content": "transferred 10 to alice"}
        ]),
        json!([
            risky_tool(&env, "transfer", "/side-effect"),
            http_tool(&env, "lookup", "/echo")
        ]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let waiting = app
        .wait_status(&run_id, &["waiting_for_confirmation"], T)
        .await;
    let pending = waiting["pending"]["tool_calls"].as_array().unwrap().clone();
    assert_eq!(
        pending.len(),
        2,
        "only the risky calls need a decision: {pending:?}"
    );
    assert_eq!(
        pending[0]["arguments"],
        json!({"amount": 10, "to": "alice"})
    );
    assert_eq!(pending[0]["risk"], "high");
    let events = app.events(&run_id, 0, T).await;
    let confirm = events.last().unwrap();
    assert_eq!(confirm["type"], "confirmation_required");
    assert_eq!(confirm["data"]["tool_calls"].as_array().unwrap().len(), 2);
    // Nothing ran before the decision, not even the low-risk call.
    assert!(env.tools.calls().is_empty());

    worker_a.kill();
    let _worker_b = env.spawn_worker_process(&[]);
    let approve = pending[0]["tool_call_id"].as_str().unwrap();
    let reject = pending[1]["tool_call_id"].as_str().unwrap();
    let decisions = json!({"decisions": [
        {"tool_call_id": approve, "approve": true},
        {"tool_call_id": reject, "approve": false, "reason": "not a known payee"}
    ]});
    resume_to_completion(&app, &run_id, &decisions).await;

    let effects = env.tools.calls_to("/side-effect");
    assert_eq!(effects.len(), 1, "only the approved call ran, once");
    assert_eq!(
        effects[0].body["arguments"],
        json!({"amount": 10, "to": "alice"})
    );
    assert_eq!(
        effects[0].idempotency_key.as_deref(),
        Some(format!("{run_id}:{approve}").as_str())
    );
    assert_eq!(
        env.tools.calls_to("/echo").len(),
        1,
        "the low-risk call ran after the decision"
    );

    let tool_msgs = tool_results_sent_last(&env);
    let rejected = tool_msgs
        .iter()
        .find(|m| m["tool_call_id"] == reject)
        .unwrap();
    let text = rejected["content"].as_str().unwrap();
    assert!(
        text.contains("rejected") && text.contains("not a known payee"),
        "{text}"
    );
    // The model reads the approved call's real result, as recorded (the history of a resumed
    // holding is read once its results are committed).
    let recorded = recorded_result(&env, approve).await;
    let sent: Vec<&Value> = tool_msgs
        .iter()
        .filter(|m| m["tool_call_id"] == approve)
        .collect();
    assert_eq!(sent.len(), 1, "{tool_msgs:?}");
    assert_eq!(sent[0]["content"].as_str(), Some(recorded.as_str()));
    assert!(!recorded.contains("never ran"), "{recorded}");
    let decided: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT tool_call_id, status, decided_by IS NOT NULL AND decided_at IS NOT NULL
         FROM tool_calls WHERE risk = 'high' ORDER BY position",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        decided[0],
        (approve.to_string(), "succeeded".to_string(), true)
    );
    assert_eq!(
        decided[1],
        (reject.to_string(), "rejected".to_string(), true)
    );
}

/// A holding that continues a run (here after a confirmation) reads the thread's history only
/// once the results it settled are committed, though it calls the model without waiting for
/// them: the model gets the approved call's real result, also when that commit is slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_reads_its_history_after_the_results_it_settled() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process_with_failpoints(&[], "delay:store:outcome@300");
    let body = scripted_run(
        json!([
            {"tool_calls": [{"name": "transfer", "arguments": {"amount": 10, "to": "alice"}}]},
            {"content": "transferred"}
        ]),
        json!([risky_tool(&env, "transfer", "/side-effect")]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let waiting = app
        .wait_status(&run_id, &["waiting_for_confirmation"], T)
        .await;
    let call = waiting["pending"]["tool_calls"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let decisions = json!({"decisions": [{"tool_call_id": call, "approve": true}]});
    resume_to_completion(&app, &run_id, &decisions).await;
    assert_eq!(env.tools.calls_to("/side-effect").len(), 1);
    let recorded = recorded_result(&env, &call).await;
    assert!(!recorded.contains("never ran"), "{recorded}");
    let sent = tool_results_sent_last(&env);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0]["content"].as_str(),
        Some(recorded.as_str()),
        "{sent:?}"
    );
}

/// Resumes a paused run with `body` (accepted) and waits for it to complete.
async fn resume_to_completion(app: &TestApp, run_id: &str, body: &Value) {
    let resp = app.post(&format!("/v1/runs/{run_id}/resume"), body).await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
}

/// The tool results in the last request the model got.
fn tool_results_sent_last(env: &TestEnv) -> Vec<Value> {
    let reqs = env.llm.requests();
    reqs.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

/// The result recorded for a tool call, as the model reads it.
async fn recorded_result(env: &TestEnv, tool_call_id: &str) -> String {
    let (recorded,): (String,) = sqlx::query_as(
        "SELECT body->>'content' FROM messages WHERE role = 'tool' AND body->>'tool_call_id' = $1",
    )
    .bind(tool_call_id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    recorded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_pauses_twice_completes() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([
            {"tool_calls": [{"name": "ask", "arguments": {"text": "How much?"}}]},
            {"tool_calls": [{"name": "pay", "arguments": {"amount": 5}}]},
            {"tool_calls": [{"name": "complete", "arguments": {"summary": "paid"}}]}
        ]),
        json!([risky_tool(&env, "pay", "/side-effect")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    app.wait_status(&id, &["waiting_for_input"], T).await;
    assert_eq!(
        app.post(&format!("/v1/runs/{id}/resume"), &json!({"input": "5"}))
            .await
            .status(),
        202
    );
    let waiting = app.wait_status(&id, &["waiting_for_confirmation"], T).await;
    let call = waiting["pending"]["tool_calls"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let decisions = json!({"decisions": [{"tool_call_id": call, "approve": true}]});
    assert_eq!(
        app.post(&format!("/v1/runs/{id}/resume"), &decisions)
            .await
            .status(),
        202
    );
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(env.tools.calls_to("/side-effect").len(), 1);
    let events = app.events(&id, 0, T).await;
    assert_gap_free(&events);
    let kinds = types(&events);
    let resumed = kinds.iter().filter(|k| *k == "run_resumed").count();
    assert_eq!(resumed, 2, "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_resumes_answer_409_and_422() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // A queued run (no worker yet): 409 with its status.
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "pay", "arguments": {"a": 1}}, {"name": "pay", "arguments": {"a": 2}}]}, {"content": "ok"}]),
        json!([risky_tool(&env, "pay", "/side-effect")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let resp = app
        .post(&format!("/v1/runs/{id}/resume"), &json!({"input": "x"}))
        .await;
    assert_eq!(resp.status(), 409);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"].as_str().unwrap().contains("queued"),
        "{err}"
    );

    let _worker = env.spawn_worker().await;
    let waiting = app.wait_status(&id, &["waiting_for_confirmation"], T).await;
    let ids: Vec<String> = waiting["pending"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool_call_id"].as_str().unwrap().to_string())
        .collect();
    let path = format!("/v1/runs/{id}/resume");
    // Not every pending call decided: 422 naming the missing one.
    let resp = app
        .post(
            &path,
            &json!({"decisions": [{"tool_call_id": ids[0], "approve": true}]}),
        )
        .await;
    assert_eq!(resp.status(), 422);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "missing_decisions");
    assert!(err["error"]["message"].as_str().unwrap().contains(&ids[1]));
    // An unknown tool call id: 422.
    let resp = app
        .post(
            &path,
            &json!({"decisions": [
            {"tool_call_id": ids[0], "approve": true}, {"tool_call_id": ids[1], "approve": true},
            {"tool_call_id": "call_nope", "approve": true}]}),
        )
        .await;
    assert_eq!(resp.status(), 422);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "unknown_tool_call");
    // An answer where decisions are expected: 422.
    assert_eq!(
        app.post(&path, &json!({"input": "yes"})).await.status(),
        422
    );
    // Neither or both: 422.
    assert_eq!(app.post(&path, &json!({})).await.status(), 422);
    // The failed attempts changed nothing.
    assert_eq!(app.run(&id).await["status"], "waiting_for_confirmation");

    // Two concurrent resumes: exactly one 202 and one 409.
    let decisions = json!({"decisions": [{"tool_call_id": ids[0], "approve": true}, {"tool_call_id": ids[1], "approve": false}]});
    let (a, b) = tokio::join!(app.post(&path, &decisions), app.post(&path, &decisions));
    let mut codes = [a.status().as_u16(), b.status().as_u16()];
    codes.sort();
    assert_eq!(codes, [202, 409]);
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(env.tools.calls_to("/side-effect").len(), 1);
    // A finished run cannot be resumed.
    let resp = app.post(&path, &json!({"input": "again"})).await;
    assert_eq!(resp.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_active_run_per_thread() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "?"}}]}, {"content": "ok"}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let thread = run["thread_id"].as_str().unwrap();
    app.wait_status(id, &["waiting_for_input"], T).await;
    let resp = app
        .post(
            "/v1/runs",
            &json!({"input": "another", "thread_id": thread, "agent": {"model": "mock"}}),
        )
        .await;
    assert_eq!(resp.status(), 409);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "thread_busy");
    assert!(
        err["error"]["message"].as_str().unwrap().contains(id),
        "{err}"
    );
    assert_eq!(
        app.post(&format!("/v1/runs/{id}/resume"), &json!({"input": "fine"}))
            .await
            .status(),
        202
    );
    app.wait_status(id, &["completed"], T).await;
    // Once it is done, the thread takes a new run, which sees the whole history.
    let next = app
        .start_run(&json!({"input": "and now?", "thread_id": thread, "agent": {"model": "mock"}}))
        .await;
    let done = app
        .wait_status(next["id"].as_str().unwrap(), &["completed"], T)
        .await;
    assert_eq!(done["thread_id"], thread);
    let reqs = env.llm.requests();
    let last = reqs.last().unwrap()["messages"].as_array().unwrap();
    assert!(last.iter().any(|m| m["content"] == "fine"));
    assert_eq!(last.last().unwrap()["content"], "and now?");
}

async fn redis_ttl(key: &str) -> i64 {
    let mut conn = redis_connection();
    redis::cmd("TTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// A pause's commit ends the run's lease: a lease renewal that comes after it (the holder held
/// back past one by a failpoint) does not stop the holding before it appended the pausing
/// event. The stream ends with `input_required`, and the answer completes the run gap-free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_after_the_pause_commit_does_not_cut_its_event() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // Renewals every 500 ms (the test settings): a 1.5 s hold spans at least two.
    let _worker = env.spawn_worker_process_with_failpoints(&[], "delay:pause:after_commit@1500");
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "Which account?"}}]},
               {"content": "done"}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let first_part = app.events(&run_id, 0, T).await; // ends after input_required
    assert_eq!(
        first_part.last().unwrap()["type"],
        "input_required",
        "{first_part:#?}"
    );
    let resp = app
        .post(
            &format!("/v1/runs/{run_id}/resume"),
            &json!({"input": "savings"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(&run_id, 0, T).await;
    assert_gap_free(&events);
    assert!(
        events.iter().all(|e| e["type"] != "stream_rebuilt"),
        "{events:#?}"
    );
}
