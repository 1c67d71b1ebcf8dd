//! Usage and budgets: tokens and tool calls per run and per tenant-day, `GET /v1/usage`, and
//! runs stopped between iterations with `budget_exceeded` (or paused, with
//! `worker.on_budget_exceeded = "pause"`).

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(30);

fn usage(prompt: i64, completion: i64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion})
}

/// A turn that calls the `echo` tool and reports `usage`.
fn echo_turn(word: &str, usage: Value) -> Value {
    json!({"tool_calls": [{"name": "echo", "arguments": {"word": word}}], "usage": usage})
}

async fn set_tenant_limits(env: &TestEnv, tenant: Uuid, limits: Value) {
    sqlx::query("UPDATE tenants SET limits = $2 WHERE id = $1")
        .bind(tenant)
        .bind(limits)
        .execute(&env.pool)
        .await
        .unwrap();
}

/// Statuses of the run's tool calls, in order.
async fn call_statuses(env: &TestEnv, run_id: &str) -> Vec<String> {
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT status FROM tool_calls WHERE run_id = $1 ORDER BY iteration, position",
    )
    .bind(Uuid::parse_str(run_id).unwrap())
    .fetch_all(&env.pool)
    .await
    .unwrap();
    rows.into_iter().map(|(s,)| s).collect()
}

