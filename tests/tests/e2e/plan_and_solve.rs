//! Plan-and-solve: a planner fans rounds of tasks out as child runs across the fleet, takes
//! their results up when the round's last task ends, and a summary turn writes the answer.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;
use agentfleet_tests::mock_llm::script;
use agentfleet_tests::webhook_receiver::Receiver;

const T: Duration = Duration::from_secs(60);

/// A task whose model answers `answer` after `delay_ms`.
fn task(title: &str, answer: &str, delay_ms: u64) -> Value {
    json!({"title": title, "input": script(json!([{"content": answer, "delay_ms": delay_ms}]))})
}

/// The model requests of the run whose input is `input` (its first user message).
fn requests_of(env: &TestEnv, input: &str) -> Vec<Value> {
    env.llm
        .requests()
        .into_iter()
        .filter(|r| {
            r["messages"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["role"] == "user"))
                .is_some_and(|m| m["content"] == input)
        })
        .collect()
}

/// The tool results of a request, in order.
fn tool_results(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn tasks(app: &TestApp, run_id: &str) -> Vec<Value> {
    let resp = app.get(&format!("/v1/runs/{run_id}/tasks")).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["data"].as_array().unwrap().clone()
}

/// Three tasks in parallel, then a round of one, then `complete`: the three run at once on both
/// workers, the planner's stream is gap-free with the documented events, the results reach the
/// planner as the `plan` calls' results, and the summary turn's text is the output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_parallel_tasks_then_one_then_a_summary() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // Two slots each: three tasks at once cannot all be on one worker.
    let extra = [("worker.concurrency", "2")];
    let _workers = [
        env.spawn_worker_process(&extra),
        env.spawn_worker_process(&extra),
    ];
    let turns = json!([
        plan_call(json!([task("a", "alpha done", 1500), task("b", "beta done", 1500),
                          task("c", "gamma done", 1500)])),
        plan_call(json!([task("d", "delta done", 0)])),
        complete_call(),
        {"content": "SUMMARY: alpha beta gamma delta"}
    ]);
    let body = planner_run(turns, json!({"max_parallel": 3}));
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    assert_eq!(run["mode"], "plan_and_solve");

    let events = app.events(&run_id, 0, T).await;
    assert_gap_free(&events);
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let kinds = types(&events);
    assert_eq!(kinds.last().map(String::as_str), Some("run_completed"));
    let plans: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "plan_created")
        .collect();
    assert_eq!(plans.len(), 2, "{kinds:?}");
    assert_eq!(plans[0]["data"]["round"], 1);
    assert_eq!(plans[0]["data"]["tasks"].as_array().unwrap().len(), 3);
    assert_eq!(plans[1]["data"]["round"], 2);
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "task_completed")
        .collect();
    assert_eq!(completed.len(), 4, "{kinds:?}");
    assert_eq!(completed[0]["data"]["status"], "completed");
    assert_eq!(completed[0]["data"]["output"], "alpha done");
    assert_eq!(
        completed[0]["data"]["run_id"],
        plans[0]["data"]["tasks"][0]["run_id"]
    );
    let rounds: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "round_completed")
        .collect();
    assert_eq!(rounds.len(), 2);
    // Each round's events in their order: created, its tasks' ends, its end.
    let at = |kind: &str, nth: usize| {
        kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| *k == kind)
            .nth(nth)
            .map(|(i, _)| i)
            .unwrap()
    };
    assert!(at("plan_created", 0) < at("task_completed", 0));
    assert!(at("task_completed", 2) < at("round_completed", 0));
    assert!(at("round_completed", 0) < at("plan_created", 1));
    assert!(at("round_completed", 1) < at("run_completed", 0));

    // The output is the summary turn's text, as the planner's last message.
    let messages = app.messages(done["thread_id"].as_str().unwrap()).await;
    let last = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .unwrap();
    assert_eq!(last["body"]["content"], "SUMMARY: alpha beta gamma delta");

    // The planner read every task's result once, as its `plan` calls' results.
    let planner = requests_of(&env, &input);
    assert_eq!(planner.len(), 4, "plan, plan, complete, summary");
    let results = tool_results(planner.last().unwrap());
    assert_eq!(results.len(), 3, "{results:?}");
    for (answer, round) in [
        ("alpha done", 0),
        ("beta done", 0),
        ("gamma done", 0),
        ("delta done", 1),
    ] {
        assert_eq!(results[round].matches(answer).count(), 1, "{results:?}");
    }
    // The planner is offered `plan` and `complete`, the summary turn nothing.
    let offered: Vec<&str> = planner[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["plan", "complete"]);
    assert!(
        planner[3]["tools"].as_array().is_none_or(|t| t.is_empty()),
        "{}",
        planner[3]["tools"]
    );

    // The plan as the API shows it, and each task as a run of its own.
    let view = app.run(&run_id).await;
    let rounds = view["plan"]["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{view}");
    assert_eq!(rounds[0]["tasks"].as_array().unwrap().len(), 3);
    assert!(view["plan"]["task_tokens"].as_i64().unwrap() > 0, "{view}");
    let listed = tasks(&app, &run_id).await;
    assert_eq!(listed.len(), 4);
    assert!(
        listed.iter().all(|t| t["status"] == "completed"),
        "{listed:?}"
    );
    let first = app.run(listed[0]["run_id"].as_str().unwrap()).await;
    assert_eq!(first["parent_run_id"], run_id.as_str());
    assert_eq!(first["task"]["round"], 1);
    assert_eq!(first["task"]["title"], "a");

    // The first round's three tasks ran at once, on both workers.
    let times = |t: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(t[field].as_str().unwrap()).unwrap()
    };
    let latest_start = listed[..3]
        .iter()
        .map(|t| times(t, "started_at"))
        .max()
        .unwrap();
    let first_end = listed[..3]
        .iter()
        .map(|t| times(t, "finished_at"))
        .min()
        .unwrap();
    assert!(
        latest_start < first_end,
        "all three started before any ended"
    );
    let mut workers = Vec::new();
    for t in &listed[..3] {
        let events = app.events(t["run_id"].as_str().unwrap(), 0, T).await;
        // A task's stream is a run's: `run_queued` first, then gap-free to its end.
        assert_gap_free(&events);
        assert_eq!(events[0]["type"], "run_queued", "{events:#?}");
        let started = events.iter().find(|e| e["type"] == "run_started").unwrap();
        workers.push(started["data"]["worker"].as_str().unwrap().to_owned());
    }
    workers.sort();
    workers.dedup();
    assert_eq!(workers.len(), 2, "the round ran on both workers");
}

