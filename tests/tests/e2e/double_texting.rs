//! Double-texting: `if_busy` on `POST /v1/runs` to a thread with an active run.
//!
//! The first run is held busy deterministically: paused by an `ask` (still active), or in a
//! slow tool call observed at the tool server. The mock model plays turn `k` of the thread's
//! first user message's script when the request holds `k` assistant messages, so one script
//! covers every run of the thread.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

fn on_thread(thread: &str, input: &str, if_busy: Option<&str>) -> Value {
    let mut body = json!({"input": input, "thread_id": thread, "agent": agent(json!([]))});
    if let Some(mode) = if_busy {
        body["if_busy"] = json!(mode);
    }
    body
}

fn ask_turn() -> Value {
    json!({"tool_calls": [{"name": "ask", "arguments": {"text": "Your name?"}}]})
}

/// Every assistant `tool_calls` id has a tool message after it (and before the next
/// assistant or user message): what an OpenAI-compatible provider demands.
fn assert_valid_history(messages: &[Value]) {
    let mut open: Vec<String> = Vec::new();
    for m in messages {
        match m["role"].as_str().unwrap() {
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap();
                let at = open.iter().position(|o| o == id);
                assert!(
                    at.is_some(),
                    "tool result {id} answers no open call: {messages:#?}"
                );
                open.remove(at.unwrap());
            }
            role => {
                assert!(
                    open.is_empty(),
                    "{role} message before results of {open:?}: {messages:#?}"
                );
                if let Some(calls) = m["tool_calls"].as_array() {
                    open.extend(calls.iter().map(|c| c["id"].as_str().unwrap().to_owned()));
                }
            }
        }
    }
}

/// The model request whose last message is the user message `text`.
fn request_ending_with(env: &TestEnv, text: &str) -> Vec<Value> {
    env.llm
        .requests()
        .into_iter()
        .map(|r| r["messages"].as_array().unwrap().clone())
        .find(|m| {
            m.last()
                .is_some_and(|l| l["role"] == "user" && l["content"] == text)
        })
        .unwrap_or_else(|| panic!("no model request ends with {text:?}"))
}

