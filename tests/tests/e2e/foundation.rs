//! The run path end to end: submit, claim, model, tools, events.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_one_http_tool_call_completes() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "echo", "arguments": {"word": "hello"}}]}, {"content": "all done"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    assert_eq!(run["status"], "queued");
    let run_id = run["id"].as_str().unwrap();
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["iteration"], 2);
    assert_eq!(done["attempt"], 1);
    assert!(done["usage"]["prompt_tokens"].as_i64().unwrap() > 0);

    // Messages: user, assistant with the call, tool result, final assistant.
    let msgs = app.messages(run["thread_id"].as_str().unwrap()).await;
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    let call = &msgs[1]["body"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "echo");
    let call_id = call["id"].as_str().unwrap();
    assert_eq!(msgs[2]["body"]["tool_call_id"], call_id);
    let tool_result: Value =
        serde_json::from_str(msgs[2]["body"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(tool_result["echo"], json!({"word": "hello"}));
    assert_eq!(msgs[3]["body"]["content"], "all done");

    // Tool-call row.
    let row: (String, String, i32, Value) = sqlx::query_as(
        "SELECT status, name, dispatch_count, arguments FROM tool_calls WHERE tool_call_id = $1",
    )
    .bind(call_id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        (row.0.as_str(), row.1.as_str(), row.2),
        ("succeeded", "echo", 1)
    );
    assert_eq!(row.3, json!({"word": "hello"}));

    // The tool server saw the idempotency key, once.
    let calls = env.tools.calls_to("/echo");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].idempotency_key.as_deref(),
        Some(format!("{run_id}:{call_id}").as_str())
    );
    assert_eq!(calls[0].body["arguments"], json!({"word": "hello"}));

    // The model's second request carried the whole history including the tool result.
    let reqs = env.llm.requests();
    assert_eq!(reqs.len(), 2);
    let last = reqs[1]["messages"].as_array().unwrap();
    assert_eq!(last[0]["role"], "system");
    assert!(
        last.iter()
            .any(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
    );
    assert!(
        reqs[1]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "echo")
    );
}