/// A `plan` call the run cannot start gets the model a tool error it can act on, creates no
/// task, and the planner goes on: no tasks, too many, a wrong shape, and a round past
/// `max_rounds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_plan_calls_get_the_model_a_tool_error() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let one = json!([task("only", "one done", 0)]);
    let turns = json!([
        plan_call(json!([])),
        plan_call(json!([task("a", "x", 0), task("b", "x", 0), task("c", "x", 0)])),
        {"tool_calls": [{"name": "plan", "arguments": {"tasks": "everything"}}]},
        plan_call(one.clone()),
        plan_call(one),
        complete_call(),
        {"content": "the answer"}
    ]);
    let body = planner_run(turns, json!({"max_tasks": 2, "max_rounds": 1}));
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let planner = requests_of(&env, &input);
    assert_eq!(planner.len(), 7);
    let results = tool_results(planner.last().unwrap());
    assert_eq!(results.len(), 6, "{results:?}");
    assert!(results[0].contains("`tasks` is empty"), "{}", results[0]);
    assert!(results[1].contains("at most 2 per round"), "{}", results[1]);
    assert!(
        results[2].contains("`tasks` must be an array"),
        "{}",
        results[2]
    );
    assert!(results[3].contains("one done"), "{}", results[3]);
    assert!(results[4].contains("no round left"), "{}", results[4]);
    assert_eq!(
        tasks(&app, &run_id).await.len(),
        1,
        "only the valid round made a task"
    );
}

