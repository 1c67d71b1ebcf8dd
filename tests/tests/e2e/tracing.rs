//! One trace per run: the API and two worker processes export to an in-process OTLP/HTTP
//! collector, and the span tree of a run that calls a model and a tool, pauses for a
//! confirmation, is resumed under another trace and finishes on another worker is checked.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::json;
use uuid::Uuid;

use agentfleet_tests::harness::*;
use agentfleet_tests::otlp_collector::{CollectedSpan, Collector};

const T: Duration = Duration::from_secs(30);

/// A fresh W3C context: (trace id, span id, `traceparent`), sampled.
fn caller_context() -> (String, String, String) {
    let trace = Uuid::new_v4().simple().to_string();
    let span = Uuid::new_v4().simple().to_string()[..16].to_owned();
    let header = format!("00-{trace}-{span}-01");
    (trace, span, header)
}

/// (trace id, parent id) of a `traceparent`.
fn ids_of(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn named<'a>(spans: &'a [CollectedSpan], name: &str) -> Vec<&'a CollectedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn request<'a>(spans: &'a [CollectedSpan], method: &str, route: &str) -> Vec<&'a CollectedSpan> {
    spans
        .iter()
        .filter(|s| {
            s.attr("http.request.method") == Some(method) && s.attr("http.route") == Some(route)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_trace_across_a_pause_a_resume_and_two_workers() {
    let env = TestEnv::new().await;
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let (_api, base) = env
        .spawn_api_process(&[
            ("AGENTFLEET__TELEMETRY__OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .await;
    // No sweeper re-publish may overtake a message (a slow start on a loaded machine): each
    // attempt is then delivered by the message whose link the test checks. A long lease: a
    // worker starved past the test lease (3 s) would lose the run to a recovery, a third
    // attempt this test does not expect.
    let worker_settings = [
        ("telemetry.otlp_endpoint", endpoint.as_str()),
        ("worker.requeue_after_ms", "60000"),
        ("worker.lease_ms", "30000"),
        ("worker.lease_renew_ms", "2000"),
    ];
    // Worker A exports only when it stops: its spans arrive through the flush at shutdown.
    let mut worker_a =
        env.spawn_worker_process_env(&worker_settings, &[("OTEL_BSP_SCHEDULE_DELAY", "3600000")]);
    let (trace, caller_span, traceparent) = caller_context();
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", HeaderValue::from_str(&traceparent).unwrap());
    // Every request of this caller (the submission, the polling) carries its context.
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let app = env.app_at(&base, http).await;

    // A malformed `traceparent` is ignored: the request succeeds and its span starts a trace.
    let garbage = app
        .http
        .get(app.url("/v1/usage"))
        .bearer_auth(&app.api_key)
        .header("traceparent", "00-not-a-trace-context")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 200);

    let mut transfer = http_tool(&env, "transfer", "/side-effect");
    transfer["risk"] = json!("high");
    let body = scripted_run(
        json!([
            {"tool_calls": [{"name": "lookup", "arguments": {"q": "rates"}}],
             "usage": {"prompt_tokens": 11, "completion_tokens": 7}},
            {"tool_calls": [{"name": "transfer", "arguments": {"amount": 10}}]},
            {"content": "transferred"}
        ]),
        json!([http_tool(&env, "lookup", "/echo"), transfer]),
    );
    let run = app.start_run(&body).await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    let waiting = app
        .wait_status(&run_id, &["waiting_for_confirmation"], T)
        .await;
    let call_id = waiting["pending"]["tool_calls"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    worker_a.signal("TERM");
    assert_eq!(worker_a.wait_exit(T).await, Some(0), "worker A drained");
    let _worker_b =
        env.spawn_worker_process_env(&worker_settings, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);

    // The resume comes from another caller, in a trace of its own.
    let (resume_trace, resume_span, resume_traceparent) = caller_context();
    let resumed = app
        .http
        .post(app.url(&format!("/v1/runs/{run_id}/resume")))
        .bearer_auth(&app.api_key)
        .header("traceparent", &resume_traceparent)
        .json(&json!({"decisions": [{"tool_call_id": call_id, "approve": true}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 202);
    let done = app.wait_status(&run_id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");

    let spans = wait_until("the run's spans at the collector", T, || {
        let spans = collector.spans();
        let counts = (
            named(&spans, "run.attempt").len(),
            named(&spans, "run.iteration").len(),
            named(&spans, "model.call").len(),
            named(&spans, "tool.call").len(),
            request(&spans, "POST", "/v1/runs/{id}/resume").len(),
        );
        let arrived = counts.0 == 2 && counts.1 == 4 && counts.2 == 3 && counts.3 == 2;
        let seen = format!(
            "(attempts, iterations, model calls, tool calls, resume requests) = {counts:?} of {} spans",
            spans.len()
        );
        async move {
            if arrived && counts.4 > 0 {
                Ok(spans)
            } else {
                Err(seen)
            }
        }
    })
    .await;
    let by_id: HashMap<&str, &CollectedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let parent = |s: &CollectedSpan| -> &CollectedSpan {
        by_id
            .get(s.parent_span_id.as_str())
            .unwrap_or_else(|| panic!("the parent of {s:?} was not exported"))
    };

    // The malformed header started a trace of its own.
    let usage = request(&spans, "GET", "/v1/usage");
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert_eq!(usage[0].parent_span_id, "", "{:?}", usage[0]);
    assert_ne!(usage[0].trace_id, trace);

    // The API's request span is the child of the caller's span; the enqueue is its child.
    let create = request(&spans, "POST", "/v1/runs");
    assert_eq!(create.len(), 1, "{create:?}");
    let create = create[0];
    assert_eq!(create.trace_id, trace);
    assert_eq!(create.parent_span_id, caller_span);
    assert_eq!(create.name, "POST /v1/runs");
    assert_eq!(create.attr("http.response.status_code"), Some("202"));
    assert_eq!(create.service, "agentfleet-api");
    let publish: Vec<_> = named(&spans, "queue.publish")
        .into_iter()
        .filter(|s| s.parent_span_id == create.span_id)
        .collect();
    assert_eq!(publish.len(), 1, "one publish under the creating request");
    // Postgres holds the run's root context (the creating request's span).
    let (stored,): (Option<String>,) = sqlx::query_as("SELECT traceparent FROM runs WHERE id = $1")
        .bind(Uuid::parse_str(&run_id).unwrap())
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        stored.as_deref().map(ids_of),
        Some((trace.clone(), create.span_id.clone()))
    );

    // Both attempts, on two workers, are children of the run's root; each links to the
    // message that delivered it, the second to the resume's publish in the resume's trace.
    let mut attempts = named(&spans, "run.attempt");
    attempts.sort_by_key(|s| s.attr("attempt").map(str::to_owned));
    let (a1, a2) = (attempts[0], attempts[1]);
    for a in [a1, a2] {
        assert_eq!(a.trace_id, trace, "{a:?}");
        assert_eq!(a.parent_span_id, create.span_id, "{a:?}");
        assert_eq!(a.attr("run_id"), Some(run_id.as_str()));
        assert_eq!(a.service, "agentfleet-worker");
    }
    assert_eq!(
        (a1.attr("attempt"), a2.attr("attempt")),
        (Some("1"), Some("2"))
    );
    assert_ne!(
        a1.attr("worker"),
        a2.attr("worker"),
        "the run moved to worker B"
    );
    assert!(
        a1.links
            .contains(&(trace.clone(), publish[0].span_id.clone())),
        "{a1:?}"
    );
    let resume = request(&spans, "POST", "/v1/runs/{id}/resume");
    assert_eq!(resume.len(), 1, "{resume:?}");
    let resume = resume[0];
    assert_eq!(
        (resume.trace_id.as_str(), resume.parent_span_id.as_str()),
        (resume_trace.as_str(), resume_span.as_str()),
        "the resume request belongs to its caller's trace"
    );
    let resume_publish: Vec<_> = named(&spans, "queue.publish")
        .into_iter()
        .filter(|s| s.parent_span_id == resume.span_id)
        .collect();
    assert_eq!(resume_publish.len(), 1);
    assert!(
        a2.links
            .contains(&(resume_trace.clone(), resume_publish[0].span_id.clone())),
        "the attempt after the resume links to it: {a2:?}"
    );

    // Iterations under attempts: 1 and 2 on worker A; 2 again (its approved call) and 3 on B.
    let mut iterations: Vec<(String, String, String)> = named(&spans, "run.iteration")
        .into_iter()
        .map(|i| {
            assert_eq!(i.trace_id, trace);
            (
                parent(i).attr("attempt").unwrap_or_default().to_owned(),
                i.attr("iteration").unwrap_or_default().to_owned(),
                i.attr("continued").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    iterations.sort();
    let expected: Vec<(String, String, String)> = [
        ("1", "1", "false"),
        ("1", "2", "false"),
        ("2", "2", "true"),
        ("2", "3", "false"),
    ]
    .iter()
    .map(|(a, i, c)| (a.to_string(), i.to_string(), c.to_string()))
    .collect();
    assert_eq!(iterations, expected);

    // Model calls and tool calls under iterations.
    let mut models: Vec<(String, String)> = named(&spans, "model.call")
        .into_iter()
        .map(|m| {
            let iteration = parent(m);
            assert_eq!(iteration.name, "run.iteration", "{m:?}");
            assert_eq!(m.trace_id, trace);
            assert_eq!(m.attr("model"), Some("mock-1"));
            assert_eq!(m.attr("status"), Some("ok"));
            (
                iteration.attr("iteration").unwrap_or_default().to_owned(),
                m.attr("prompt_tokens").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    models.sort();
    assert_eq!(models.len(), 3);
    assert_eq!(
        models[0],
        ("1".to_owned(), "11".to_owned()),
        "the reported usage"
    );
    let model_1 = named(&spans, "model.call")
        .into_iter()
        .find(|m| parent(m).attr("iteration") == Some("1"))
        .unwrap();
    assert_eq!(model_1.attr("completion_tokens"), Some("7"));
    assert_eq!(model_1.attr("tool_calls"), Some("1"));

    let tools = named(&spans, "tool.call");
    for (name, path, attempt, iteration) in [
        ("lookup", "/echo", "1", "1"),
        ("transfer", "/side-effect", "2", "2"),
    ] {
        let span = tools
            .iter()
            .find(|t| t.attr("tool") == Some(name))
            .unwrap_or_else(|| panic!("no tool.call span for {name}: {tools:?}"));
        let under = parent(span);
        assert_eq!(under.name, "run.iteration");
        assert_eq!(under.attr("iteration"), Some(iteration));
        assert_eq!(parent(under).attr("attempt"), Some(attempt));
        assert_eq!(span.attr("kind"), Some("http"));
        assert_eq!(span.attr("outcome"), Some("succeeded"));
        // The tool received the context of its own span.
        let calls = env.tools.calls_to(path);
        assert_eq!(calls.len(), 1, "{path}");
        let sent = calls[0].traceparent.as_deref().expect("traceparent sent");
        assert_eq!(
            ids_of(sent),
            (trace.clone(), span.span_id.clone()),
            "{name}"
        );
    }

    // Everything else is in the caller's trace, the resume's, or (the sweeper's re-publishes,
    // the malformed request) a trace of its own that names no run.
    for s in &spans {
        let known = s.trace_id == trace
            || s.trace_id == resume_trace
            || s.trace_id == usage[0].trace_id
            || (s.name == "queue.publish" && s.parent_span_id.is_empty());
        assert!(known, "a span outside the run's traces: {s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_of_a_batch_join_the_submitting_requests_trace() {
    let env = TestEnv::new().await;
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let fast = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let (_api, base) = env
        .spawn_api_process(&[
            ("AGENTFLEET__TELEMETRY__OTLP_ENDPOINT", endpoint.as_str()),
            fast[0],
        ])
        .await;
    let _worker = env.spawn_worker_process_env(&[("telemetry.otlp_endpoint", &endpoint)], &fast);
    let app = env.app_at(&base, reqwest::Client::new()).await;
    let (trace, caller_span, traceparent) = caller_context();
    let item = |i: usize| {
        json!({"custom_id": format!("line-{i}"), "agent": {"model": "mock"},
               "input": agentfleet_tests::mock_llm::script(json!([{"content": "ok"}]))})
    };
    // The driver makes the runs after the answer, in the background.
    let resp = app
        .http
        .post(app.url("/v1/batches"))
        .bearer_auth(&app.api_key)
        .header("traceparent", &traceparent)
        .json(&json!({"runs": [item(0), item(1)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let batch: serde_json::Value = resp.json().await.unwrap();
    let batch_id = Uuid::parse_str(batch["id"].as_str().unwrap()).unwrap();
    let runs: Vec<(Uuid, Option<String>)> = wait_for("the batch's runs completed", T, || {
        let pool = env.pool.clone();
        async move {
            let runs: Vec<(Uuid, Option<String>, String)> = sqlx::query_as(
                "SELECT id, traceparent, status FROM runs WHERE batch_id = $1 ORDER BY id",
            )
            .bind(batch_id)
            .fetch_all(&pool)
            .await
            .unwrap();
            (runs.len() == 2 && runs.iter().all(|r| r.2 == "completed"))
                .then(|| runs.into_iter().map(|(id, tp, _)| (id, tp)).collect())
        }
    })
    .await;
    let spans = wait_for("both runs' attempts at the collector", T, || {
        let spans = collector.spans();
        let arrived = named(&spans, "run.attempt").len() == 2
            && !request(&spans, "POST", "/v1/batches").is_empty();
        async move { arrived.then_some(spans) }
    })
    .await;
    let submit = request(&spans, "POST", "/v1/batches");
    assert_eq!(submit.len(), 1, "{submit:?}");
    let submit = submit[0];
    assert_eq!(
        (submit.trace_id.as_str(), submit.parent_span_id.as_str()),
        (trace.as_str(), caller_span.as_str())
    );
    for (id, stored) in &runs {
        assert_eq!(
            stored.as_deref().map(ids_of),
            Some((trace.clone(), submit.span_id.clone())),
            "run {id} stores the submitting request's context"
        );
        let attempt = named(&spans, "run.attempt")
            .into_iter()
            .find(|a| a.attr("run_id") == Some(id.to_string().as_str()))
            .unwrap_or_else(|| panic!("no attempt span for {id}"));
        assert_eq!(attempt.trace_id, trace);
        assert_eq!(attempt.parent_span_id, submit.span_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_carries_the_context_of_its_span() {
    let mcp = agentfleet_tests::mcp_server::McpServer::start()
        .await
        .unwrap();
    let allow = mcp.addr().to_string();
    let env = TestEnv::with(&[("egress.allow", allow.as_str())]).await;
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process_env(
        &[("telemetry.otlp_endpoint", endpoint.as_str())],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "m__add", "arguments": {"a": 1, "b": 2}}]},
               {"content": "3"}]),
        json!([{"name": "m", "kind": "mcp", "url": mcp.url(), "risk": "low"}]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let calls = mcp.state().calls_to("add");
    assert_eq!(calls.len(), 1);
    let sent = calls[0]
        .traceparent
        .clone()
        .expect("the MCP call carried a traceparent");
    let span = wait_for("the tool.call span of the MCP call", T, || async {
        collector
            .spans()
            .into_iter()
            .find(|s| s.name == "tool.call" && s.attr("tool") == Some("m__add"))
    })
    .await;
    assert_eq!(span.attr("kind"), Some("mcp"));
    assert_eq!(ids_of(&sent), (span.trace_id.clone(), span.span_id));
}