/// Every model request of a run of several tool turns carries the system prompt, then exactly
/// the thread's messages so far, in order: the holding keeps its history (and its JSON) in
/// memory between turns, and what it sends must be what Postgres holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_request_carries_the_thread_as_stored() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let call = |text: &str| json!({"tool_calls": [{"name": "echo", "arguments": {"text": text}}]});
    let body = scripted_run(
        json!([
            call("a \"quoted\" word"),
            call("two\nlines and a tab\t"),
            call("unicode \u{e9}\u{1F600} and a backslash \\"),
            {"content": "all done"}
        ]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap();
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");

    let stored: Vec<Value> = app
        .messages(run["thread_id"].as_str().unwrap())
        .await
        .into_iter()
        .map(|m| m["body"].clone())
        .collect();
    let roles: Vec<&str> = stored.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    let requests = env.llm.requests();
    assert_eq!(requests.len(), 4);
    for (k, request) in requests.iter().enumerate() {
        let sent = request["messages"].as_array().unwrap();
        assert_eq!(
            sent[0],
            json!({"role": "system", "content": body["agent"]["system_prompt"]}),
            "request {k}"
        );
        // Request k follows the user's message and k turns (an assistant message and its
        // tool result each).
        assert_eq!(&sent[1..], &stored[..1 + 2 * k], "request {k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_are_gap_free_and_replay_equals_live() {
    // Small deltas, so each message streams as several.
    let env = TestEnv::with(&[("events.delta_flush_bytes", "4")]).await;
    let app = env.spawn_api().await;
    let body = scripted_run(
        json!([
            {"content": "let me look that up for you", "chunks": 6, "tool_calls": [{"name": "echo", "arguments": {"n": 1}}]},
            {"content": "here is the answer you wanted", "chunks": 8, "chunk_delay_ms": 5}
        ]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    // The live client connects before any worker exists, so it sees everything live.
    let live = {
        let app_ref = &app;
        let rid = run_id.clone();
        async move { app_ref.events(&rid, 0, T).await }
    };
    let worker = env.spawn_worker();
    let (live, _worker) = tokio::join!(live, worker);
    assert_gap_free(&live);
    let kinds = types(&live);
    assert_eq!(kinds.first().map(String::as_str), Some("run_queued"));
    assert_eq!(kinds.last().map(String::as_str), Some("run_completed"));
    for expected in [
        "run_started",
        "iteration_started",
        "message_delta",
        "message_completed",
        "tool_started",
        "tool_completed",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "missing {expected} in {kinds:?}"
        );
    }
    for e in &live {
        assert_eq!(e["run_id"], run_id.as_str());
        assert_eq!(e["thread_id"], run["thread_id"]);
        assert!(e["at"].as_str().unwrap().ends_with('Z'));
    }
    // Deltas reassemble into the streamed text.
    let text: String = live
        .iter()
        .filter(|e| e["type"] == "message_delta")
        .map(|e| e["data"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        text,
        "let me look that up for youhere is the answer you wanted"
    );
    // Both messages' deltas get compacted in Redis once the messages complete, then the
    // finished list is packed (the events before the last deflated into its first element)...
    let deltas = kinds.iter().filter(|k| *k == "message_delta").count();
    assert!(deltas >= 6, "several deltas per message: {kinds:?}");
    let len = wait_for("the finished list to be packed", T, || async {
        let (packed, len) = env.list_is_packed(&run_id).await;
        packed.then_some(len)
    })
    .await;
    assert_eq!(len, live.len(), "packing keeps every position");
    let stored = env.raw_events(&run_id).await;
    let headers = stored
        .iter()
        .filter(|r| r.contains("\"type\":\"~delta\""))
        .count();
    assert_eq!(headers, 2, "compacted before it was packed: {stored:?}");
    assert_eq!(stored.len(), live.len());
    assert_eq!(
        stored.iter().filter(|r| r.is_empty()).count(),
        deltas - 2,
        "every delta but each range's first is emptied"
    );
    // ...yet a replay still equals, event for event, what the live client saw.
    let replay = app.events(&run_id, 0, T).await;
    assert_eq!(replay, live, "a replay must equal what the live client saw");
    // Resuming from any point, inside a compacted range too, gives exactly the rest.
    for after in 1..live.len() {
        let tail = app.events(&run_id, after as u64, T).await;
        assert_eq!(tail, live[after..].to_vec(), "resuming after {after}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_share_fifty_runs_and_each_completes_once() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut w1 = env.spawn_worker_process(&[]);
    let mut w2 = env.spawn_worker_process(&[]);
    let mut ids = Vec::new();
    for i in 0..50 {
        let body = scripted_run(
            json!([{"tool_calls": [{"name": "effect", "arguments": {"i": i}}]}, {"content": "ok"}]),
            json!([http_tool(&env, "effect", "/side-effect")]),
        );
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mut workers = HashSet::new();
    for id in &ids {
        let run = app
            .wait_status(id, &["completed", "failed"], Duration::from_secs(90))
            .await;
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["attempt"], 1, "no run was claimed twice: {run}");
        let events = app.events(id, 0, T).await;
        assert_gap_free(&events);
        let kinds = types(&events);
        assert_eq!(kinds.iter().filter(|k| *k == "run_started").count(), 1);
        assert_eq!(kinds.iter().filter(|k| *k == "run_completed").count(), 1);
        let started = events.iter().find(|e| e["type"] == "run_started").unwrap();
        workers.insert(started["data"]["worker"].as_str().unwrap().to_string());
    }
    assert_eq!(
        workers.len(),
        2,
        "both worker processes took runs: {workers:?}"
    );
    // Each side effect happened exactly once.
    let per_key = env.tools.calls_per_key("/side-effect");
    assert_eq!(per_key.len(), 50);
    assert!(per_key.values().all(|&n| n == 1), "{per_key:?}");
    w1.signal("TERM");
    w2.signal("TERM");
    assert_eq!(w1.wait_exit(T).await, Some(0), "worker drains and exits 0");
    assert_eq!(w2.wait_exit(T).await, Some(0));
}

/// A run's message stays unacknowledged while it holds a slot; a holding past
/// `worker.max_delivery_hold_ms` acks early, after which the broker pushes more deliveries
/// than there are free slots: they must go back to the queue and come again, each run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_held_past_the_delivery_hold_are_acked_early_and_the_backlog_still_drains() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let worker = env
        .spawn_worker_with(&[
            ("worker.concurrency", "2"),
            ("worker.max_delivery_hold_ms", "1000"),
        ])
        .await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let body = scripted_run(
            json!([{"tool_calls": [{"name": "effect", "arguments": {"i": i}}], "delay_ms": 1500},
                   {"content": "ok"}]),
            json!([http_tool(&env, "effect", "/side-effect")]),
        );
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for id in &ids {
        let run = app
            .wait_status(id, &["completed", "failed"], Duration::from_secs(60))
            .await;
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["attempt"], 1, "no run was claimed twice: {run}");
        let kinds = types(&app.events(id, 0, T).await);
        assert_eq!(kinds.iter().filter(|k| *k == "run_started").count(), 1);
    }
    let calls = env.tools.calls_to("/side-effect");
    assert_eq!(calls.len(), 6, "each side effect once: {calls:?}");
    let queue = format!("{}.runs", env.prefix);
    wait_for("the run queue to be empty", T, || async {
        (env.queue_depth(&queue).await == 0).then_some(())
    })
    .await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_run_message_delivered_twice_executes_nothing_twice() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "effect", "arguments": {}}]}, {"content": "ok"}]),
        json!([http_tool(&env, "effect", "/side-effect")]),
    );
    let run = app.start_run(&body).await;
    let run_id: uuid::Uuid = run["id"].as_str().unwrap().parse().unwrap();
    // A second copy of the message, as a broker redelivery or a double publish would make.
    let conn = agentfleet_shared::queue::connect(&amqp_url(), "test")
        .await
        .unwrap();
    let publisher = agentfleet_shared::queue::Publisher::new(
        &amqp_url(),
        "test",
        agentfleet_shared::queue::Topology::new(&env.prefix),
    )
    .await
    .unwrap();
    publisher.publish_run(run_id).await.unwrap();
    publisher.publish_run(run_id).await.unwrap();
    let _worker = env.spawn_worker().await;
    let done = app
        .wait_status(&run_id.to_string(), &["completed"], T)
        .await;
    assert_eq!(done["attempt"], 1);
    // All three messages were consumed (two of them as stale).
    wait_for("queue drained", T, || async {
        let ch = conn.create_channel().await.ok()?;
        let q = ch
            .queue_declare(
                format!("{}.runs", env.prefix).as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .ok()?;
        (q.message_count() == 0).then_some(())
    })
    .await;
    assert_eq!(env.tools.calls_to("/side-effect").len(), 1);
    assert_eq!(
        env.llm.requests().len(),
        2,
        "the model was called once per iteration, no more"
    );
    let events = app.events(&run_id.to_string(), 0, T).await;
    assert_eq!(
        types(&events)
            .iter()
            .filter(|k| *k == "run_started")
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_answering_500_gives_the_model_an_error_and_the_run_goes_on() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "broken", "arguments": {}}]}, {"content": "the tool failed, sorry"}]),
        json!([http_tool(&env, "broken", "/fail")]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let reqs = env.llm.requests();
    let tool_msg = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    let content = tool_msg["content"].as_str().unwrap();
    assert!(content.contains("HTTP 500"), "{content}");
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM tool_calls")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(status, "failed");
    assert!(error.unwrap().contains("500"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_that_do_not_match_the_schema_become_an_error_result() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let strict = json!({"name": "add", "kind": "http", "url": env.tools.url("/add"),
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"]}});
    let body = scripted_run(
        json!([
            {"tool_calls": [{"name": "add", "arguments": {"a": "one"}}, {"name": "nope", "arguments": {}}]},
            {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
            {"content": "3"}
        ]),
        json!([strict]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let tool_msgs: Vec<String> = env.llm.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tool_msgs.len(), 2);
    // Parallel calls record their results as they finish, in any order.
    assert!(
        tool_msgs.iter().any(|m| m.contains("do not match")),
        "{tool_msgs:?}"
    );
    assert!(
        tool_msgs.iter().any(|m| m.contains("unknown tool")),
        "{tool_msgs:?}"
    );
    // Only the valid call reached the tool server.
    let calls = env.tools.calls_to("/add");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body["arguments"], json!({"a": 1, "b": 2}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_ends_the_run_and_later_calls_are_skipped() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "echo", "arguments": {}}, {"name": "complete", "arguments": {"summary": "done"}},
                                {"name": "echo", "arguments": {"late": true}}]}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(env.tools.calls_to("/echo").len(), 1);
    let statuses: Vec<(String, String)> =
        sqlx::query_as("SELECT name, status FROM tool_calls ORDER BY position")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        statuses,
        [
            ("echo".into(), "succeeded".into()),
            ("complete".into(), "succeeded".into()),
            ("echo".into(), "skipped".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stops_at_max_iterations() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let turns: Vec<Value> = (0..5)
        .map(|_| json!({"tool_calls": [{"name": "echo", "arguments": {}}]}))
        .collect();
    let mut body = scripted_run(
        Value::Array(turns),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    body["agent"]["max_iterations"] = json!(2);
    let run = app.start_run(&body).await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["error"]["code"], "max_iterations_reached");
    assert_eq!(done["iteration"], 2);
    assert_eq!(env.llm.requests().len(), 2);
}

/// With `models.<name>.http2`, model calls go over HTTP/2 without negotiation (h2c) and share
/// connections: six runs on a worker of six slots, three streams a connection, open at most two
/// (over HTTP/1.1 each call in flight holds one of its own). Their streams are whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_calls_over_http2_share_a_few_connections() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env
        .spawn_worker_with(&[
            ("models.mock.http2", "true"),
            ("worker.concurrency", "6"),
            ("worker.model_streams_per_connection", "3"),
        ])
        .await;
    let body = scripted_run(
        json!([{"content": "streamed on a shared connection", "chunks": 6,
                "chunk_delay_ms": 40, "delay_ms": 200}]),
        json!([]),
    );
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    for id in &ids {
        let events = app.events(id, 0, T).await;
        assert_gap_free(&events);
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "message_delta")
            .map(|e| e["data"]["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "streamed on a shared connection");
        assert_eq!(
            types(&events).last().map(String::as_str),
            Some("run_completed")
        );
    }
    let recorded = env.llm.recorded();
    assert_eq!(recorded.len(), 6);
    assert!(recorded.iter().all(|r| r.http2), "every call over HTTP/2");
    let connections = env.llm.state().connections();
    assert!(
        (1..=2).contains(&connections),
        "ceil(6 / 3) clients, one connection each: {connections}"
    );
}