/// A plan's tasks are runs of its tenant: a round that would take the tenant past its
/// `max_active_runs` gets the model a tool error naming the limit (nothing is created), and a
/// round that fits goes on. While the planner waits, it and its tasks count as active: the
/// API refuses a create that would pass the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_past_the_tenants_active_runs_limit_gets_the_model_a_tool_error() {
    let env = TestEnv::with(&[("limits.max_active_runs", "3")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let turns = json!([
        plan_call(json!([task("a", "x", 0), task("b", "x", 0), task("c", "x", 0)])),
        plan_call(json!([task("a", "a done", 4000), task("b", "b done", 4000)])),
        complete_call(),
        {"content": "the answer"}
    ]);
    let body = planner_run(turns, json!({"max_tasks": 8}));
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    app.wait_status(&run_id, &["waiting_for_tasks"], T).await;
    // The planner and its two tasks are the limit: one run more is past it.
    let refused = app
        .post(
            "/v1/runs",
            &scripted_run(json!([{"content": "no"}]), json!([])),
        )
        .await;
    assert_eq!(refused.status(), 429);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(
        refused["error"]["code"], "too_many_active_runs",
        "{refused}"
    );

    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let planner = requests_of(&env, &input);
    let results = tool_results(planner.last().unwrap());
    assert!(
        results[0].contains("limit of 3") && results[0].contains("max_active_runs"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("a done") && results[1].contains("b done"),
        "{}",
        results[1]
    );
    assert_eq!(
        tasks(&app, &run_id).await.len(),
        2,
        "only the round that fit"
    );
}

/// A task that asks a question waits like any run while its planner keeps waiting; the answer
/// through the API lets the plan go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_asks_is_answered_through_the_api_and_the_plan_goes_on() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let asking = script(json!([
        {"tool_calls": [{"name": "ask", "arguments": {"text": "Which city?"}}]},
        {"content": "Paris it is"}
    ]));
    let turns = json!([
        plan_call(json!([{"title": "city", "input": asking}])),
        complete_call(),
        {"content": "we go to Paris"}
    ]);
    let run = app.start_run(&planner_run(turns, json!({}))).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let task_id = wait_for("the task to ask", T, || async {
        let listed = tasks(&app, &run_id).await;
        let t = listed.first()?;
        (t["status"] == "waiting_for_input").then(|| t["run_id"].as_str().unwrap().to_owned())
    })
    .await;
    assert_eq!(app.run(&run_id).await["status"], "waiting_for_tasks");
    let resp = app
        .post(
            &format!("/v1/runs/{task_id}/resume"),
            &json!({"input": "Paris"}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(&run_id, 0, T).await;
    let completed = events
        .iter()
        .find(|e| e["type"] == "task_completed")
        .unwrap();
    assert_eq!(completed["data"]["output"], "Paris it is");
}

/// Cancelling the planner cancels its running and waiting tasks in the same transaction; each
/// task's stream ends with `run_cancelled` and its worker stops within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_planner_cancels_its_tasks() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let slow = |t: &str| task(t, "never", 60_000);
    let turns = json!([
        plan_call(json!([slow("a"), slow("b"), slow("c")])),
        complete_call()
    ]);
    let run = app
        .start_run(&planner_run(turns, json!({"max_parallel": 2})))
        .await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    wait_for("two tasks running", T, || async {
        let listed = tasks(&app, &run_id).await;
        let running = listed.iter().filter(|t| t["status"] == "running").count();
        (running == 2 && listed.len() == 3).then_some(())
    })
    .await;
    let listed = tasks(&app, &run_id).await;
    assert_eq!(listed[2]["status"], "waiting_for_slot");
    let resp = app
        .post(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let listed = tasks(&app, &run_id).await;
    assert!(
        listed.iter().all(|t| t["status"] == "cancelled"),
        "{listed:?}"
    );
    for t in &listed {
        let events = app
            .events(t["run_id"].as_str().unwrap(), 0, Duration::from_secs(1))
            .await;
        assert_eq!(
            events.last().map(|e| e["type"].clone()),
            Some(json!("run_cancelled"))
        );
    }
}

/// The tasks' tokens count towards the planner's budget: a planner over it after a round
/// stops before its next model call with `budget_exceeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_over_its_budget_stops_between_rounds() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let costly = script(json!([
        {"content": "expensive", "usage": {"prompt_tokens": 100, "completion_tokens": 10}}
    ]));
    let mut first = plan_call(json!([{"title": "costly", "input": costly}]));
    first["usage"] = json!({"prompt_tokens": 10, "completion_tokens": 5});
    let turns = json!([
        first,
        plan_call(json!([task("more", "x", 0)])),
        complete_call()
    ]);
    let mut body = planner_run(turns, json!({}));
    body["agent"]["max_tokens_total"] = json!(100);
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "budget_exceeded", "{done}");
    assert_eq!(
        requests_of(&env, &input).len(),
        1,
        "no model call after the round"
    );
    assert_eq!(done["plan"]["task_tokens"], 110, "{done}");
    assert_eq!(done["plan"]["total_tokens"], 125, "{done}");
    assert_eq!(tasks(&app, &run_id).await.len(), 1);
}

