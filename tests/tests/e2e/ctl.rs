//! `agentfleetctl`, run as the built binary against a real API (and worker where runs must
//! progress): runs, tail, answer, approve, configuration errors, and `submit` (plain progress
//! on a non-TTY; an interrupted submission resumed without duplicates).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Path as AxumPath;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

/// A scratch directory removed on drop; it is also the (empty) XDG config home, so a
/// developer's own `ctl.toml` never leaks into a test.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let p = std::env::temp_dir().join(format!("afctl-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write scratch file");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The binary with no connection settings at all.
fn bare(scratch: &Scratch) -> Command {
    let mut cmd = Command::new(binary("agentfleetctl"));
    cmd.env_remove("AGENTFLEET_API")
        .env_remove("AGENTFLEET_KEY")
        .env_remove("AGENTFLEETCTL_CONFIG")
        .env("XDG_CONFIG_HOME", &scratch.0)
        .env("HOME", &scratch.0)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The binary pointed at `app` through the environment.
fn ctl(app: &TestApp, scratch: &Scratch) -> Command {
    let mut cmd = bare(scratch);
    cmd.env("AGENTFLEET_API", &app.address)
        .env("AGENTFLEET_KEY", &app.api_key);
    cmd
}

async fn run(mut cmd: Command, args: &[&str]) -> Output {
    tokio::time::timeout(T, cmd.args(args).output())
        .await
        .unwrap_or_else(|_| panic!("agentfleetctl {args:?} did not finish in time"))
        .expect("agentfleetctl runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts the exit code, showing both streams when it differs.
fn expect(out: &Output, code: i32) -> (String, String) {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit code\n--- stdout\n{o}\n--- stderr\n{e}"
    );
    (o, e)
}

fn ask_run(question: &str, answer_echo: &str) -> Value {
    scripted_run(
        json!([{"tool_calls": [{"name": "ask", "arguments": {"text": question}}]},
               {"content": answer_echo}]),
        json!([]),
    )
}

fn risky(env: &TestEnv, name: &str) -> Value {
    let mut t = http_tool(env, name, "/side-effect");
    t["risk"] = json!("high");
    t
}

fn confirm_run(env: &TestEnv) -> Value {
    scripted_run(
        json!([
            {"tool_calls": [
                {"name": "transfer", "arguments": {"amount": 10}},
                {"name": "transfer", "arguments": {"amount": 99999}}
            ]},
            {"content": "done"}
        ]),
        json!([risky(env, "transfer")]),
    )
}

fn id_of(run: &Value) -> String {
    run["id"].as_str().expect("run id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_get_list_cancel_in_text_and_json() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let s = Scratch::new();
    let done = app
        .start_run(&scripted_run(json!([{"content": "all done"}]), json!([])))
        .await;
    let done_id = id_of(&done);
    app.wait_status(&done_id, &["completed"], T).await;

    let (o, _) = expect(
        &run(ctl(&app, &s), &["runs", "get", &done_id, "--json"]).await,
        0,
    );
    let v: Value = serde_json::from_str(&o).expect("--json prints JSON");
    assert_eq!(v["id"], done_id.as_str());
    assert_eq!(v["status"], "completed");
    let (o, _) = expect(&run(ctl(&app, &s), &["runs", "get", &done_id]).await, 0);
    assert!(o.contains("status:     completed"), "{o}");

    // A run that waits, cancelled from the CLI.
    let waiting = app.start_run(&ask_run("Name?", "hi")).await;
    let waiting_id = id_of(&waiting);
    app.wait_status(&waiting_id, &["waiting_for_input"], T)
        .await;
    let (o, _) = expect(
        &run(ctl(&app, &s), &["runs", "cancel", &waiting_id]).await,
        0,
    );
    assert!(o.contains(&format!("{waiting_id} cancelled")), "{o}");
    assert_eq!(app.run(&waiting_id).await["status"], "cancelled");

    let (o, _) = expect(
        &run(ctl(&app, &s), &["runs", "list", "--limit", "10", "--json"]).await,
        0,
    );
    let page: Value = serde_json::from_str(&o).expect("--json prints JSON");
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [waiting_id.as_str(), done_id.as_str()], "newest first");
    let (o, _) = expect(
        &run(ctl(&app, &s), &["runs", "list", "--status", "completed"]).await,
        0,
    );
    assert!(o.contains(&done_id) && !o.contains(&waiting_id), "{o}");

    // Refusals: exit 1 with the API's code; a malformed id is a usage error (exit 2).
    let (_, e) = expect(&run(ctl(&app, &s), &["runs", "cancel", &done_id]).await, 1);
    assert!(e.contains("run_finished"), "{e}");
    let unknown = uuid::Uuid::new_v4().to_string();
    let out = run(ctl(&app, &s), &["runs", "get", &unknown, "--json"]).await;
    let (o, e) = expect(&out, 1);
    assert!(e.contains("not_found"), "{e}");
    let err: Value = serde_json::from_str(&o).expect("--json errors are JSON too");
    assert_eq!(err["error"]["code"], "not_found");
    assert_eq!(err["error"]["exit_code"], 1);
    let (_, e) = expect(&run(ctl(&app, &s), &["runs", "get", "nope"]).await, 2);
    assert!(e.contains("not a UUID"), "{e}");
    let (_, e) = expect(
        &run(ctl(&app, &s), &["runs", "list", "--status", "bogus"]).await,
        1,
    );
    assert!(e.contains("invalid_request"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_and_approve_resume_paused_runs() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let s = Scratch::new();

    let asked = id_of(
        &app.start_run(&ask_run("What is your name?", "Hello, Ada"))
            .await,
    );
    let w = app.wait_status(&asked, &["waiting_for_input"], T).await;
    assert_eq!(w["pending"]["question"], "What is your name?");
    // `approve` on a run that waits for input is refused like the API refuses it.
    let (_, e) = expect(&run(ctl(&app, &s), &["approve", &asked, "--all"]).await, 1);
    assert!(e.contains("run_not_waiting"), "{e}");
    let (o, _) = expect(&run(ctl(&app, &s), &["answer", &asked, "Ada"]).await, 0);
    assert!(o.starts_with(&format!("resumed {asked}")), "{o}");
    app.wait_status(&asked, &["completed"], T).await;
    let reqs = env.llm.requests();
    let last = reqs.last().unwrap()["messages"].as_array().unwrap().clone();
    assert_eq!(
        last.last().unwrap()["content"],
        "Ada",
        "the answer reached the model"
    );
    // A second answer finds the run no longer waiting.
    let (_, e) = expect(&run(ctl(&app, &s), &["answer", &asked, "again"]).await, 1);
    assert!(e.contains("run_not_waiting"), "{e}");

    // --all approves every pending call.
    let all = id_of(&app.start_run(&confirm_run(&env)).await);
    app.wait_status(&all, &["waiting_for_confirmation"], T)
        .await;
    let (o, _) = expect(
        &run(ctl(&app, &s), &["approve", &all, "--all", "--json"]).await,
        0,
    );
    let v: Value = serde_json::from_str(&o).expect("--json prints JSON");
    assert_eq!(v["id"], all.as_str());
    app.wait_status(&all, &["completed"], T).await;
    assert_eq!(env.tools.calls_to("/side-effect").len(), 2);

    // --call one, --rest reject with a reason: exactly one call runs.
    let one = id_of(&app.start_run(&confirm_run(&env)).await);
    let w = app
        .wait_status(&one, &["waiting_for_confirmation"], T)
        .await;
    let calls = w["pending"]["tool_calls"].as_array().unwrap().clone();
    let first = calls[0]["tool_call_id"].as_str().unwrap();
    let second = calls[1]["tool_call_id"].as_str().unwrap();
    let (o, _) = expect(
        &run(
            ctl(&app, &s),
            &[
                "approve",
                &one,
                "--call",
                first,
                "--rest",
                "reject",
                "--reason",
                "not a payee",
            ],
        )
        .await,
        0,
    );
    assert!(o.contains(&format!("approved {first}")), "{o}");
    assert!(o.contains(&format!("rejected {second}")), "{o}");
    app.wait_status(&one, &["completed"], T).await;
    assert_eq!(
        env.tools.calls_to("/side-effect").len(),
        3,
        "only the approved call ran"
    );
    // --call alone leaves a call undecided: the API names it.
    let partial = id_of(&app.start_run(&confirm_run(&env)).await);
    let w = app
        .wait_status(&partial, &["waiting_for_confirmation"], T)
        .await;
    let c0 = w["pending"]["tool_calls"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, e) = expect(
        &run(ctl(&app, &s), &["approve", &partial, "--call", &c0]).await,
        1,
    );
    assert!(e.contains("missing_decisions"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_deltas_inline_events_as_lines_and_exits_with_the_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let s = Scratch::new();

    let body = scripted_run(
        json!([
            {"content": "Let me look.", "tool_calls": [{"name": "lookup", "arguments": {"q": "fleet"}}]},
            {"content": "A fleet is a group of ships.", "chunks": 5, "chunk_delay_ms": 20}
        ]),
        json!([http_tool(&env, "lookup", "/echo")]),
    );
    let id = id_of(&app.start_run(&body).await);
    // Started right away: it follows the run live to its end.
    let (o, e) = expect(&run(ctl(&app, &s), &["tail", &id]).await, 0);
    assert!(!o.contains('\x1b') && e.is_empty(), "{o}\n{e}");
    assert!(o.contains("Let me look.\n"), "deltas inline: {o}");
    assert!(o.contains("A fleet is a group of ships.\n"), "{o}");
    assert!(o.contains("[tool_started] lookup {\"q\":\"fleet\"}"), "{o}");
    assert!(o.contains("[tool_completed] lookup ok"), "{o}");
    assert!(o.lines().next().unwrap().starts_with("[run_queued]"), "{o}");
    assert!(
        o.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("[run_completed]"),
        "{o}"
    );

    // --json: one envelope a line, ids 1..n, replayed after the end too.
    let (o, _) = expect(&run(ctl(&app, &s), &["tail", &id, "--json"]).await, 0);
    let events: Vec<Value> = o
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_gap_free(&events);
    assert_eq!(events.last().unwrap()["type"], "run_completed");
    // --after skips what the caller has.
    let (o, _) = expect(
        &run(ctl(&app, &s), &["tail", &id, "--json", "--after", "3"]).await,
        0,
    );
    let first: Value = serde_json::from_str(o.lines().next().unwrap()).unwrap();
    assert_eq!(first["id"], 4);

    // A failed run: exit 1, the failure as the last line.
    let failing = id_of(
        &app.start_run(&scripted_run(
            json!([{"status": 400, "error_message": "bad request"}]),
            json!([]),
        ))
        .await,
    );
    let (o, e) = expect(&run(ctl(&app, &s), &["tail", &failing]).await, 1);
    assert!(
        o.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("[run_failed]"),
        "{o}"
    );
    assert!(e.contains("failed"), "{e}");

    // A pause: --until-pause exits 4 at it; plain `tail` waits through it to the end.
    let asked = id_of(&app.start_run(&ask_run("Which city?", "Paris it is")).await);
    let (o, _) = expect(
        &run(ctl(&app, &s), &["tail", &asked, "--until-pause"]).await,
        4,
    );
    assert!(o.contains("[input_required] Which city?"), "{o}");
    let mut follower = ctl(&app, &s);
    follower
        .args(["tail", &asked])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = follower.spawn().expect("spawn tail");
    app.wait_status(&asked, &["waiting_for_input"], T).await;
    let resp = app
        .post(
            &format!("/v1/runs/{asked}/resume"),
            &json!({"input": "Paris"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let out = tokio::time::timeout(T, child.wait_with_output())
        .await
        .expect("tail ends with the run")
        .expect("tail output");
    let (o, _) = expect(&out, 0);
    assert_eq!(
        o.matches("[input_required]").count(),
        1,
        "nothing printed twice: {o}"
    );
    assert!(o.contains("[run_resumed] input"), "{o}");
    assert!(o.contains("Paris it is"), "{o}");
}

/// Following a plan-and-solve run names its tasks: a line per task when the round is planned
/// (with the run id to follow it by), each task's end with its title, status and outcome, the
/// round's counts; `--json` keeps printing the raw events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_names_a_plans_tasks_with_their_statuses_and_outcomes() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let s = Scratch::new();
    let task = |title: &str, turn: Value| json!({"title": title, "input": agentfleet_tests::mock_llm::script(json!([turn]))});
    let turns = json!([
        plan_call(json!([
            // A newline in the output stays on the task's line.
            task("Find the Q3 figures", json!({"content": "Q3 revenue was 4.2 M EUR,\nup 8 %."})),
            task("Find the Q2 figures", json!({"status": 400, "error_message": "the Q2 ledger is closed"})),
        ])),
        complete_call(),
        {"content": "Q3 was up 8 %; Q2 could not be read."}
    ]);
    // One at a time: the second task is planned waiting for a slot.
    let body = planner_run(turns, json!({"max_parallel": 1}));
    let id = id_of(&app.start_run(&body).await);
    let (o, e) = expect(&run(ctl(&app, &s), &["tail", &id]).await, 0);
    assert!(!o.contains('\x1b') && e.is_empty(), "{o}\n{e}");

    let resp = app.get(&format!("/v1/runs/{id}/tasks")).await;
    let listed: Value = resp.json().await.unwrap();
    let tasks: Vec<(String, String)> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["run_id"].as_str().unwrap().to_owned(),
                t["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(tasks.len(), 2, "{listed}");
    assert_eq!(
        (tasks[0].1.as_str(), tasks[1].1.as_str()),
        ("completed", "failed")
    );
    let (q3, q2) = (&tasks[0].0, &tasks[1].0);
    let code = app.run(q2).await["error"]["code"]
        .as_str()
        .unwrap()
        .to_owned();
    let lines: Vec<&str> = o.lines().collect();
    for want in [
        format!("[plan_created] round 1 task 1/2 run {q3} queued: Find the Q3 figures"),
        format!("[plan_created] round 1 task 2/2 run {q2} waiting_for_slot: Find the Q2 figures"),
        format!(
            "[task_completed] round 1 task 1 run {q3} completed: Find the Q3 figures -- Q3 revenue was 4.2 M EUR, up 8 %."
        ),
        "[round_completed] round 1: 2 tasks (1 completed, 1 failed)".to_owned(),
    ] {
        assert!(lines.contains(&want.as_str()), "{want}\nin\n{o}");
    }
    let failed =
        format!("[task_completed] round 1 task 2 run {q2} failed: Find the Q2 figures -- {code}: ");
    assert_eq!(
        lines.iter().filter(|l| l.starts_with(&failed)).count(),
        1,
        "{failed}\nin\n{o}"
    );
    assert!(lines.last().unwrap().starts_with("[run_completed]"), "{o}");

    // --json: the raw events, the plan's among them as the API sends them.
    let (o, _) = expect(&run(ctl(&app, &s), &["tail", &id, "--json"]).await, 0);
    let events: Vec<Value> = o
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_gap_free(&events);
    let plan = events
        .iter()
        .find(|e| e["type"] == "plan_created")
        .expect("plan_created");
    assert_eq!(plan["data"]["tasks"][1]["run_id"], q2.as_str());
    assert_eq!(plan["data"]["tasks"][1]["status"], "waiting_for_slot");
    let ends: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "task_completed")
        .collect();
    assert_eq!(ends.len(), 2);
    assert_eq!(ends[1]["data"]["title"], "Find the Q2 figures");
    assert_eq!(events.last().unwrap()["type"], "run_completed");

    // A task is a run of its own: followed by the id printed, it ends as it did.
    let (o, _) = expect(&run(ctl(&app, &s), &["tail", q2]).await, 1);
    assert!(
        o.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("[run_failed]"),
        "{o}"
    );
}

/// What the fake stream server saw and serves.
#[derive(Default)]
struct FakeStream {
    last_event_ids: Vec<String>,
}

fn sse_event(id: u64, ty: &str, data: Value) -> String {
    let env =
        json!({"id": id, "run_id": "r", "thread_id": "t", "type": ty, "at": "now", "data": data});
    format!("id: {id}\nevent: {ty}\ndata: {env}\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_reconnects_with_last_event_id_after_a_dropped_connection() {
    // A stand-in API whose first connection breaks after two events (no terminal event); the
    // second must ask for what follows 2 and gets the rest.
    let state = Arc::new(Mutex::new(FakeStream::default()));
    let st = state.clone();
    let handler = move |AxumPath(_id): AxumPath<String>, headers: HeaderMap| {
        let st = st.clone();
        async move {
            let last = headers
                .get("last-event-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            st.lock().unwrap().last_event_ids.push(last.clone());
            let body = if last == "0" {
                sse_event(1, "run_queued", json!({"status": "queued"}))
                    + &sse_event(2, "message_delta", json!({"text": "Hel"}))
            } else {
                sse_event(2, "message_delta", json!({"text": "Hel"}))
                    + &sse_event(3, "message_delta", json!({"text": "lo"}))
                    + &sse_event(4, "run_completed", json!({"iteration": 1}))
            };
            ([("content-type", "text/event-stream")], body).into_response()
        }
    };
    let router = axum::Router::new().route("/v1/runs/{id}/events", axum::routing::get(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let s = Scratch::new();
    let mut cmd = bare(&s);
    cmd.env("AGENTFLEET_API", format!("http://{addr}"))
        .env("AGENTFLEET_KEY", "k");
    let run_id = uuid::Uuid::new_v4().to_string();
    let (o, _) = expect(&run(cmd, &["tail", &run_id]).await, 0);
    assert_eq!(
        o, "[run_queued]\nHello\n[run_completed] after iteration 1\n",
        "no duplicate delta"
    );
    assert_eq!(state.lock().unwrap().last_event_ids, ["0", "2"]);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_bounded_honour_retry_after_and_a_silent_api_times_out() {
    // A stand-in API that answers 503 (Retry-After: 0) to its first `fail` requests.
    let hits = Arc::new(Mutex::new(0u32));
    let fail = Arc::new(Mutex::new(2u32));
    let (h, f) = (hits.clone(), fail.clone());
    let handler = move |AxumPath(id): AxumPath<String>| {
        let (h, f) = (h.clone(), f.clone());
        async move {
            let n = {
                let mut h = h.lock().unwrap();
                *h += 1;
                *h
            };
            if n <= *f.lock().unwrap() {
                let body = json!({"error": {"code": "unavailable", "message": "try later"}});
                return (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "0")],
                    axum::Json(body),
                )
                    .into_response();
            }
            axum::Json(json!({"id": id, "status": "completed"})).into_response()
        }
    };
    let router = axum::Router::new().route("/v1/runs/{id}", axum::routing::get(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let s = Scratch::new();
    let at = |api: String| {
        let mut cmd = bare(&s);
        cmd.env("AGENTFLEET_API", api).env("AGENTFLEET_KEY", "k");
        cmd
    };
    let id = uuid::Uuid::new_v4().to_string();
    let (o, _) = expect(
        &run(
            at(format!("http://{addr}")),
            &["runs", "get", &id, "--json"],
        )
        .await,
        0,
    );
    assert_eq!(
        serde_json::from_str::<Value>(&o).unwrap()["status"],
        "completed"
    );
    assert_eq!(*hits.lock().unwrap(), 3, "two 503s, then the answer");
    // Fewer retries than failures: exit 3 with the API's code.
    *hits.lock().unwrap() = 0;
    let (_, e) = expect(
        &run(
            at(format!("http://{addr}")),
            &["--retries", "1", "runs", "get", &id],
        )
        .await,
        3,
    );
    assert!(e.contains("unavailable") && e.contains("try later"), "{e}");
    assert_eq!(*hits.lock().unwrap(), 2, "one retry, no more");
    server.abort();

    // An API that accepts connections and never answers: the timeout, then exit 3.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            held.push(sock);
        }
    });
    let (_, e) = expect(
        &run(
            at(format!("http://{silent_addr}")),
            &["--timeout", "1", "--retries", "1", "runs", "get", &id],
        )
        .await,
        3,
    );
    assert!(
        e.contains("no answer within 1s") || e.contains("timed out"),
        "{e}"
    );
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_exit_2_with_a_message_and_the_config_file_works() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let s = Scratch::new();

    let (_, e) = expect(&run(bare(&s), &["runs", "list"]).await, 2);
    assert!(e.contains("no API address"), "{e}");
    let mut no_key = bare(&s);
    no_key.env("AGENTFLEET_API", &app.address);
    let (_, e) = expect(&run(no_key, &["runs", "list"]).await, 2);
    assert!(
        e.contains("no API key") && e.contains("AGENTFLEET_KEY"),
        "{e}"
    );
    let (_, e) = expect(
        &run(
            bare(&s),
            &["--config", "/nonexistent/ctl.toml", "runs", "list"],
        )
        .await,
        2,
    );
    assert!(e.contains("/nonexistent/ctl.toml"), "{e}");
    let broken = s.file("broken.toml", &format!("key = \"{}\nnot toml", app.api_key));
    let (o, e) = expect(
        &run(
            bare(&s),
            &["--config", broken.to_str().unwrap(), "runs", "list"],
        )
        .await,
        2,
    );
    assert!(
        !o.contains(&app.api_key) && !e.contains(&app.api_key),
        "the key is never printed: {e}"
    );
    let (_, e) = expect(&run(bare(&s), &["runs", "frobnicate"]).await, 2);
    assert!(e.contains("frobnicate"), "{e}");

    // The default file ($XDG_CONFIG_HOME/agentfleet/ctl.toml), then a flag over it.
    std::fs::create_dir_all(s.0.join("agentfleet")).unwrap();
    std::fs::write(
        s.0.join("agentfleet/ctl.toml"),
        format!("api = \"{}\"\nkey = \"{}\"\n", app.address, app.api_key),
    )
    .unwrap();
    let (o, _) = expect(&run(bare(&s), &["runs", "list", "--json"]).await, 0);
    let page: Value = serde_json::from_str(&o).unwrap();
    assert!(page["data"].as_array().unwrap().is_empty());
    let (_, e) = expect(
        &run(bare(&s), &["--key", "af_wrong", "runs", "list"]).await,
        1,
    );
    assert!(e.contains("unauthorized"), "{e}");
    assert!(!e.contains("af_wrong"), "{e}");

    // Nothing listens: exit 3 after the (here: zero) retries.
    let mut dead = bare(&s);
    dead.env("AGENTFLEET_API", format!("http://{}", free_address()))
        .env("AGENTFLEET_KEY", "k");
    let (_, e) = expect(&run(dead, &["--retries", "0", "runs", "list"]).await, 3);
    assert!(e.contains("could not connect"), "{e}");
}

// ---- submit and batches (need the batches API: POST /v1/batches and friends) ----

fn jsonl(lines: usize) -> String {
    jsonl_of("answer", lines)
}

fn jsonl_of(prefix: &str, lines: usize) -> String {
    (1..=lines)
        .map(|i| {
            scripted_run(json!([{"content": format!("{prefix} {i}")}]), json!([])).to_string()
                + "\n"
        })
        .collect()
}

/// Every item of the tenant's batches, by custom_id, through `batch results`.
async fn results_by_custom_id(
    app: &TestApp,
    s: &Scratch,
    batch_ids: &[String],
) -> HashMap<String, Vec<Value>> {
    let mut by: HashMap<String, Vec<Value>> = HashMap::new();
    for b in batch_ids {
        let (o, _) = expect(&run(ctl(app, s), &["batch", "results", b]).await, 0);
        for l in o.lines() {
            let v: Value = serde_json::from_str(l).expect("results are NDJSON");
            by.entry(v["custom_id"].as_str().unwrap().to_owned())
                .or_default()
                .push(v);
        }
    }
    by
}

async fn tenant_run_count(app: &TestApp) -> usize {
    let page: Value = app.get("/v1/runs?limit=500").await.json().await.unwrap();
    assert!(page["next_cursor"].is_null(), "fewer than a page");
    page["data"].as_array().unwrap().len()
}

/// The batches API creates a batch's runs after its answer: waits until `n` exist, then
/// checks there are not more.
async fn wait_run_count(app: &TestApp, n: usize) {
    wait_for(&format!("{n} runs"), T, || async {
        (tenant_run_count(app).await >= n).then_some(())
    })
    .await;
    assert_eq!(tenant_run_count(app).await, n, "exactly one run per line");
}

fn batch_ids(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("batch "))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_on_a_non_tty_prints_plain_progress_and_waits_for_the_batches() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let s = Scratch::new();
    let file = s.file("runs.jsonl", &jsonl(5));
    let path = file.to_str().unwrap();

    // A bad line: named, nothing sent.
    let bad = s.file("bad.jsonl", &format!("{}{{nope\n", jsonl(1)));
    let (_, e) = expect(
        &run(ctl(&app, &s), &["submit", bad.to_str().unwrap()]).await,
        2,
    );
    assert!(e.contains("line 2: not JSON"), "{e}");
    assert_eq!(tenant_run_count(&app).await, 0);

    let (o, e) = expect(
        &run(
            ctl(&app, &s),
            &[
                "submit",
                path,
                "--chunk-size",
                "2",
                "--wait",
                "--poll-ms",
                "200",
            ],
        )
        .await,
        0,
    );
    assert!(
        !e.contains('\x1b') && !o.contains('\x1b'),
        "no escape codes off a TTY: {e}"
    );
    let progress: Vec<&str> = e.lines().filter(|l| l.starts_with("submitted ")).collect();
    assert_eq!(progress.len(), 4, "0, 2, 4, 5 of 5: {e}");
    assert!(progress[1].starts_with("submitted 2/5 runs ("), "{e}");
    assert!(progress[1].contains("/s, eta "), "{e}");
    assert!(e.lines().any(|l| l.starts_with("finished 5/5 runs")), "{e}");
    let ids = batch_ids(&o);
    assert_eq!(ids.len(), 3, "{o}");
    assert!(o.contains("lines 1-2: 2 runs created"), "{o}");
    assert!(o.contains("completed 5, failed 0, cancelled 0"), "{o}");

    // The same command again: the same batches, nothing new.
    let (o, _) = expect(
        &run(
            ctl(&app, &s),
            &["submit", path, "--chunk-size", "2", "--json"],
        )
        .await,
        0,
    );
    let doc: Value = serde_json::from_str(&o).expect("--json prints one JSON document");
    let again: Vec<String> = doc["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            assert_eq!(b["created"], false, "{b}");
            b["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(again, ids);
    wait_run_count(&app, 5).await;

    let (o, _) = expect(
        &run(
            ctl(&app, &s),
            &["batch", "status", &ids[0], &ids[2], "--json"],
        )
        .await,
        0,
    );
    let st: Value = serde_json::from_str(&o).unwrap();
    assert_eq!(st["batches"][1]["total"], 1);
    assert_eq!(st["batches"][0]["status"], "completed");
    let by = results_by_custom_id(&app, &s, &ids).await;
    assert_eq!(by.len(), 5);
    assert_eq!(by["line-3"][0]["output"], "answer 3");
    let out = s.0.join("results.ndjson");
    expect(
        &run(
            ctl(&app, &s),
            &[
                "batch",
                "results",
                &ids[0],
                "--output",
                out.to_str().unwrap(),
            ],
        )
        .await,
        0,
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 2);

    // --wait exits 1 when a run failed.
    let failing = scripted_run(json!([{"status": 400}]), json!([]));
    let file = s.file("failing.jsonl", &format!("{failing}\n"));
    let (o, _) = expect(
        &run(
            ctl(&app, &s),
            &[
                "submit",
                file.to_str().unwrap(),
                "--wait",
                "--poll-ms",
                "200",
            ],
        )
        .await,
        1,
    );
    assert!(o.contains("completed 0, failed 1, cancelled 0"), "{o}");

    // A line the API refuses: the error names the file's line; the chunk before it was
    // created, and after the fix a re-run creates only the rest.
    let mut refused = scripted_run(json!([{"content": "fixed"}]), json!([]));
    refused["agent"]["tools"] = json!("not a list");
    let file = s.file(
        "refused.jsonl",
        &format!("{}{refused}\n", jsonl_of("other", 2)),
    );
    let (_, e) = expect(
        &run(
            ctl(&app, &s),
            &["submit", file.to_str().unwrap(), "--chunk-size", "2"],
        )
        .await,
        1,
    );
    assert!(
        e.contains("invalid_request") && e.contains("line 3: runs[0]"),
        "{e}"
    );
    wait_run_count(&app, 8).await;
    refused["agent"]["tools"] = json!([]);
    let file = s.file(
        "refused.jsonl",
        &format!("{}{refused}\n", jsonl_of("other", 2)),
    );
    let (o, _) = expect(
        &run(
            ctl(&app, &s),
            &["submit", file.to_str().unwrap(), "--chunk-size", "2"],
        )
        .await,
        0,
    );
    assert!(o.contains("lines 1-2: 2 runs already submitted"), "{o}");
    assert!(o.contains("lines 3-3: 1 runs created"), "{o}");
    wait_run_count(&app, 9).await;
    // The same file again on purpose: another --label makes new runs.
    let (o, _) = expect(
        &run(
            ctl(&app, &s),
            &[
                "submit",
                file.to_str().unwrap(),
                "--chunk-size",
                "2",
                "--label",
                "twice",
            ],
        )
        .await,
        0,
    );
    assert_eq!(o.matches(" created").count(), 2, "{o}");
    wait_run_count(&app, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_resumed_after_an_interrupt_creates_no_duplicates() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await; // no worker: the runs stay queued, which is enough
    let s = Scratch::new();
    const LINES: usize = 120;
    let file = s.file("runs.jsonl", &jsonl(LINES));
    let path = file.to_str().unwrap().to_owned();

    let mut cmd = ctl(&app, &s);
    cmd.args(["submit", &path, "--chunk-size", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn submit");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, lines.next_line())
        .await
        .expect("a first batch in time")
        .unwrap()
        .expect("a line");
    assert!(
        first.starts_with("batch ") && first.ends_with("created"),
        "{first}"
    );
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut acknowledged = vec![first];
    while let Ok(Some(l)) = tokio::time::timeout(T, lines.next_line())
        .await
        .expect("stdout ends")
    {
        acknowledged.push(l);
    }
    let code = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap()
        .code();
    assert_eq!(code, Some(130), "interrupted mid-way: {acknowledged:?}");
    let sent = batch_ids(&acknowledged.join("\n")).len();
    assert!(sent < LINES, "interrupted before the end");
    assert!(tenant_run_count(&app).await < LINES);

    let (o, _) = expect(
        &run(ctl(&app, &s), &["submit", &path, "--chunk-size", "1"]).await,
        0,
    );
    let ids = batch_ids(&o);
    assert_eq!(ids.len(), LINES);
    let resent = o
        .lines()
        .filter(|l| l.ends_with("already submitted"))
        .count();
    assert!(
        resent >= sent,
        "the {sent} acknowledged batches came back as they were: {o}"
    );
    wait_run_count(&app, LINES).await;
    let by = results_by_custom_id(&app, &s, &ids).await;
    assert_eq!(by.len(), LINES);
    for i in 1..=LINES {
        let items = &by[&format!("line-{i}")];
        assert_eq!(items.len(), 1, "line-{i} once: {items:?}");
        assert!(items[0]["run_id"].is_string(), "{items:?}");
    }

    // Cancelling a batch cancels its queued run.
    let (o, _) = expect(
        &run(ctl(&app, &s), &["batch", "cancel", &ids[0], "--json"]).await,
        0,
    );
    let v: Value = serde_json::from_str(&o).unwrap();
    assert_eq!(v["id"], ids[0].as_str());
    let run_id = by["line-1"][0]["run_id"].as_str().unwrap().to_owned();
    app.wait_status(&run_id, &["cancelled"], T).await;
}