async fn usage_report(app: &TestApp, key: &str, query: &str) -> Value {
    let resp = app.get_as(&format!("/v1/usage{query}"), key).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_usage_is_recorded_per_run_and_summed_per_tenant_day() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let tools = json!([http_tool(&env, "echo", "/echo")]);
    let a = app
        .start_run(&scripted_run(
            json!([echo_turn("one", usage(100, 10)), {"content": "done", "usage": usage(120, 5)}]),
            tools.clone(),
        ))
        .await;
    let b = app
        .start_run(&scripted_run(
            json!([{"content": "hi", "usage": usage(7, 3)}]),
            json!([]),
        ))
        .await;
    let a = app
        .wait_status(a["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    let b = app
        .wait_status(b["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(
        (&a["status"], &b["status"]),
        (&json!("completed"), &json!("completed"))
    );
    assert_eq!(
        a["usage"],
        json!({"prompt_tokens": 220, "completion_tokens": 15, "total_tokens": 235,
               "estimated_tokens": 0, "estimated": false, "tool_calls": 1})
    );
    assert_eq!(b["usage"]["total_tokens"], 10);

    let today = chrono::Utc::now().date_naive().to_string();
    let report = usage_report(&app, &app.api_key, "").await;
    let expected = json!({"prompt_tokens": 227, "completion_tokens": 18, "total_tokens": 245,
                          "estimated_tokens": 0, "tool_calls": 1, "runs": 2});
    assert_eq!(report["total"], expected, "{report}");
    let days = report["days"].as_array().unwrap();
    assert_eq!(days.len(), 1, "{report}");
    assert_eq!(days[0]["day"], today);
    assert_eq!(days[0]["runs"], 2);
    // The day asked for alone answers the same figures.
    let one = usage_report(&app, &app.api_key, &format!("?from={today}&to={today}")).await;
    assert_eq!((&one["from"], &one["to"]), (&json!(today), &json!(today)));
    assert_eq!(one["total"], expected);

    // Another tenant sees only its own (nothing).
    let other = env.new_tenant_key().await;
    let report = usage_report(&app, &other, "").await;
    assert_eq!(report["days"], json!([]));
    assert_eq!(
        report["total"],
        json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
               "estimated_tokens": 0, "tool_calls": 0, "runs": 0})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_from_the_provider_an_estimate_is_recorded_and_marked() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(
            json!([{"content": "The answer is forty-two.", "usage": false}]),
            json!([]),
        ))
        .await;
    let run_id = run["id"].as_str().unwrap();
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let u = &done["usage"];
    assert_eq!(u["estimated"], true, "{u}");
    let total = u["total_tokens"].as_i64().unwrap();
    assert!(u["prompt_tokens"].as_i64().unwrap() > 0, "{u}");
    assert!(u["completion_tokens"].as_i64().unwrap() > 0, "{u}");
    assert_eq!(
        u["estimated_tokens"].as_i64().unwrap(),
        total,
        "all estimated"
    );
    let report = usage_report(&app, &app.api_key, "").await;
    assert_eq!(report["total"]["estimated_tokens"], total);
    assert_eq!(report["total"]["total_tokens"], total);
    // The event says so too.
    let events = app.events(run_id, 0, T).await;
    let completed = events
        .iter()
        .find(|e| e["type"] == "message_completed")
        .expect("message_completed");
    assert_eq!(completed["data"]["usage"]["estimated"], true, "{completed}");
}

/// A hostile provider's figures are bounded: a negative one counts 0, an absurd one is clamped
/// to a billion per call (so no sum can overflow), and neither fails the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_usage_from_a_provider_is_bounded() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(
            json!([{"content": "ok", "usage": {"prompt_tokens": -40, "completion_tokens": 1e300}}]),
            json!([]),
        ))
        .await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        (
            &done["usage"]["prompt_tokens"],
            &done["usage"]["completion_tokens"]
        ),
        (&json!(0), &json!(1_000_000_000))
    );
    assert_eq!(done["usage"]["estimated"], false);
    let events = app.events(run["id"].as_str().unwrap(), 0, T).await;
    let completed = events
        .iter()
        .find(|e| e["type"] == "message_completed")
        .expect("message_completed");
    assert_eq!(
        completed["data"]["usage"]["completion_tokens"], 1_000_000_000,
        "announced as recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_daily_budget_has_its_run_failed_between_iterations() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let tools = json!([http_tool(&env, "echo", "/echo")]);
    // 120 tokens spent today before the budget is set.
    let first = app
        .start_run(&scripted_run(
            json!([{"content": "warm-up", "usage": usage(100, 20)}]),
            json!([]),
        ))
        .await;
    let first_id = first["id"].as_str().unwrap();
    app.wait_status(first_id, &["completed"], T).await;
    set_tenant_limits(&env, app.tenant_id, json!({"tokens_per_day": 300})).await;
    assert_eq!(env.llm.request_count(), 1);

    // 120 + 160 = 280: under 300, so a second model call; 280 + 55 = 335 crosses it: that
    // turn's call still runs, and the third model call never happens.
    let run = app
        .start_run(&scripted_run(
            json!([echo_turn("a", usage(150, 10)), echo_turn("b", usage(50, 5)),
                   {"content": "never asked for"}]),
            tools.clone(),
        ))
        .await;
    let run_id = run["id"].as_str().unwrap();
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "budget_exceeded", "{done}");
    let message = done["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("335") && message.contains("tokens_per_day (300)"),
        "{message}"
    );
    assert_eq!(done["iteration"], 2);
    assert_eq!(env.llm.request_count(), 3, "two model calls for this run");
    assert_eq!(
        call_statuses(&env, run_id).await,
        ["succeeded", "succeeded"],
        "the crossing turn's call finished; nothing left running"
    );
    assert_eq!(env.tools.calls_to("/echo").len(), 2);
    let events = app.events(run_id, 0, T).await;
    let failed = events.last().unwrap();
    assert_eq!(failed["type"], "run_failed", "{failed}");
    assert_eq!(failed["data"]["code"], "budget_exceeded");

    // Over budget now: the next run of the tenant fails before any model call.
    let next = app
        .start_run(&scripted_run(json!([{"content": "no"}]), json!([])))
        .await;
    let next = app
        .wait_status(next["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(next["error"]["code"], "budget_exceeded", "{next}");
    assert_eq!(next["iteration"], 0);
    assert_eq!(env.llm.request_count(), 3);

    // Another tenant is not held to this one's budget.
    let other = env.new_tenant_key().await;
    let resp = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(&other)
        .json(&scripted_run(
            json!([{"content": "fine", "usage": usage(500, 500)}]),
            json!([]),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let theirs: Value = resp.json().await.unwrap();
    let theirs_id = theirs["id"].as_str().unwrap();
    let theirs = wait_for("the other tenant's run", T, || async {
        let r: Value = app
            .get_as(&format!("/v1/runs/{theirs_id}"), &other)
            .await
            .json()
            .await
            .unwrap();
        (r["status"] == "completed" || r["status"] == "failed").then_some(r)
    })
    .await;
    assert_eq!(theirs["status"], "completed", "{theirs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pause_configured_a_tenant_over_budget_waits_for_input_until_raised() {
    let env = TestEnv::with(&[("worker.on_budget_exceeded", "pause")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    set_tenant_limits(&env, app.tenant_id, json!({"tokens_per_day": 100})).await;
    // The first turn spends 160 of 100: its call still runs, the second model call waits.
    let run = app
        .start_run(&scripted_run(
            json!([echo_turn("a", usage(150, 10)), {"content": "done after the raise"}]),
            json!([http_tool(&env, "echo", "/echo")]),
        ))
        .await;
    let run_id = run["id"].as_str().unwrap();
    let first_part = app.events(run_id, 0, T).await; // ends at the pausing event
    let paused = first_part.last().unwrap();
    assert_eq!(paused["type"], "input_required", "{paused}");
    assert_eq!(paused["data"]["kind"], "budget");
    assert_eq!(paused["data"]["budget"], "tenant");
    assert_eq!(
        (&paused["data"]["used"], &paused["data"]["limit"]),
        (&json!(160), &json!(100))
    );
    assert!(paused["data"]["tool_call_id"].is_null());
    let waiting = app.wait_status(run_id, &["waiting_for_input"], T).await;
    let pending = &waiting["pending"];
    assert_eq!(pending["kind"], "budget", "{waiting}");
    assert_eq!(
        (&pending["used"], &pending["limit"]),
        (&json!(160), &json!(100))
    );
    let question = pending["question"].as_str().unwrap();
    assert!(
        question.contains("tokens_per_day") && question.contains("/resume"),
        "{question}"
    );
    assert_eq!(env.llm.request_count(), 1, "one model call, then the pause");
    assert_eq!(
        call_statuses(&env, run_id).await,
        ["succeeded"],
        "the crossing turn's call finished; nothing left running"
    );

    // Still over budget: the resume pauses again, without a model call.
    let path = format!("/v1/runs/{run_id}/resume");
    let resp = app.post(&path, &json!({"input": "go on"})).await;
    assert_eq!(resp.status(), 202);
    let last_seen = paused["id"].as_u64().unwrap();
    let second_part = app.events(run_id, last_seen, T).await;
    let kinds: Vec<&str> = second_part
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["run_resumed", "run_started", "input_required"]);
    assert_eq!(second_part[0]["data"]["kind"], "budget");
    assert_eq!(second_part[2]["data"]["kind"], "budget");
    let waiting = app.wait_status(run_id, &["waiting_for_input"], T).await;
    assert_eq!(waiting["pending"]["kind"], "budget", "{waiting}");
    assert_eq!(waiting["iteration"], 1);
    assert_eq!(
        env.llm.request_count(),
        1,
        "no model call while over budget"
    );

    // The operator raises the tenant's budget: the next resume completes the run.
    sqlx::query(
        "UPDATE tenants SET limits = limits || '{\"tokens_per_day\": 100000}'::jsonb WHERE id = $1",
    )
    .bind(app.tenant_id)
    .execute(&env.pool)
    .await
    .unwrap();
    let resp = app.post(&path, &json!({"input": "continue"})).await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["pending"].is_null());
    assert_eq!(env.llm.request_count(), 2);
    let all = app.events(run_id, 0, T).await;
    assert_gap_free(&all);
    assert_eq!(all.last().unwrap()["type"], "run_completed");
    // Both inputs reached the model as user messages after the settled tool call.
    let reqs = env.llm.requests();
    let last = reqs.last().unwrap()["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = last.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "user", "user"]
    );
    assert_eq!(
        (&last[4]["content"], &last[5]["content"]),
        (&json!("go on"), &json!("continue"))
    );
}

/// Under fair dispatch a budget pause frees the tenant's running slot like any pause: with a
/// running limit of 1, the second run starts once the first pauses (and pauses at once, before
/// any model call); after the raise, both resumes are dispatched and complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_pause_frees_the_tenants_running_slot() {
    let env = TestEnv::with(&[
        ("worker.on_budget_exceeded", "pause"),
        ("limits.max_running_runs", "1"),
    ])
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    set_tenant_limits(&env, app.tenant_id, json!({"tokens_per_day": 100})).await;
    let tools = json!([http_tool(&env, "echo", "/echo")]);
    let script = json!([echo_turn("a", usage(150, 10)), {"content": "done"}]);
    let first = app
        .start_run(&scripted_run(script.clone(), tools.clone()))
        .await;
    let second = app.start_run(&scripted_run(script, tools)).await;
    let ids = [
        first["id"].as_str().unwrap(),
        second["id"].as_str().unwrap(),
    ];
    let (fair,): (bool,) = sqlx::query_as("SELECT bool_and(fair) FROM runs WHERE tenant_id = $1")
        .bind(app.tenant_id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(fair, "both runs go through fair dispatch");
    for id in ids {
        let waiting = app.wait_status(id, &["waiting_for_input"], T).await;
        assert_eq!(waiting["pending"]["kind"], "budget", "{waiting}");
    }
    assert_eq!(
        env.llm.request_count(),
        1,
        "the second run paused before its model call"
    );

    set_tenant_limits(&env, app.tenant_id, json!({"tokens_per_day": 100000})).await;
    for id in ids {
        let resp = app
            .post(&format!("/v1/runs/{id}/resume"), &json!({"input": "go on"}))
            .await;
        assert_eq!(resp.status(), 202);
    }
    for id in ids {
        let done = app.wait_status(id, &["completed", "failed"], T).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pause_configured_a_run_over_its_own_budget_still_fails() {
    let env = TestEnv::with(&[("worker.on_budget_exceeded", "pause")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut body = scripted_run(
        json!([echo_turn("a", usage(60, 50)), {"content": "never asked for"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    body["agent"]["max_tokens_total"] = json!(100);
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap();
    let done = app
        .wait_status(run_id, &["completed", "failed", "waiting_for_input"], T)
        .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "budget_exceeded", "{done}");
    assert_eq!(env.llm.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_its_own_budget_fails_between_iterations() {
    // The configured daily default applies to every tenant without its own; this one is far.
    let env = TestEnv::with(&[("limits.tokens_per_day", "1000000")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let mut body = scripted_run(
        json!([echo_turn("a", usage(60, 10)), echo_turn("b", usage(30, 5)),
               {"content": "never asked for"}]),
        json!([http_tool(&env, "echo", "/echo")]),
    );
    body["agent"]["max_tokens_total"] = json!(100);
    let run = app.start_run(&body).await;
    assert_eq!(run["agent"]["max_tokens_total"], 100);
    let run_id = run["id"].as_str().unwrap();
    let done = app.wait_status(run_id, &["completed", "failed"], T).await;
    assert_eq!(done["error"]["code"], "budget_exceeded", "{done}");
    let message = done["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("105") && message.contains("agent.max_tokens_total (100)"),
        "{message}"
    );
    assert_eq!(env.llm.request_count(), 2);
    assert_eq!(
        call_statuses(&env, run_id).await,
        ["succeeded", "succeeded"]
    );
    assert_eq!(done["usage"]["total_tokens"], 105);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_queries_and_budgets_answer_422_naming_the_field() {
    let env = TestEnv::with(&[("api.max_tokens_total", "5000")]).await;
    let app = env.spawn_api().await;
    for (query, field) in [
        ("?from=2026-13-01", "from: "),
        ("?from=2026-1-01", "from: "),
        ("?to=yesterday", "to: "),
        ("?since=2026-03-01", "query: "),
    ] {
        let resp = app.get(&format!("/v1/usage{query}")).await;
        assert_eq!(resp.status(), 422, "{query}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{query}: {message}");
    }
    // Any two well-formed days are a question with an answer: `from` after `to` covers no day,
    // a range over `api.max_usage_days` is cut to its last days.
    let resp = app.get("/v1/usage?from=2026-03-02&to=2026-03-01").await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["days"], json!([]));
    let resp = app.get("/v1/usage?from=2020-01-01&to=2026-03-01").await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        (body["from"].clone(), body["to"].clone()),
        (json!("2025-03-01"), json!("2026-03-01"))
    );
    for bad in [json!(0), json!(-5), json!(5001)] {
        let mut body = scripted_run(json!([{"content": "x"}]), json!([]));
        body["agent"]["max_tokens_total"] = bad.clone();
        let resp = app.post("/v1/runs", &body).await;
        assert_eq!(resp.status(), 422, "{bad}");
        let body: Value = resp.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("agent.max_tokens_total: "),
            "{bad}: {message}"
        );
    }
    let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(runs, 0, "nothing written");
}