/// Invalid plan settings are refused with 422 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_plan_settings_are_refused_naming_the_field() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let cases = [
        (json!({"mode": "react", "plan": {}}), "agent.plan"),
        (
            json!({"mode": "plan_and_solve", "plan": {"max_tasks": 0}}),
            "agent.plan.max_tasks",
        ),
        (
            json!({"mode": "plan_and_solve", "plan": {"max_parallel": 100000}}),
            "agent.plan.max_parallel",
        ),
        (
            json!({"mode": "plan_and_solve", "plan": {"max_rounds": 0}}),
            "agent.plan.max_rounds",
        ),
        (
            json!({"mode": "plan_and_solve", "plan": {"executor": {"model": "nope"}}}),
            "agent.plan.executor.model",
        ),
        (
            json!({"mode": "plan_and_solve",
                   "plan": {"executor": {"model": "mock", "mode": "plan_and_solve"}}}),
            "agent.plan.executor.mode",
        ),
        (
            json!({"mode": "plan_and_solve",
                   "plan": {"executor": {"model": "mock", "plan": {}}}}),
            "agent.plan.executor.plan",
        ),
    ];
    for (fields, field) in cases {
        let mut body = scripted_run(json!([]), json!([]));
        for (k, v) in fields.as_object().unwrap() {
            body["agent"][k] = v.clone();
        }
        let resp = app.post("/v1/runs", &body).await;
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 422, "{fields}: {answer}");
        assert!(
            answer.to_string().contains(field),
            "{fields}: {answer} should name {field}"
        );
    }
    // An executor's MCP server must be registered, as the run's own tools' must.
    let mut body = scripted_run(json!([]), json!([]));
    body["agent"]["mode"] = json!("plan_and_solve");
    body["agent"]["plan"] = json!({"executor": {"model": "mock", "tools": [
        {"name": "docs", "kind": "mcp", "server": "unregistered"}]}});
    let resp = app.post("/v1/runs", &body).await;
    assert_eq!(resp.status(), 404);
    let answer: Value = resp.json().await.unwrap();
    assert!(
        answer
            .to_string()
            .contains("agent.plan.executor.tools[0].server"),
        "{answer}"
    );
}

