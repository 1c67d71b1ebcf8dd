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