fn contents(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            format!(
                "{}:{}",
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueued_runs_start_in_order_when_the_active_one_ends() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([ask_turn(), {"content": "answer1"}, {"content": "answer2"}, {"content": "answer3"}]),
            json!([]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    app.wait_status(&first_id, &["waiting_for_input"], T).await;

    // Paused for input is still active: both wait, in order.
    let second = app
        .start_run(&on_thread(&thread, "second", Some("enqueue")))
        .await;
    assert_eq!(second["status"], "waiting_for_thread", "{second}");
    let third = app
        .start_run(&on_thread(&thread, "third", Some("enqueue")))
        .await;
    assert_eq!(third["status"], "waiting_for_thread", "{third}");
    let (second_id, third_id) = (
        second["id"].as_str().unwrap(),
        third["id"].as_str().unwrap(),
    );
    // Their messages are not in the thread yet.
    let before: Vec<Value> = app.messages(&thread).await;
    assert!(
        before.iter().all(|m| m["body"]["content"] != "second"),
        "{before:#?}"
    );

    let resp = app
        .post(
            &format!("/v1/runs/{first_id}/resume"),
            &json!({"input": "Ada"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    for id in [first_id.as_str(), second_id, third_id] {
        let done = app
            .wait_status(id, &["completed", "failed", "cancelled"], T)
            .await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    let runs: Vec<Value> = futures_util::future::join_all(
        [first_id.as_str(), second_id, third_id].map(|id| app.run(id)),
    )
    .await;
    // Strictly one after the other.
    for pair in runs.windows(2) {
        assert!(
            pair[0]["finished_at"].as_str().unwrap() <= pair[1]["started_at"].as_str().unwrap(),
            "{pair:#?}"
        );
    }

    // The thread: each user message right before its run's answer.
    let messages: Vec<Value> = app
        .messages(&thread)
        .await
        .into_iter()
        .map(|m| m["body"].clone())
        .collect();
    let seq = contents(&messages);
    let at = |s: &str| {
        seq.iter()
            .position(|m| m == s)
            .unwrap_or_else(|| panic!("{s} in {seq:?}"))
    };
    assert!(at("assistant:answer1") < at("user:second"), "{seq:?}");
    assert_eq!(at("user:second") + 1, at("assistant:answer2"), "{seq:?}");
    assert_eq!(at("user:third") + 1, at("assistant:answer3"), "{seq:?}");
    assert_valid_history(&messages);

    // Later runs' model requests hold the earlier exchanges.
    let third_req = request_ending_with(&env, "third");
    let seq = contents(&third_req);
    assert!(seq.contains(&"assistant:answer1".to_owned()), "{seq:?}");
    assert!(seq.contains(&"assistant:answer2".to_owned()), "{seq:?}");
    assert!(seq.contains(&"user:second".to_owned()), "{seq:?}");
    assert_valid_history(&third_req);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_during_a_tool_call_ends_it_after_the_result_then_starts_the_new_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([
                {"tool_calls": [{"name": "slow", "arguments": {"ms": 4000}}]},
                {"content": "answer2"}
            ]),
            json!([http_tool(&env, "slow", "/slow")]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    wait_for("the slow call to reach the tool", T, || async {
        (!env.tools.calls_to("/slow").is_empty()).then_some(())
    })
    .await;

    let second = app
        .start_run(&on_thread(&thread, "second", Some("interrupt")))
        .await;
    assert_eq!(second["status"], "waiting_for_thread", "{second}");
    let second_id = second["id"].as_str().unwrap();
    let ended = app
        .wait_status(&first_id, &["completed", "failed", "cancelled"], T)
        .await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(ended["error"]["code"], "interrupted", "{ended}");
    let done = app
        .wait_status(second_id, &["completed", "failed", "cancelled"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    // The call ran once, and its result was kept (no half-run, no repeat).
    assert_eq!(env.tools.calls_to("/slow").len(), 1);
    // Only two model calls: the interrupted run made no further one.
    assert_eq!(env.llm.request_count(), 2);
    let events = app.events(&first_id, 0, T).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_cancelled", "{events:#?}");
    assert_eq!(last["data"]["code"], "interrupted");

    let req = request_ending_with(&env, "second");
    let roles: Vec<&str> = req.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "user"],
        "{req:#?}"
    );
    assert!(
        req[3]["content"].as_str().unwrap().contains("slept_ms"),
        "{req:#?}"
    );
    assert_valid_history(&req);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_of_a_paused_run_cancels_it_at_once_with_its_question_answered() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([ask_turn(), {"content": "answer2"}]),
            json!([]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    app.wait_status(&first_id, &["waiting_for_input"], T).await;

    let second = app
        .start_run(&on_thread(&thread, "second", Some("interrupt")))
        .await;
    // Nothing to wait for: the paused run ended in the same transaction.
    assert_eq!(second["status"], "queued", "{second}");
    let ended = app.run(&first_id).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(ended["error"]["code"], "interrupted", "{ended}");
    let done = app
        .wait_status(
            second["id"].as_str().unwrap(),
            &["completed", "failed", "cancelled"],
            T,
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(&first_id, 0, T).await;
    let live = events.last().unwrap().clone();
    assert_eq!(live["type"], "run_cancelled");
    assert_eq!(
        live["data"],
        json!({"previous_status": "waiting_for_input", "code": "interrupted",
               "message": "interrupted by a newer message"}),
        "{live}"
    );
    // Redis loses the stream: the end restored from Postgres says what the live one said.
    env.flush_redis_keys().await;
    let rebuilt = app.events(&first_id, 0, T).await;
    let restored = rebuilt.last().unwrap();
    assert_eq!(restored["type"], "run_cancelled", "{rebuilt:#?}");
    assert_eq!(restored["id"], live["id"], "{rebuilt:#?}");
    assert_eq!(restored["data"], live["data"], "{rebuilt:#?}");

    let req = request_ending_with(&env, "second");
    let roles: Vec<&str> = req.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "user"],
        "{req:#?}"
    );
    assert!(
        req[3]["content"]
            .as_str()
            .unwrap()
            .contains("interrupted by a newer message"),
        "{req:#?}"
    );
    assert_valid_history(&req);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_is_the_default_bad_values_are_refused_and_cancelling_a_waiting_run_moves_the_next_up()
 {
    let env = TestEnv::with(&[("api.max_queued_per_thread", "2")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([ask_turn(), {"content": "answer1"}, {"content": "answer3"}]),
            json!([]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    app.wait_status(&first_id, &["waiting_for_input"], T).await;

    for mode in [None, Some("reject")] {
        let resp = app.post("/v1/runs", &on_thread(&thread, "x", mode)).await;
        assert_eq!(resp.status(), 409);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "thread_busy", "{body}");
    }
    let resp = app
        .post("/v1/runs", &on_thread(&thread, "x", Some("later")))
        .await;
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert!(body.to_string().contains("if_busy"), "{body}");
    let mut batch_item = on_thread(&thread, "x", Some("enqueue"));
    batch_item.as_object_mut().unwrap().remove("thread_id");
    let resp = app
        .post("/v1/runs/batch", &json!({"runs": [batch_item]}))
        .await;
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert!(body.to_string().contains("runs[0].if_busy"), "{body}");

    // Idempotency-Key: the same request answers the same waiting run.
    let keyed = |body: &Value| {
        let req = reqwest::Client::new()
            .post(app.url("/v1/runs"))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "dt-1")
            .json(body);
        async move { req.send().await.unwrap() }
    };
    let second_body = on_thread(&thread, "second", Some("enqueue"));
    let second: Value = keyed(&second_body).await.json().await.unwrap();
    assert_eq!(second["status"], "waiting_for_thread", "{second}");
    let again: Value = keyed(&second_body).await.json().await.unwrap();
    assert_eq!(again["id"], second["id"]);
    let third = app
        .start_run(&on_thread(&thread, "third", Some("enqueue")))
        .await;
    // The limit of waiting runs.
    let resp = app
        .post("/v1/runs", &on_thread(&thread, "fourth", Some("enqueue")))
        .await;
    assert_eq!(resp.status(), 429);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "thread_queue_full", "{body}");

    let second_id = second["id"].as_str().unwrap();
    let resp = app
        .post(&format!("/v1/runs/{second_id}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.run(second_id).await["status"], "cancelled");
    let resp = app
        .post(
            &format!("/v1/runs/{first_id}/resume"),
            &json!({"input": "Ada"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app
        .wait_status(
            third["id"].as_str().unwrap(),
            &["completed", "failed", "cancelled"],
            T,
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let messages: Vec<Value> = app
        .messages(&thread)
        .await
        .into_iter()
        .map(|m| m["body"].clone())
        .collect();
    let seq = contents(&messages);
    assert!(
        !seq.contains(&"user:second".to_owned()),
        "a cancelled waiting run adds nothing: {seq:?}"
    );
    assert!(
        seq.ends_with(&["user:third".to_owned(), "assistant:answer3".to_owned()]),
        "{seq:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_active_run_starts_the_waiting_one() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([ask_turn(), {"content": "answer2"}]),
            json!([]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    app.wait_status(&first_id, &["waiting_for_input"], T).await;
    let second = app
        .start_run(&on_thread(&thread, "second", Some("enqueue")))
        .await;
    let resp = app
        .post(&format!("/v1/runs/{first_id}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let done = app
        .wait_status(
            second["id"].as_str().unwrap(),
            &["completed", "failed", "cancelled"],
            T,
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let req = request_ending_with(&env, "second");
    assert_valid_history(&req);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_end_and_the_publish_of_the_promoted_run_is_healed_by_the_sweeper() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let crashing = env.spawn_worker_process_with_failpoints(&[], "promoted:before_publish");
    let first = app
        .start_run(&scripted_run(
            json!([
                {"tool_calls": [{"name": "slow", "arguments": {"ms": 1500}}]},
                {"content": "answer1"},
                {"content": "answer2"}
            ]),
            json!([http_tool(&env, "slow", "/slow")]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    wait_for("the slow call to reach the tool", T, || async {
        (!env.tools.calls_to("/slow").is_empty()).then_some(())
    })
    .await;
    let second = app
        .start_run(&on_thread(&thread, "second", Some("enqueue")))
        .await;
    assert_eq!(second["status"], "waiting_for_thread", "{second}");
    let second_id = second["id"].as_str().unwrap();
    // The worker ends the first run (promoting the second in the same transaction), then dies.
    let ended = app
        .wait_status(&first_id, &["completed", "failed", "cancelled"], T)
        .await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let crashing = std::sync::Mutex::new(crashing);
    wait_for("the worker to crash at the failpoint", T, || {
        let exited = crashing.lock().unwrap().has_exited();
        async move { exited.then_some(()) }
    })
    .await;
    assert_eq!(app.run(second_id).await["status"], "queued");
    let _healthy = env.spawn_worker().await;
    let done = app
        .wait_status(second_id, &["completed", "failed", "cancelled"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
}

/// The interrupt arrives while a call runs, and the same response then asks a question: the
/// run ends at the pause instead of waiting for a human, the question answered as interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_before_a_pause_ends_the_run_instead_of_pausing_it() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([
                {"tool_calls": [
                    {"name": "slow", "arguments": {"ms": 3000}},
                    {"name": "ask", "arguments": {"text": "Your name?"}}
                ]},
                {"content": "answer2"}
            ]),
            json!([http_tool(&env, "slow", "/slow")]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    wait_for("the slow call to reach the tool", T, || async {
        (!env.tools.calls_to("/slow").is_empty()).then_some(())
    })
    .await;
    let second = app
        .start_run(&on_thread(&thread, "second", Some("interrupt")))
        .await;
    assert_eq!(second["status"], "waiting_for_thread", "{second}");
    let ended = app
        .wait_status(&first_id, &["completed", "failed", "cancelled"], T)
        .await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(ended["error"]["code"], "interrupted", "{ended}");
    assert!(ended["pending"].is_null(), "{ended}");
    let done = app
        .wait_status(
            second["id"].as_str().unwrap(),
            &["completed", "failed", "cancelled"],
            T,
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let req = request_ending_with(&env, "second");
    let roles: Vec<&str> = req.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "user"],
        "{req:#?}"
    );
    assert!(
        req[4]["content"]
            .as_str()
            .unwrap()
            .contains("interrupted by a newer message"),
        "{req:#?}"
    );
    assert_valid_history(&req);
}

/// Five enqueues at once on a paused thread: each is accepted, and once the first run ends
/// they run one at a time, each user message right before its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_run_one_at_a_time() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut script = vec![ask_turn(), json!({"content": "answer0"})];
    script.extend((1..=5).map(|i| json!({"content": format!("answer{i}")})));
    let first = app
        .start_run(&scripted_run(Value::Array(script), json!([])))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    app.wait_status(&first_id, &["waiting_for_input"], T).await;
    let bodies: Vec<Value> = (1..=5)
        .map(|i| on_thread(&thread, &format!("msg{i}"), Some("enqueue")))
        .collect();
    let created: Vec<Value> =
        futures_util::future::join_all(bodies.iter().map(|b| app.start_run(b))).await;
    assert!(
        created.iter().all(|r| r["status"] == "waiting_for_thread"),
        "{created:#?}"
    );
    let resp = app
        .post(
            &format!("/v1/runs/{first_id}/resume"),
            &json!({"input": "Ada"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let mut runs = Vec::new();
    for r in &created {
        let done = app
            .wait_status(
                r["id"].as_str().unwrap(),
                &["completed", "failed", "cancelled"],
                T,
            )
            .await;
        assert_eq!(done["status"], "completed", "{done}");
        runs.push(done);
    }
    runs.sort_by(|a, b| {
        a["started_at"]
            .as_str()
            .unwrap()
            .cmp(b["started_at"].as_str().unwrap())
    });
    for pair in runs.windows(2) {
        assert!(
            pair[0]["finished_at"].as_str().unwrap() <= pair[1]["started_at"].as_str().unwrap(),
            "overlapping runs: {pair:#?}"
        );
    }
    let messages: Vec<Value> = app
        .messages(&thread)
        .await
        .into_iter()
        .map(|m| m["body"].clone())
        .collect();
    assert_valid_history(&messages);
    let seq = contents(&messages);
    // Every user message is followed by an answer, never by another user message.
    let users: Vec<usize> = (0..seq.len())
        .filter(|&i| seq[i].starts_with("user:msg"))
        .collect();
    assert_eq!(users.len(), 5, "{seq:?}");
    for i in users {
        assert!(seq[i + 1].starts_with("assistant:answer"), "{seq:?}");
    }
}

/// A tenant with a running limit: a promoted run is held and dispatched in turn, and an
/// interrupt of a paused run frees its slot for the new run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_running_limit_promoted_runs_are_dispatched() {
    let env = TestEnv::with(&[
        ("limits.max_running_runs", "1"),
        ("worker.requeue_after_ms", "60000"),
    ])
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let first = app
        .start_run(&scripted_run(
            json!([
                {"tool_calls": [{"name": "slow", "arguments": {"ms": 1500}}]},
                {"content": "answer1"},
                ask_turn(),
                {"content": "answer3"}
            ]),
            json!([http_tool(&env, "slow", "/slow")]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let thread = first["thread_id"].as_str().unwrap().to_owned();
    wait_for("the slow call to reach the tool", T, || async {
        (!env.tools.calls_to("/slow").is_empty()).then_some(())
    })
    .await;
    let second = app
        .start_run(&on_thread(&thread, "second", Some("enqueue")))
        .await;
    let second_id = second["id"].as_str().unwrap();
    // The second run asks (script turn 2) and pauses: the interrupt cancels it at once.
    app.wait_status(second_id, &["waiting_for_input"], T).await;
    let done = app.run(&first_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let third = app
        .start_run(&on_thread(&thread, "third", Some("interrupt")))
        .await;
    let ended = app.run(second_id).await;
    assert_eq!(ended["error"]["code"], "interrupted", "{ended}");
    let done = app
        .wait_status(
            third["id"].as_str().unwrap(),
            &["completed", "failed", "cancelled"],
            T,
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
}