/// What a crash test waits for: the planner completed, with exactly one task per answer,
/// each task's result once in the history the summary turn was sent, the planner claimed
/// exactly `claims` times, and each task's end announced `announced` times (a take-over of
/// the fan-in announces the round again).
async fn completes_with_each_result_once(
    env: &TestEnv,
    app: &TestApp,
    run_id: &str,
    input: &str,
    answers: &[&str],
    claims: i64,
    announced: usize,
) {
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (tasks, rounds): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT plan_round) FROM runs WHERE parent_run_id = $1::uuid",
    )
    .bind(run_id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        (tasks, rounds),
        (answers.len() as i64, 1),
        "no task created twice"
    );
    assert_eq!(
        done["attempt"], claims,
        "the planner resumed once per round"
    );
    let planner = requests_of(env, input);
    assert_eq!(planner.len(), 3, "plan, complete, summary");
    let results = tool_results(planner.last().unwrap());
    assert_eq!(
        results.len(),
        2,
        "the plan's result and complete's: {results:?}"
    );
    for answer in answers {
        assert_eq!(results[0].matches(answer).count(), 1, "{results:?}");
    }
    let events = app.events(run_id, 0, T).await;
    let ended: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "task_completed")
        .collect();
    assert_eq!(
        ended.len(),
        answers.len() * announced,
        "{:?}",
        types(&events)
    );
}

/// Starts the planner `body` and waits for the `crashing` worker to exit at its failpoint
/// (`what`): the run's id and input.
async fn start_until_the_crash(
    app: &TestApp,
    crashing: ChildProcess,
    body: &Value,
    what: &str,
) -> (String, String) {
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let crashing = std::sync::Mutex::new(crashing);
    wait_for(what, T, || {
        let exited = crashing.lock().unwrap().has_exited();
        async move { exited.then_some(()) }
    })
    .await;
    (run_id, input)
}

/// A worker killed right after the planner's round committed (before anything was announced
/// or dispatched): the tasks are dispatched by another worker's sweeper, each is created and
/// run once, and the planner resumes once, with every result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_the_plan_commit_loses_nothing() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let crashing = env.spawn_worker_process_with_failpoints(&[], "plan:after_commit");
    let answers = ["alpha done", "beta done", "gamma done"];
    let turns = json!([
        plan_call(json!([task("a", answers[0], 0), task("b", answers[1], 0),
                          task("c", answers[2], 0)])),
        complete_call(),
        {"content": "summary"}
    ]);
    let body = planner_run(turns, json!({}));
    let (run_id, input) = start_until_the_crash(
        &app,
        crashing,
        &body,
        "the worker to crash at the failpoint",
    )
    .await;
    assert_eq!(app.run(&run_id).await["status"], "waiting_for_tasks");
    assert_eq!(tasks(&app, &run_id).await.len(), 3);
    let _healthy = env.spawn_worker_process(&[]);
    completes_with_each_result_once(&env, &app, &run_id, &input, &answers, 2, 1).await;
}

/// A worker killed while it holds the round's tasks: mid tool call in one task (the failpoint),
/// the others ended or in flight. Another worker takes the unfinished ones over when their
/// leases expire; the planner resumes once, after the last of them, with every result once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_of_the_worker_holding_the_tasks_loses_no_result() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let crashing = env.spawn_worker_process_with_failpoints(&[], "tool:probe");
    let probing = script(json!([
        {"tool_calls": [{"name": "probe", "arguments": {"q": 1}}]},
        {"content": "probe done"}
    ]));
    let answers = ["probe done", "beta done", "gamma done"];
    let turns = json!([
        plan_call(json!([{"title": "probe", "input": probing}, task("b", answers[1], 300),
                          task("c", answers[2], 3000)])),
        complete_call(),
        {"content": "summary"}
    ]);
    let mut body = planner_run(turns, json!({}));
    // The tasks run the run's own agent without the plan: with this tool.
    body["agent"]["tools"] = json!([http_tool(&env, "probe", "/echo")]);
    let (run_id, input) = start_until_the_crash(
        &app,
        crashing,
        &body,
        "the worker to crash in the task's tool call",
    )
    .await;
    assert_eq!(app.run(&run_id).await["status"], "waiting_for_tasks");
    let _healthy = env.spawn_worker_process(&[]);
    completes_with_each_result_once(&env, &app, &run_id, &input, &answers, 2, 1).await;
    let probed = tasks(&app, &run_id).await;
    let probe = app.run(probed[0]["run_id"].as_str().unwrap()).await;
    assert!(
        probe["attempt"].as_i64().unwrap() >= 2,
        "the probing task was taken over: {probe}"
    );
}

