//! The web console in a real browser: Debian's headless Chromium, driven by Playwright
//! (tests/browser/console.mjs), against a real API and worker behind a proxy that cuts the
//! browser's connections mid-stream. The script reports what the page showed; this test
//! checks it against the API.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::cut_proxy::CutProxy;
use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);
const BROWSER_DEADLINE: Duration = Duration::from_secs(180);

/// Replies long enough, at 60 chunks of 80 ms, that the script can cut the connection while
/// they stream. The first carries markup a careless page would run: the console shows it as text.
const FIRST: &str = "Let me look at invoice 7 first. It was issued on 3 November for 42.00 EUR, \
    payable to alice, and nothing has been paid against it yet. The amount matches the purchase \
    order, so the transfer is the right next step; it moves money, so it needs your approval. \
    (A hostile reply would try <img src=x onerror=\"window.__injected=true\"><script>window.__injected=true</script> here.)";
const SECOND: &str = "Done: 42.00 EUR went to alice for invoice 7, and the transfer service \
    confirmed it on the first attempt. The invoice can now be marked as paid; tell me if you \
    want a receipt sent to alice or the payment noted in the ledger as well.";

fn browser_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("browser")
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// Runs a script of tests/browser with `vars` and answers its report, failing the test when
/// the script failed or overran its deadline.
async fn browse(script: &str, vars: &[(&str, &str)]) -> Value {
    let dir = browser_dir();
    assert!(
        dir.join("node_modules/playwright-core").is_dir() && PathBuf::from(chromium()).exists(),
        "the browser tests need Chromium and playwright-core: run scripts/browser-deps"
    );
    let child = tokio::process::Command::new("node")
        .arg(script)
        .current_dir(&dir)
        .envs(vars.iter().copied())
        .env("CHROMIUM", chromium())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start node (the browser tests need Node.js: scripts/browser-deps)");
    let output = tokio::time::timeout(BROWSER_DEADLINE, child.wait_with_output())
        .await
        .expect("the browser script finishes within its deadline")
        .expect("browser script output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no report from {script}:\n{stdout}\n{stderr}"));
    assert!(
        output.status.success() && report.get("error").is_none(),
        "{script} failed: {report:#}\n{stderr}"
    );
    assert_eq!(
        report["outsideRequests"],
        json!([]),
        "nothing from outside the host"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_streams_a_run_through_cut_connections_approves_a_call_and_sees_it_complete() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let proxy = CutProxy::start(&app.address).await;

    let (first, second) = (FIRST.to_string(), SECOND.to_string());
    let mut transfer = http_tool(&env, "transfer", "/side-effect");
    transfer["risk"] = json!("high");
    // The script in the system prompt, so the user's message reads as one.
    let mut agent = agent(json!([transfer]));
    agent["system_prompt"] = json!(agentfleet_tests::mock_llm::script(json!([
        {"content": first, "chunks": 60, "chunk_delay_ms": 80,
         "tool_calls": [{"name": "transfer", "arguments": {"amount": 42, "to": "alice"}}]},
        {"content": second, "chunks": 60, "chunk_delay_ms": 80}
    ])));
    let body = json!({"input": "Please pay invoice 7 (42 EUR to alice).", "agent": agent});

    let screenshots = std::env::var("AGENTFLEET_CONSOLE_SCREENSHOTS").unwrap_or_else(|_| {
        let d = std::env::temp_dir().join(format!("af-console-{}", uuid::Uuid::now_v7()));
        d.to_string_lossy().into_owned()
    });
    std::fs::create_dir_all(&screenshots).unwrap();
    let report = browse(
        "console.mjs",
        &[
            ("CONSOLE_URL", proxy.address.as_str()),
            ("CONSOLE_KEY", app.api_key.as_str()),
            ("CONSOLE_RUN_BODY", body.to_string().as_str()),
            ("CONSOLE_CUT", proxy.control_url.as_str()),
            ("SCREENSHOTS", screenshots.as_str()),
        ],
    )
    .await;

    let run_id = report["runId"].as_str().expect("run id").to_string();
    let run = app.run(&run_id).await;
    assert_eq!(run["status"], "completed");

    // Every event exactly once, in order, as the API has them: nothing lost or repeated
    // across two cut connections and the pause.
    let events = app.events(&run_id, 0, T).await;
    let expected: Vec<Value> = events
        .iter()
        .map(|e| json!({"id": e["id"], "type": e["type"]}))
        .collect();
    assert_eq!(report["events"], json!(expected), "{report:#}");
    assert_eq!(report["gap"], Value::Null);
    assert!(
        report["cutsDuringFirstReply"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
    assert!(
        report["cutsDuringSecondReply"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
    // The first opening, one after each cut, one after the pause ended the stream.
    assert!(
        report["eventStreamRequests"].as_u64().unwrap() >= 3,
        "the page reconnected: {report:#}"
    );

    // What streamed, delta by delta, is exactly each reply; and markup stayed text.
    let replies = report["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 2, "{report:#}");
    for (r, text) in replies.iter().zip([&first, &second]) {
        assert_eq!(r["streamed"].as_str(), Some(text.as_str()), "{report:#}");
        assert_eq!(r["shown"].as_str(), Some(text.as_str()));
    }
    assert_eq!(report["injected"], false);
    let csp = report["csp"].as_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(
        report["refusedKey"].as_str().unwrap().contains("refused"),
        "{report:#}"
    );

    // The approval ran the call once, with the model's arguments.
    let calls = env.tools.calls_to("/side-effect");
    assert_eq!(calls.len(), 1, "the approved call ran once");
    assert_eq!(
        calls[0].body["arguments"],
        json!({"amount": 42, "to": "alice"})
    );
    let tool = &report["tools"][0];
    assert_eq!(tool["id"], report["pendingCall"]);
    assert_ne!(tool["result"], "awaiting approval");

    // Usage as the API reports it; the thread and the filtered list.
    assert_eq!(
        report["usage"]["total_tokens"].as_str().unwrap(),
        run["usage"]["total_tokens"].to_string()
    );
    assert_eq!(
        report["cancelHidden"], true,
        "an ended run offers no cancel"
    );
    let classes: Vec<&str> = report["threadMessages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for role in ["msg user", "msg assistant", "msg tool"] {
        assert!(classes.contains(&role), "{role} in {classes:?}");
    }
    assert!(report["completedCount"].as_u64().unwrap() >= 1);
    assert!(
        report["listedStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s == "completed"),
        "{report:#}"
    );
    for shot in [
        "console-runs.png",
        "console-run.png",
        "console-approval.png",
    ] {
        let len = std::fs::metadata(PathBuf::from(&screenshots).join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 10_000, "{shot} is a screenshot ({len} bytes)");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_console_a_question_is_answered_a_call_rejected_and_a_run_cancelled() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut risky = http_tool(&env, "transfer", "/side-effect");
    risky["risk"] = json!("high");
    let runs = json!({
        "ask": scripted_run(json!([
            {"tool_calls": [{"name": "ask", "arguments": {"text": "Which city?"}}]},
            {"content": "Booked for Paris."}
        ]), json!([])),
        "risky": scripted_run(json!([
            {"tool_calls": [{"name": "transfer", "arguments": {"amount": 7}}]},
            {"content": "Understood, no transfer."}
        ]), json!([risky])),
        // Slow enough to be cancelled while it runs (the cancel ends the call).
        "slow": scripted_run(json!([{"content": "too late", "delay_ms": 120_000}]), json!([])),
    });
    let report = browse(
        "steer.mjs",
        &[
            ("CONSOLE_URL", app.address.as_str()),
            ("CONSOLE_KEY", app.api_key.as_str()),
            ("CONSOLE_RUNS", runs.to_string().as_str()),
        ],
    )
    .await;
    let ids = &report["runs"];

    assert_eq!(report["question"], "Which city?");
    let ask = ids["ask"].as_str().unwrap();
    assert_eq!(app.run(ask).await["status"], "completed");
    let thread = app.run(ask).await["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let answered = app
        .messages(&thread)
        .await
        .iter()
        .any(|m| m["role"] == "user" && m["body"]["content"] == "Paris, please");
    assert!(answered, "the answer is the thread's user message");
    assert_eq!(report["askPendingHidden"], true);

    let risky = ids["risky"].as_str().unwrap();
    assert_eq!(app.run(risky).await["status"], "completed");
    assert!(
        env.tools.calls_to("/side-effect").is_empty(),
        "a rejected call never runs"
    );
    let rejection = report["rejection"].as_str().unwrap();
    assert!(rejection.contains("not on a Friday"), "{rejection}");

    let slow = ids["slow"].as_str().unwrap();
    assert_eq!(app.run(slow).await["status"], "cancelled");
    assert!(
        report["cancelledNote"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_a_strict_policy_and_can_be_turned_off() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = http.get(app.url("/console")).send().await.unwrap();
    assert_eq!(res.status(), 308);
    assert_eq!(res.headers()["location"], "/console/");
    for (path, kind) in [
        ("/console/", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let res = http.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        let h = res.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'none'"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["x-frame-options"], "DENY");
        let body = res.text().await.unwrap();
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "{path} loads nothing from another host"
        );
    }

    let off = env.spawn_api_with(&[("api.console", "false")]).await;
    let res = http.get(off.url("/console/")).send().await.unwrap();
    assert_eq!(res.status(), 404);
}

/// What the console's list uses: `batch_id` filters the list, and `/v1/runs/counts` counts
/// per status within the tenant's newest `api.count_window` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_by_batch_and_counted_per_status_within_the_window() {
    let env = TestEnv::new().await;
    let app = env.spawn_api_with(&[("api.count_window", "3")]).await;
    let run = |text: &str| json!({"input": text, "agent": agent(json!([]))});
    let single = app.start_run(&run("alone")).await;
    let res = app
        .post("/v1/runs/batch", &json!({"runs": [run("a"), run("b")]}))
        .await;
    assert_eq!(res.status(), 202);
    let batch: Value = res.json().await.unwrap();
    let batch_id = batch["batch_id"].as_str().unwrap();
    let listed: Value = app
        .get(&format!("/v1/runs?batch_id={batch_id}"))
        .await
        .json()
        .await
        .unwrap();
    let mut ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut want: Vec<&str> = batch["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    want.sort_unstable();
    assert_eq!(ids, want);

    let counts: Value = app
        .get(&format!("/v1/runs/counts?batch_id={batch_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(counts["counts"]["queued"], 2, "{counts}");
    assert_eq!(
        counts["counts"]["completed"], 0,
        "every status is listed: {counts}"
    );
    assert_eq!(counts["counted"], 2);
    let thread = single["thread_id"].as_str().unwrap();
    let counts: Value = app
        .get(&format!("/v1/runs/counts?thread_id={thread}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(counts["counted"], 1, "{counts}");

    // A fourth run: the tenant-wide count stops at the window and says so.
    app.start_run(&run("fourth")).await;
    let counts: Value = app.get("/v1/runs/counts").await.json().await.unwrap();
    assert_eq!(counts["counted"], 3, "{counts}");
    assert_eq!(counts["window"], 3);

    for (query, field) in [
        ("/v1/runs?batch_id=nope", "batch_id"),
        ("/v1/runs/counts?thread_id=nope", "thread_id"),
        ("/v1/runs/counts?status=queued", "status"),
    ] {
        let res = app.get(query).await;
        assert_eq!(res.status(), 422, "{query}");
        let err: Value = res.json().await.unwrap();
        assert!(
            err["error"]["message"].as_str().unwrap().contains(field),
            "{query}: {err}"
        );
    }
}

/// A task of the plan below: its title and the scripted model turn of its run.
fn plan_task(title: &str, turn: Value) -> Value {
    json!({"title": title, "input": agentfleet_tests::mock_llm::script(json!([turn]))})
}

/// What a report says of the events it showed, as (id, type) pairs.
fn shown_events(report: &Value) -> Value {
    json!(
        report["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| json!({"id": e["id"], "type": e["type"]}))
            .collect::<Vec<_>>()
    )
}

async fn api_events(app: &TestApp, run_id: &str) -> Value {
    let events = app.events(run_id, 0, T).await;
    json!(
        events
            .iter()
            .map(|e| json!({"id": e["id"], "type": e["type"]}))
            .collect::<Vec<_>>()
    )
}

fn note_texts<'a>(page: &'a Value, class: &str) -> Vec<&'a str> {
    page["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["class"].as_str().is_some_and(|c| c.contains(class)))
        .filter_map(|n| n["text"].as_str())
        .collect()
}

/// A plan-and-solve run opened in the console: its page shows the rounds and their tasks as a
/// tree updated while they run (the second task waiting for a slot, the planner for its
/// tasks), each task's title and final status, the plan's events as readable lines; a task's
/// link opens its own run page with its own stream and a link back to the planner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_plan_as_a_tree_of_tasks_each_with_its_own_run_page() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;

    const Q3: &str = "Q3 revenue was 4.2 M EUR, up 8 % on Q2.";
    let turns = json!([
        plan_call(json!([
            // Slow enough for the page to show the round while it runs.
            plan_task("Find the Q3 figures", json!({"content": Q3, "delay_ms": 2500, "chunks": 6, "chunk_delay_ms": 100})),
            plan_task("Find the Q2 figures", json!({"status": 400, "error_message": "the Q2 ledger is closed", "delay_ms": 300})),
        ])),
        plan_call(json!([plan_task("Compare the quarters", json!({"content": "Q3 beat Q2."}))])),
        complete_call(),
        {"content": "SUMMARY: Q3 was up 8 %; Q2 could not be read."}
    ]);
    // One task at a time: the second waits for a slot while the first runs.
    let body = planner_run(turns, json!({"max_parallel": 1}));
    let screenshots = std::env::var("AGENTFLEET_CONSOLE_SCREENSHOTS").ok();
    let mut vars = vec![
        ("CONSOLE_URL", app.address.clone()),
        ("CONSOLE_KEY", app.api_key.clone()),
        ("CONSOLE_RUN_BODY", body.to_string()),
    ];
    if let Some(dir) = &screenshots {
        vars.push(("SCREENSHOTS", dir.clone()));
    }
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let report = browse("plan.mjs", &vars).await;

    let parent = report["runId"].as_str().expect("run id").to_string();
    assert_eq!(app.run(&parent).await["status"], "completed");
    let resp = app.get(&format!("/v1/runs/{parent}/tasks")).await;
    let tasks: Value = resp.json().await.unwrap();
    let tasks = tasks["data"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 3, "{tasks:?}");

    // The tree: rounds in order, each task with its title, final status and link, as the API
    // has them.
    let tree = report["tree"].as_array().unwrap();
    let shown: Vec<(i64, i64, &str, &str)> = tree
        .iter()
        .flat_map(|r| {
            r["tasks"].as_array().unwrap().iter().map(move |t| {
                (
                    r["round"].as_i64().unwrap(),
                    t["taskIndex"].as_i64().unwrap(),
                    t["title"].as_str().unwrap(),
                    t["status"].as_str().unwrap(),
                )
            })
        })
        .collect();
    assert_eq!(
        shown,
        [
            (1, 0, "Find the Q3 figures", "completed"),
            (1, 1, "Find the Q2 figures", "failed"),
            (2, 0, "Compare the quarters", "completed"),
        ],
        "{report:#}"
    );
    let shown_tasks: Vec<&Value> = tree
        .iter()
        .flat_map(|r| r["tasks"].as_array().unwrap())
        .collect();
    for (t, api) in shown_tasks.iter().zip(&tasks) {
        assert_eq!(t["runId"], api["run_id"], "{report:#}");
        assert_eq!(t["status"], api["status"]);
        assert_eq!(t["title"], api["title"]);
        assert_eq!(
            t["href"].as_str().unwrap(),
            format!("#/runs/{}", api["run_id"].as_str().unwrap())
        );
        assert_eq!(
            t["badge"].as_str().unwrap(),
            api["status"].as_str().unwrap().replace('_', " ")
        );
    }
    let ids: Vec<&str> = tasks
        .iter()
        .map(|t| t["run_id"].as_str().unwrap())
        .collect();
    let failed = app.run(ids[1]).await;
    let failure_code = failed["error"]["code"].as_str().unwrap().to_string();
    assert!(
        shown_tasks[0]["detail"].as_str().unwrap().contains(Q3),
        "{report:#}"
    );
    assert!(
        shown_tasks[1]["detail"]
            .as_str()
            .unwrap()
            .contains(&failure_code),
        "{report:#}"
    );
    assert!(
        tree.iter().all(|r| r["done"] == true),
        "both rounds done: {report:#}"
    );
    assert!(
        report["summary"].as_str().unwrap().starts_with("2 rounds"),
        "{report:#}"
    );

    // Live: the page showed the planner waiting for its tasks, the second task waiting for a
    // slot before it ran, and the first before it ended.
    let seen = &report["seen"];
    let seen_of = |id: &str| -> Vec<String> {
        seen["tasks"][id]
            .as_array()
            .unwrap_or_else(|| panic!("no statuses seen for {id}: {report:#}"))
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        seen["run"]
            .as_array()
            .unwrap()
            .contains(&json!("waiting_for_tasks")),
        "{report:#}"
    );
    let second = seen_of(ids[1]);
    assert_eq!(
        second.first().map(String::as_str),
        Some("waiting_for_slot"),
        "{second:?}"
    );
    assert_eq!(
        second.last().map(String::as_str),
        Some("failed"),
        "{second:?}"
    );
    let first = seen_of(ids[0]);
    assert!(
        first.len() >= 2 && first.last().map(String::as_str) == Some("completed"),
        "the first task seen before it ended: {first:?}"
    );

    // The planner's stream, every event once, the plan's events as readable lines.
    assert_eq!(
        shown_events(&report["parent"]),
        api_events(&app, &parent).await
    );
    assert_eq!(report["parent"]["gap"], Value::Null);
    let plan_notes = note_texts(&report["parent"], "plan");
    assert!(
        plan_notes
            .contains(&"round 1 planned: 2 tasks — Find the Q3 figures · Find the Q2 figures"),
        "{plan_notes:?}"
    );
    assert!(
        plan_notes.contains(&"round 1 done: 2 tasks (1 completed, 1 failed)"),
        "{plan_notes:?}"
    );
    assert!(
        plan_notes.contains(&"round 2 done: 1 task (1 completed)"),
        "{plan_notes:?}"
    );
    // The planner's calls: two `plan` calls with their rounds' results, and `complete`.
    let calls: Vec<(&str, &str)> = report["parent"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["result"].as_str().unwrap()))
        .collect();
    assert_eq!(
        calls.iter().map(|c| c.0).collect::<Vec<_>>(),
        ["plan", "plan", "complete"],
        "{calls:?}"
    );
    assert!(calls[0].1.contains(Q3), "{calls:?}");
    assert!(
        calls.iter().all(|c| !c.1.starts_with("running")),
        "every call shows its end: {calls:?}"
    );
    let task_notes = note_texts(&report["parent"], "task");
    assert!(
        task_notes
            .contains(&format!("task 1 of round 1 “Find the Q3 figures” completed: {Q3}").as_str()),
        "{task_notes:?}"
    );
    assert!(
        task_notes.iter().any(|n| n.starts_with(&format!(
            "task 2 of round 1 “Find the Q2 figures” failed: {failure_code}"
        ))),
        "{task_notes:?}"
    );

    // A task's page, from its link: its own stream, its reply, and the way back.
    let first_page = &report["firstTask"];
    assert!(
        first_page["url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("#/runs/{}", ids[0])),
        "{first_page:#}"
    );
    assert_eq!(shown_events(first_page), api_events(&app, ids[0]).await);
    assert_eq!(first_page["replies"], json!([Q3]));
    let task_of = first_page["taskOf"].as_str().unwrap();
    assert!(
        task_of.starts_with("task 1 of round 1 of ") && task_of.ends_with("Find the Q3 figures"),
        "{task_of}"
    );
    assert_eq!(first_page["parentHref"], format!("#/runs/{parent}"));
    assert_eq!(first_page["planHidden"], true, "a task has no plan");
    assert!(
        report["backAtParent"]
            .as_str()
            .unwrap()
            .ends_with(&format!("#/runs/{parent}")),
        "{report:#}"
    );
    let second_page = &report["secondTask"];
    assert_eq!(second_page["status"], "failed");
    assert!(
        second_page["taskOf"]
            .as_str()
            .unwrap()
            .starts_with("task 2 of round 1 of "),
        "{second_page:#}"
    );
    assert_eq!(shown_events(second_page), api_events(&app, ids[1]).await);

    // The new statuses in the list's filter and counts, and the plan's runs tagged.
    for status in ["waiting_for_tasks", "waiting_for_slot"] {
        assert!(
            report["filterOptions"]
                .as_array()
                .unwrap()
                .contains(&json!(status)),
            "{report:#}"
        );
        assert!(
            report["countStatuses"]
                .as_array()
                .unwrap()
                .contains(&json!(status)),
            "{report:#}"
        );
    }
    assert_eq!(report["filterSelected"], "waiting_for_tasks");
    let tags = &report["tags"];
    assert_eq!(tags[parent.as_str()], "planner", "{report:#}");
    for (id, tag) in ids.iter().zip(["task 1.1", "task 1.2", "task 2.1"]) {
        assert_eq!(tags[*id], tag, "{report:#}");
    }
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
    if let Some(dir) = &screenshots {
        let len = std::fs::metadata(PathBuf::from(dir).join("console-plan.png"))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(
            len > 10_000,
            "console-plan.png is a screenshot ({len} bytes)"
        );
    }
}
