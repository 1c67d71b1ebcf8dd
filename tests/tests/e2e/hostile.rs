//! Hostile tools and models: a tenant's tool URL cannot reach inside the deployment, and a tool
//! or a model that sends without end costs a worker a bounded amount of memory.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_shared::egress::DENIED_MESSAGE;
use agentfleet_tests::harness::*;
use agentfleet_tests::tool_server::ToolServer;

const T: Duration = Duration::from_secs(60);

fn tool(name: &str, url: &str) -> Value {
    json!({"name": name, "description": name, "kind": "http", "url": url,
           "parameters": {"type": "object"}})
}

/// The `tool_completed` event of each named call, by tool name.
fn completions(events: &[Value]) -> Vec<(String, Value)> {
    events
        .iter()
        .filter(|e| e["type"] == "tool_completed")
        .map(|e| {
            (
                e["data"]["name"].as_str().unwrap().to_owned(),
                e["data"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_urls_reaching_loopback_by_name_or_by_redirect_are_refused() {
    // Installs this process's metrics recorder before anything counts.
    let metrics = agentfleet_shared::telemetry::metrics_handle();
    let env = TestEnv::with(&[("egress.max_redirects", "3")]).await;
    // An internal service on the worker's loopback that no tenant may reach.
    let internal = ToolServer::start().await.unwrap();
    let port = internal.addr().port();
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [
                  {"name": "by_name", "arguments": {}},
                  {"name": "by_redirect", "arguments": {"to": format!("http://127.0.0.1:{port}/echo")}},
                  {"name": "by_mapped_redirect", "arguments": {"to": format!("http://[::ffff:127.0.0.1]:{port}/echo")}},
                  {"name": "allowed", "arguments": {"word": "hi"}}]},
               {"content": "done"}]),
        json!([
            tool("by_name", &format!("http://localhost:{port}/echo")),
            tool("by_redirect", &env.tools.url("/redirect")),
            tool("by_mapped_redirect", &env.tools.url("/redirect")),
            tool("allowed", &env.tools.url("/echo")),
        ]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(id, 0, T).await;
    for (name, data) in completions(&events) {
        if name == "allowed" {
            assert_eq!(data["ok"], true, "{data}");
            assert_eq!(data["result"]["echo"]["word"], "hi");
        } else {
            assert_eq!(data["ok"], false, "{name}: {data}");
            assert_eq!(data["result"]["error"], DENIED_MESSAGE, "{name}: {data}");
        }
    }
    assert_eq!(completions(&events).len(), 4);
    assert!(
        internal.state().calls().is_empty(),
        "nothing reached the internal service: {:?}",
        internal.state().calls()
    );
    // The in-process worker shares this process's metrics recorder.
    assert!(
        metrics.render().contains("agentfleet_egress_denied_total"),
        "the refusals are counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed_by_default_and_errors_reveal_nothing() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    // Why a tool could not be reached (refused, unresolvable, silent) stays in the logs.
    let body = scripted_run(
        json!([{"tool_calls": [
                  {"name": "redirect", "arguments": {"to": env.tools.url("/echo")}},
                  {"name": "unresolvable", "arguments": {}}]},
               {"content": "done"}]),
        json!([
            tool("redirect", &env.tools.url("/redirect")),
            tool("unresolvable", "http://unreachable.invalid:81/"),
        ]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    app.wait_status(id, &["completed"], T).await;
    let events = app.events(id, 0, T).await;
    let got = completions(&events);
    let redirect = &got.iter().find(|(n, _)| n == "redirect").unwrap().1;
    assert_eq!(redirect["ok"], false);
    assert!(
        redirect["result"]["error"]
            .as_str()
            .unwrap()
            .contains("redirect (HTTP 303)"),
        "{redirect}"
    );
    let closed = &got.iter().find(|(n, _)| n == "unresolvable").unwrap().1;
    assert_eq!(
        closed["result"]["error"], "the tool could not be reached",
        "{closed}"
    );
    assert_eq!(
        env.tools.state().calls_to("/echo").len(),
        0,
        "the redirect target was not called"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_internal_tool_urls_are_refused_at_submission() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    for (i, url) in [
        "http://127.0.0.1:5432/",
        "http://2130706433:6379/",
        "http://0.0.0.0:80/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:10.0.0.1]/",
    ]
    .iter()
    .enumerate()
    {
        let body = scripted_run(json!([{"content": "x"}]), json!([tool("t", url)]));
        let resp = app.post("/v1/runs", &body).await;
        assert_eq!(resp.status(), 422, "{i}: {url}");
        let err: Value = resp.json().await.unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("agent.tools[0].url: "),
            "{err}"
        );
    }
    // The allowlisted tool server is accepted.
    let ok = scripted_run(
        json!([{"content": "x"}]),
        json!([tool("t", &env.tools.url("/echo"))]),
    );
    assert_eq!(app.post("/v1/runs", &ok).await.status(), 202);
}

/// Peak resident memory of a process (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// A model whose stream starts with a byte-order mark and carries `id:` and `retry:` fields
/// (a huge id, then blank lines the SSE decoder used to copy it at) is read like any other:
/// the BOM made eventsource-stream panic, and the run then stayed `running` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_stream_with_a_byte_order_mark_and_odd_fields_is_read_as_any_other() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let prelude = format!(
        "\u{feff}: hello\nid: {}\n{}retry: 10\r\n\r\n",
        "7".repeat(100_000),
        "\n".repeat(2000)
    );
    let body = scripted_run(
        json!([{"sse_prelude": prelude, "tool_calls": [{"name": "echo", "arguments": {"x": 1}}]},
               {"sse_prelude": "\u{feff}", "content": "done"}]),
        json!([tool("echo", &env.tools.url("/echo"))]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let messages = app.messages(done["thread_id"].as_str().unwrap()).await;
    let last = messages.last().unwrap();
    assert_eq!(last["body"]["content"], "done", "{messages:?}");
}

/// The bound stated in the README's Isolation section.
const WORKER_PEAK_RSS: u64 = 200 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_gb_tool_answer_and_an_endless_model_stream_leave_the_worker_bounded() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let worker = env.spawn_worker_process(&[("worker.max_model_response_bytes", "1048576")]);
    let flood_tool = scripted_run(
        json!([{"tool_calls": [{"name": "flood", "arguments": {"bytes": 5_000_000_000u64}}]},
               {"content": "read what I could"}]),
        json!([tool("flood", &env.tools.url("/flood"))]),
    );
    let flood_model = scripted_run(json!([{"flood_bytes": 1_000_000_000u64}]), json!([]));
    let a = app.start_run(&flood_tool).await;
    let b = app.start_run(&flood_model).await;
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());

    let done = app.wait_status(a, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(a, 0, T).await;
    let (_, flood) = completions(&events).pop().unwrap();
    assert_eq!(flood["truncated"], true, "{flood}");
    assert_eq!(flood["result"]["truncated"], true);
    let kept = flood["result"]["partial"].as_str().unwrap().len();
    assert_eq!(kept, 65536, "exactly worker.max_tool_result_bytes is kept");

    let failed = app.wait_status(b, &["completed", "failed"], T).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(
        failed["error"]["code"], "model_response_too_large",
        "{failed}"
    );

    let peak = peak_rss(worker.pid());
    assert!(
        peak < WORKER_PEAK_RSS,
        "worker peak RSS {} MiB (bound {} MiB)",
        peak >> 20,
        WORKER_PEAK_RSS >> 20
    );
}

/// Model calls the scripted model served (one test environment, one model).
fn model_calls(env: &TestEnv) -> usize {
    env.llm.request_count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_characters_from_the_model_and_the_tool_end_in_a_completed_run_not_a_loop() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    // A NUL escaped inside the arguments' JSON, a raw NUL in verbatim arguments, and one in the
    // text; the echo tool sends the escaped one back in its answer.
    let body = scripted_run(
        json!([{"content": "before\u{0}after", "tool_calls": [
                  {"name": "echo", "arguments": {"word": "a\u{0}b"}},
                  {"name": "echo", "arguments": "{\"word\": \"c\u{0}d\"}"}]},
               {"content": "done\u{0}"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 1, "never handed back: {done}");
    assert_eq!(model_calls(&env), 2, "one model call per turn, no retries");
    let messages = app.messages(run["thread_id"].as_str().unwrap()).await;
    // NUL is gone from what was stored; an escape inside raw arguments is plain text.
    assert_eq!(
        messages[1]["body"]["content"], "beforeafter",
        "{messages:?}"
    );
    let mut results: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["body"]["content"].as_str().unwrap())
        .collect();
    results.sort_unstable(); // the two calls run concurrently
    assert_eq!(
        results,
        [r#"{"echo":{"word":"ab"}}"#, r#"{"echo":{"word":"cd"}}"#]
    );
    assert_eq!(messages.last().unwrap()["body"]["content"], "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_reuses_tool_call_ids_gets_unique_ones_and_the_run_completes() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let long_id = "x".repeat(300);
    let body = scripted_run(
        json!([{"tool_calls": [{"id": "dup", "name": "echo", "arguments": {"n": 1}},
                               {"id": "dup", "name": "echo", "arguments": {"n": 2}}]},
               {"tool_calls": [{"id": "dup", "name": "echo", "arguments": {"n": 3}},
                               {"id": long_id, "name": "echo", "arguments": {"n": 4}}]},
               {"content": "done"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(model_calls(&env), 3, "one model call per turn, no retries");
    let messages = app.messages(run["thread_id"].as_str().unwrap()).await;
    let ids: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["body"]["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 4);
    let distinct: std::collections::HashSet<&&str> = ids.iter().collect();
    assert_eq!(distinct.len(), 4, "{ids:?}");
    assert_eq!(env.tools.state().calls_to("/echo").len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_whose_run_was_cancelled_while_waiting_accepts_a_new_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut risky = http_tool(&env, "pay", "/side-effect");
    risky["risk"] = json!("high");
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "echo", "arguments": {}}, {"name": "pay", "arguments": {}}]}]),
        json!([http_tool(&env, "echo", "/echo"), risky]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let thread = run["thread_id"].as_str().unwrap();
    app.wait_status(id, &["waiting_for_confirmation"], T).await;
    let cancel = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(cancel.status(), 200);

    // The scripted model answers 400 to a history with unanswered tool calls, as OpenAI does.
    let next = app
        .start_run(&json!({"input": "and now?", "thread_id": thread, "agent": {"model": "mock"}}))
        .await;
    let done = app
        .wait_status(next["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let messages = app.messages(thread).await;
    let results: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(results.len(), 2, "both calls got a result: {messages:?}");
    assert!(results.iter().all(|m| {
        m["body"]["content"]
            .as_str()
            .unwrap()
            .contains("the run was cancelled")
    }));
    assert_eq!(
        env.tools.state().side_effect_count(),
        0,
        "the risky call never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_thread_missing_tool_results_is_repaired_when_loaded() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"content": "first done"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let thread = run["thread_id"].as_str().unwrap();
    app.wait_status(id, &["completed"], T).await;
    // A thread as an older version could leave it: the tool result is gone.
    let deleted = sqlx::query("DELETE FROM messages WHERE role = 'tool' AND thread_id = $1::uuid")
        .bind(thread)
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(deleted.rows_affected(), 1);
    let next = app
        .start_run(
            &json!({"input": "still there?", "thread_id": thread, "agent": {"model": "mock"}}),
        )
        .await;
    let done = app
        .wait_status(next["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_keeps_hitting_a_database_error_is_handed_back_a_bounded_number_of_times() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // Every attempt to record the model's turn fails as if the database timed out.
    let _worker = env.spawn_worker_process_with_failpoints(
        &[
            ("worker.max_handbacks", "2"),
            ("worker.handback_backoff_ms", "20"),
        ],
        "error:store:turn",
    );
    let run = app
        .start_run(&scripted_run(
            json!([{"content": "never recorded"}]),
            json!([]),
        ))
        .await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "internal_error_repeated", "{done}");
    assert!(
        !done["error"]["message"].as_str().unwrap().contains("pool"),
        "no internal detail reaches the tenant: {done}"
    );
    assert_eq!(
        model_calls(&env),
        3,
        "the first attempt and two hand-backs, then it stops"
    );
}

/// The next model call starts while the last tool outcome commits, but nothing the run writes
/// after the outcome may commit before it: when the outcome cannot be recorded, the turn made
/// meanwhile is not recorded either, on every attempt, and the run ends as any run whose
/// database keeps failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_never_recorded_ahead_of_the_tool_outcome_before_it() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process_with_failpoints(
        &[
            ("worker.max_handbacks", "2"),
            ("worker.handback_backoff_ms", "20"),
        ],
        "error:store:outcome",
    );
    let run = app
        .start_run(&scripted_run(
            json!([
                {"tool_calls": [{"name": "echo", "arguments": {"n": 1}}]},
                {"content": "never recorded"},
                {"content": "never recorded"},
                {"content": "never recorded"}
            ]),
            json!([http_tool(&env, "echo", "/echo")]),
        ))
        .await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "internal_error_repeated", "{done}");
    assert!(
        model_calls(&env) >= 2,
        "the next model call was made while the outcome was in flight"
    );
    let messages: Vec<(String, String)> = sqlx::query_as(
        "SELECT role, body::text FROM messages WHERE role IN ('assistant', 'tool') ORDER BY id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let roles: Vec<&str> = messages.iter().map(|(role, _)| role.as_str()).collect();
    assert_eq!(
        roles,
        ["assistant", "tool"],
        "the turn that made the call, then no turn but the failed end's answer: {messages:?}"
    );
    assert!(
        messages[1].1.contains("its outcome is unknown"),
        "the tool message is the end's, not a result: {messages:?}"
    );
    let (iteration,): (i32,) = sqlx::query_as("SELECT iteration FROM runs WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(iteration, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_error_never_shows_the_model_gateway_address() {
    let env = TestEnv::with(&[
        ("models.mock.base_url", "http://127.0.0.1:9/v1"),
        ("worker.model_max_retries", "0"),
    ])
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "x"}]), json!([])))
        .await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["failed"], T).await;
    assert_eq!(done["error"]["code"], "model_unreachable");
    assert_eq!(done["error"]["message"], "the model could not be reached");
    let events = app.events(id, 0, T).await;
    let all = serde_json::to_string(&events).unwrap() + &done.to_string();
    assert!(!all.contains("127.0.0.1:9"), "{all}");
}

/// A model response asking for more tool calls than `worker.max_tool_calls_per_response` (a
/// stream of chunks with a new `index` each could ask for hundreds of thousands) fails the
/// model call as malformed: no call of it is recorded or dispatched. One at the limit runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_more_tool_calls_than_the_limit_is_malformed_and_nothing_is_dispatched() {
    let env = TestEnv::with(&[("worker.max_tool_calls_per_response", "3")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let call = json!({"name": "echo", "arguments": {"word": "hi"}});
    let tools = json!([tool("echo", &env.tools.url("/echo"))]);
    let over = scripted_run(
        json!([{"tool_calls": [call, call, call, call]}, {"content": "never"}]),
        tools.clone(),
    );
    let run = app.start_run(&over).await;
    let id = run["id"].as_str().unwrap();
    let failed = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "model_stream_error", "{failed}");
    assert_eq!(
        failed["error"]["message"], "the model's stream was malformed",
        "{failed}"
    );
    assert_eq!(
        model_calls(&env),
        1,
        "a malformed response is not asked for again"
    );
    let (recorded,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM tool_calls WHERE run_id = $1::uuid")
            .bind(id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(recorded, 0);
    assert!(env.tools.calls_to("/echo").is_empty());

    let at = scripted_run(
        json!([{"tool_calls": [call, call, call]}, {"content": "done"}]),
        tools,
    );
    let run = app.start_run(&at).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(env.tools.calls_to("/echo").len(), 3);
}

/// A request body's JSON values are bounded before it is parsed (`api.max_json_values`): a
/// batch body of the largest accepted size that is nothing but small numbers
/// (`{"runs":[0,0,…]}`, 32 MiB) would be ~16 million `serde_json::Value`s, half a gigabyte,
/// in any untyped read of it. It is refused with 413, and the API stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_millions_of_tiny_json_values_is_refused_before_it_is_parsed() {
    let env = TestEnv::new().await;
    let (api, base) = env.spawn_api_process(&[]).await;
    let app = env.app_at(&base, reqwest::Client::new()).await;
    let mut body = String::from("{\"runs\":[");
    body.push_str(&"0,".repeat(16_000_000));
    body.push_str("0]}");
    let resp = app
        .http
        .post(app.url("/v1/batches"))
        .bearer_auth(&app.api_key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let err: Value = resp.json().await.unwrap();
    let peak = peak_rss(api.pid());
    assert!(peak < 200 * 1024 * 1024, "API peak RSS {} MiB", peak >> 20);
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["code"], "payload_too_large", "{err}");
}

/// A tool's parameter schema and the model's arguments are both a stranger's, and a JSON
/// Schema validator has no budget: a schema whose `$ref` loops back on itself made the
/// validator library (0.33) allocate without end while compiling it, at submission, and a
/// chain of `anyOf`s of two references each doubles the validator's work at every level, so
/// 40 levels (~3 KB) would hold a worker's thread for days on a one-word argument. Now the
/// submission is answered at once, the calls are refused before they are validated (the model
/// reads why), nothing is dispatched, and the run goes on to complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_that_loop_or_double_cost_a_bounded_check_and_the_run_goes_on() {
    let env = TestEnv::with(&[("worker.max_argument_checks", "50000")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let looping = json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"});
    let mut defs = serde_json::Map::new();
    for i in 0..40 {
        let next = format!("#/$defs/a{}", i + 1);
        defs.insert(
            format!("a{i}"),
            json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
        );
    }
    defs.insert("a40".into(), json!({"type": "null"}));
    let doubling = json!({"type": "object", "$defs": defs,
                          "properties": {"q": {"$ref": "#/$defs/a0"}}});
    let mut looping_tool = tool("looping", &env.tools.url("/echo"));
    looping_tool["parameters"] = looping;
    let mut doubling_tool = tool("doubling", &env.tools.url("/echo"));
    doubling_tool["parameters"] = doubling;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "looping", "arguments": {"word": "hi"}},
                               {"name": "doubling", "arguments": {"q": "x"}}]},
               {"content": "done"}]),
        json!([looping_tool, doubling_tool]),
    );
    let run = tokio::time::timeout(Duration::from_secs(10), app.start_run(&body))
        .await
        .expect("the submission is answered at once");
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(id, 0, T).await;
    let mut refused = completions(&events);
    refused.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = refused.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["doubling", "looping"], "{events:?}");
    // The loop goes deeper than the stack allows before it runs out of checks; the doubling
    // chain runs out of checks first.
    for ((name, data), why) in refused.iter().zip([
        "would take more than 50000 checks",
        "would nest more than 512 subschemas deep",
    ]) {
        assert_eq!(data["ok"], false, "{name}: {data}");
        let error = data["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{name}: {data}");
    }
    assert!(env.tools.calls_to("/echo").is_empty(), "nothing dispatched");
}