/// A worker killed right after the end of a round's last task committed (which made the
/// planner runnable), before it published or dispatched anything: another worker's sweeper
/// sends the planner on, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_last_tasks_end_and_the_planners_dispatch_is_healed() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let crashing = env.spawn_worker_process_with_failpoints(&[], "task:before_publish");
    let answers = ["only done"];
    let turns = json!([
        plan_call(json!([task("only", answers[0], 0)])),
        complete_call(),
        {"content": "summary"}
    ]);
    let body = planner_run(turns, json!({}));
    let (run_id, input) = start_until_the_crash(
        &app,
        crashing,
        &body,
        "the worker to crash after the task's end",
    )
    .await;
    assert_eq!(app.run(&run_id).await["status"], "queued");
    let _healthy = env.spawn_worker_process(&[]);
    completes_with_each_result_once(&env, &app, &run_id, &input, &answers, 2, 1).await;
}

/// A planner in a batch keeps its batch open while it waits for its tasks; the batch finishes
/// once the planner completes, and its result is the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_not_finished_while_its_planner_waits_for_tasks() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let turns = json!([
        plan_call(json!([task("slow", "slow done", 3000)])),
        complete_call(),
        {"content": "the batch's answer"}
    ]);
    let resp = app
        .post(
            "/v1/runs/batch",
            &json!({"runs": [planner_run(turns, json!({}))]}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let created: Value = resp.json().await.unwrap();
    let batch_id = created["batch_id"].as_str().unwrap().to_owned();
    let run_id = created["runs"][0]["id"].as_str().unwrap().to_owned();
    app.wait_status(&run_id, &["waiting_for_tasks"], T).await;
    // Past a batch sweep (every second) while the planner waits.
    let waiting_since = std::time::Instant::now();
    let batch = wait_for("a sweep while the planner waits", T, || async {
        let batch: Value = app
            .get(&format!("/v1/batches/{batch_id}"))
            .await
            .json()
            .await
            .ok()?;
        (waiting_since.elapsed() > Duration::from_millis(1500)).then_some(batch)
    })
    .await;
    if app.run(&run_id).await["status"] == "waiting_for_tasks" {
        assert_eq!(batch["status"], "in_progress", "{batch}");
        assert_eq!(batch["counts"]["running"], 1, "{batch}");
    }
    let done = wait_for("the batch to finish", T, || async {
        let batch: Value = app
            .get(&format!("/v1/batches/{batch_id}"))
            .await
            .json()
            .await
            .ok()?;
        (batch["status"] == "completed").then_some(batch)
    })
    .await;
    assert_eq!(done["counts"]["completed"], 1, "{done}");
    assert_eq!(app.run(&run_id).await["status"], "completed");
    let results = app
        .get(&format!("/v1/batches/{batch_id}/results"))
        .await
        .text()
        .await
        .unwrap();
    assert!(results.contains("the batch's answer"), "{results}");
}

/// The round's results reach the planner within `worker.max_tool_result_bytes`: long outputs
/// are cut, each to its share, and marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rounds_results_are_bounded_by_the_tool_result_limit() {
    let env = TestEnv::with(&[("worker.max_tool_result_bytes", "1000")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let long = "x".repeat(2000);
    let turns = json!([
        plan_call(json!([task("a", &long, 0), task("b", "short", 0), task("c", &long, 0)])),
        complete_call(),
        {"content": "done"}
    ]);
    let body = planner_run(turns, json!({}));
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let planner = requests_of(&env, &input);
    let result = &tool_results(planner.last().unwrap())[0];
    assert!(result.len() <= 1000, "{} bytes", result.len());
    let parsed: Value = serde_json::from_str(result).unwrap();
    let tasks = parsed["tasks"].as_array().unwrap();
    assert_eq!(tasks[1]["output"], "short");
    assert_eq!(tasks[0]["truncated"], true);
    assert!(tasks[0]["output"].as_str().unwrap().len() > 100, "{result}");
}

/// A worker killed while the planner takes its round up (the round's ends announced, the
/// `plan` call's result not yet recorded): another worker takes the planner over when its lease
/// expires and does the fan-in again; the history holds each result once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_the_fan_in_is_redone_by_the_next_holder() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let crashing = env.spawn_worker_process_with_failpoints(&[], "plan:before_result");
    let answers = ["alpha done", "beta done"];
    let turns = json!([
        plan_call(json!([task("a", answers[0], 0), task("b", answers[1], 0)])),
        complete_call(),
        {"content": "summary"}
    ]);
    let body = planner_run(turns, json!({}));
    let (run_id, input) =
        start_until_the_crash(&app, crashing, &body, "the worker to crash in the fan-in").await;
    assert_eq!(app.run(&run_id).await["status"], "running");
    let _healthy = env.spawn_worker_process(&[]);
    completes_with_each_result_once(&env, &app, &run_id, &input, &answers, 3, 2).await;
}

/// Without the fair share (no run is `fair`), the planner publishes its round's tasks itself,
/// each end publishes the round's next waiting task and, at the last, the planner: a round of
/// three tasks one at a time completes in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fair_share_tasks_and_planner_are_published_by_their_enders() {
    let env = TestEnv::with(&[("fair_share.window_per_slot", "0")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let turns = json!([
        plan_call(json!([task("a", "one", 0), task("b", "two", 0), task("c", "three", 0)])),
        complete_call(),
        {"content": "done"}
    ]);
    let run = app
        .start_run(&planner_run(turns, json!({"max_parallel": 1})))
        .await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (fair,): (bool,) = sqlx::query_as("SELECT fair FROM runs WHERE id = $1::uuid")
        .bind(&run_id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(!fair, "the planner is not fair: its enders publish");
    let listed = tasks(&app, &run_id).await;
    assert!(
        listed.iter().all(|t| t["status"] == "completed"),
        "{listed:?}"
    );
    // One at a time, in task order.
    let at = |t: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(t[field].as_str().unwrap()).unwrap()
    };
    for pair in listed.windows(2) {
        assert!(
            at(&pair[0], "finished_at") <= at(&pair[1], "started_at"),
            "{listed:?}"
        );
    }
}

/// A planner on a model without native tool calls (`tool_calling = "xml"`): it is offered
/// `plan` and `complete` in its system prompt, its XML `plan` call starts the round, and the
/// summary turn reads the history as XML too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_on_an_xml_mode_model() {
    let env = TestEnv::new().await;
    let url = env.llm.base_url();
    let models = [
        ("models.mockx.base_url", url.as_str()),
        ("models.mockx.model", "mock-x"),
        ("models.mockx.tool_calling", "xml"),
    ];
    let app = env.spawn_api_with(&models).await;
    let _worker = env.spawn_worker_with(&models).await;
    let tasks = json!([{"title": "a", "input": script(json!([{"content": "alpha done"}]))}]);
    let plan = format!(
        "<function_calls>\n<invoke name=\"plan\">\n<parameter name=\"tasks\">{tasks}</parameter>\n\
         </invoke>\n</function_calls>"
    );
    let complete = "<function_calls>\n<invoke name=\"complete\">\n\
        <parameter name=\"summary\">done</parameter>\n</invoke>\n</function_calls>";
    let turns = json!([{"content": plan}, {"content": complete}, {"content": "the answer"}]);
    let mut body = planner_run(turns, json!({}));
    body["agent"]["model"] = json!("mockx");
    let input = body["input"].as_str().unwrap().to_owned();
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let planner = requests_of(&env, &input);
    assert_eq!(planner.len(), 3);
    let system = planner[0]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("- plan:"), "{system}");
    let last = planner[2]["messages"].to_string();
    assert!(last.contains("alpha done"), "{last}");
    assert!(
        !planner[2]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool"),
        "the summary turn's history is rendered as XML"
    );
}

/// A task's webhooks fire as any run's, and name its planner and its place in the plan; the
/// planner's own carry neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_webhooks_name_its_planner_and_its_place_in_the_plan() {
    let receiver = Receiver::start(0).await;
    let env = TestEnv::with(&[("webhooks.poll_interval_ms", "200")]).await;
    let allow = format!("{},{}", env.tools.addr(), receiver.addr);
    let app = env.spawn_api_with(&[("egress.allow", &allow)]).await;
    let resp = app
        .post(
            "/v1/webhooks",
            &json!({"url": receiver.url(), "events": ["run.completed"]}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let hook: Value = resp.json().await.unwrap();
    receiver.trust(hook["secret"].as_str().unwrap());
    let _worker = env.spawn_worker_process(&[]);
    let turns = json!([
        plan_call(json!([task("first", "one", 0), task("second", "two", 0)])),
        complete_call(),
        {"content": "the answer"}
    ]);
    let run = app.start_run(&planner_run(turns, json!({}))).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let got = wait_for("three run.completed deliveries", T, || async {
        let got = receiver.acknowledged();
        (got.len() >= 3).then_some(got)
    })
    .await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|h| h.signed), "{got:?}");
    let mut tasks: Vec<(u64, String)> = got
        .iter()
        .filter(|h| h.body["data"]["run_id"] != run_id.as_str())
        .map(|h| {
            let data = &h.body["data"];
            assert_eq!(data["parent_run_id"], run_id.as_str(), "{data}");
            assert_eq!(data["task"]["round"], 1, "{data}");
            (
                data["task"]["task_index"].as_u64().unwrap(),
                data["task"]["title"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    tasks.sort();
    assert_eq!(tasks, [(0, "first".to_owned()), (1, "second".to_owned())]);
    let planner = got
        .iter()
        .find(|h| h.body["data"]["run_id"] == run_id.as_str())
        .expect("the planner's run.completed");
    assert!(
        planner.body["data"].get("parent_run_id").is_none(),
        "{:?}",
        planner.body
    );
    assert!(
        planner.body["data"].get("task").is_none(),
        "{:?}",
        planner.body
    );
}

/// The round's commit ends the planner's lease: a lease renewal that comes after it (the
/// holder held back past one by a failpoint) does not stop the holding before it announced
/// the round. The planner's stream is gap-free with its `plan_created`. (The task outlasts
/// the hold: a round that ends before its holder announced it is the documented limit of a
/// holder stalled or killed there.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_after_the_rounds_commit_does_not_cut_its_announcement() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // Renewals every 500 ms (the test settings): a 1.5 s hold spans at least two.
    let _worker = env.spawn_worker_process_with_failpoints(&[], "delay:plan:after_commit@1500");
    let turns = json!([
        plan_call(json!([task("a", "a done", 4000)])),
        complete_call(),
        {"content": "the answer"}
    ]);
    let run = app.start_run(&planner_run(turns, json!({}))).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.events(&run_id, 0, T).await;
    assert_gap_free(&events);
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(kinds.contains(&"plan_created"), "{kinds:?}");
    assert!(!kinds.contains(&"stream_rebuilt"), "{kinds:?}");
}
