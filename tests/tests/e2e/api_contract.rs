//! The API's contract under hostile input: every error is the documented JSON shape with the
//! right status and names what was wrong; credentials are checked before anything else; no
//! answer carries internal detail; metrics are not on the public port; the served OpenAPI
//! document describes every operation.

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("error bodies are JSON; got {status}: {text:?}"));
    assert!(
        body["error"]["code"].is_string() && body["error"]["message"].is_string(),
        "the error shape is {{error: {{code, message}}}}: {body}"
    );
    (status, body["error"].clone())
}

fn message(err: &Value) -> &str {
    err["message"].as_str().unwrap_or_default()
}

async fn count_rows(env: &TestEnv) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM threads), (SELECT count(*) FROM messages)",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_characters_are_refused_naming_the_field() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let nul = "a\u{0}b";
    let run = |input: &str, agent: Value, metadata: Value| json!({"input": input, "agent": agent, "metadata": metadata});
    let tool = |name: &str, description: &str| json!({"name": name, "description": description, "kind": "http", "url": "http://tools.example/t"});
    let model = || json!({"model": "mock"});
    let cases = [
        (run(nul, model(), json!({})), "input"),
        (run("hi", model(), json!({"k": nul})), "metadata.k"),
        (
            run("hi", model(), json!({"a": {"b": [1, {"c": nul}]}})),
            "metadata.a.b[1].c",
        ),
        (run("hi", model(), json!({"k\u{0}": 1})), "metadata"),
        (
            run("hi", model(), json!({"a": {"k\u{0}": 1}})),
            "metadata.a",
        ),
        (
            run(
                "hi",
                json!({"model": "mock", "system_prompt": nul}),
                json!({}),
            ),
            "agent.system_prompt",
        ),
        (
            run(
                "hi",
                json!({"model": "mock", "tools": [tool(nul, "d")]}),
                json!({}),
            ),
            "agent.tools[0].name",
        ),
        (
            run(
                "hi",
                json!({"model": "mock", "tools": [tool("t", nul)]}),
                json!({}),
            ),
            "agent.tools[0].description",
        ),
        (
            run(
                "hi",
                json!({"model": "mock", "tools": [{"name": "t", "kind": "http", "url": "http://x/t",
                        "parameters": {"type": "object", "description": nul}}]}),
                json!({}),
            ),
            "agent.tools[0].parameters.description",
        ),
    ];
    for (body, field) in &cases {
        let (status, err) = error_of(app.post("/v1/runs", body).await).await;
        assert_eq!(status, 422, "{field}: {err}");
        assert_eq!(err["code"], "invalid_request", "{err}");
        let expected = if field.starts_with("metadata") && body.to_string().contains("k\\u0000") {
            format!("{field}: keys must not contain NUL characters")
        } else {
            format!("{field}: must not contain NUL characters")
        };
        assert_eq!(message(&err), expected);
    }
    // A batch names the run.
    let good = json!({"input": "hi", "agent": {"model": "mock"}});
    let bad = run(nul, model(), json!({}));
    let (status, err) = error_of(
        app.post("/v1/runs/batch", &json!({"runs": [good, bad]}))
            .await,
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(
        message(&err),
        "runs[1].input: must not contain NUL characters"
    );
    // Resuming: the answer and a decision's reason.
    let path = format!("/v1/runs/{}/resume", uuid::Uuid::new_v4());
    let (status, err) = error_of(app.post(&path, &json!({"input": nul})).await).await;
    assert_eq!(status, 422);
    assert_eq!(message(&err), "input: must not contain NUL characters");
    let decision = json!({"decisions": [{"tool_call_id": "c1", "approve": false, "reason": nul}]});
    let (status, err) = error_of(app.post(&path, &decision).await).await;
    assert_eq!(status, 422);
    assert_eq!(
        message(&err),
        "decisions[0].reason: must not contain NUL characters"
    );
    // The escape as clients send it, byte for byte; an escaped backslash before `u0000` is
    // text, not NUL, and is stored.
    let raw = |body: &'static str| {
        app.http
            .post(app.url("/v1/runs"))
            .bearer_auth(&app.api_key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let (status, err) = error_of(
        raw(r#"{"input": "x\u0000", "agent": {"model": "mock"}}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, message(&err)),
        (422, "input: must not contain NUL characters")
    );
    assert_eq!(count_rows(&env).await, (0, 0, 0), "nothing was written");
    let ok = raw(r#"{"input": "x\\u0000", "agent": {"model": "mock"}}"#)
        .await
        .unwrap();
    assert_eq!(ok.status(), 202);
    let created: Value = ok.json().await.unwrap();
    let stored = app.run(created["id"].as_str().unwrap()).await;
    assert_eq!(stored["status"], "queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_method_and_route_errors_are_json_naming_the_parameter() {
    let env = TestEnv::with(&[("api.max_page_size", "100")]).await;
    let app = env.spawn_api().await;
    let thread = uuid::Uuid::new_v4();
    let run = uuid::Uuid::new_v4();
    let cases: Vec<(String, &str)> = vec![
        (
            "/v1/runs?limit=abc".into(),
            "limit: must be an integer within 1..=100",
        ),
        (
            "/v1/runs?limit=0".into(),
            "limit: must be an integer within 1..=100",
        ),
        (
            "/v1/runs?limit=101".into(),
            "limit: must be an integer within 1..=100",
        ),
        (
            "/v1/runs?limit=-1".into(),
            "limit: must be an integer within 1..=100",
        ),
        (
            "/v1/runs?status=bogus".into(),
            "status: unknown status `bogus`",
        ),
        (
            "/v1/runs?thread_id=nope".into(),
            "thread_id: must be a UUID",
        ),
        ("/v1/runs?cursor=zzz".into(), "cursor: malformed cursor"),
        (
            format!("/v1/threads/{thread}/messages?after=-5"),
            "after: must be an integer within 0..=999999999999999999",
        ),
        (
            format!("/v1/threads/{thread}/messages?limit=x"),
            "limit: must be an integer within 1..=100",
        ),
        (
            format!("/v1/runs/{run}/events?after=-5"),
            "after: must be an integer within 0..=999999999999999999",
        ),
        (
            format!("/v1/runs/{run}/events?after=abc"),
            "after: must be an integer within 0..=999999999999999999",
        ),
    ];
    for (path, expected) in &cases {
        let (status, err) = error_of(app.get(path).await).await;
        assert_eq!(status, 422, "{path}: {err}");
        assert_eq!(err["code"], "invalid_request", "{path}");
        assert_eq!(message(&err), *expected, "{path}");
    }
    // An unknown (misspelt) or repeated parameter is named too, not silently ignored.
    let (status, err) = error_of(app.get("/v1/runs?limt=5").await).await;
    assert_eq!(status, 422);
    assert!(message(&err).contains("`limt`"), "{err}");
    let (status, err) = error_of(app.get("/v1/runs?limit=1&limit=2").await).await;
    assert_eq!(status, 422);
    assert!(message(&err).contains("`limit`"), "{err}");

    // Unknown routes and wrong methods: the same JSON shape, 404 and 405 with `Allow`.
    for path in ["/nope", "/v1/nope", "/v1/runs/a/b/c"] {
        let (status, err) = error_of(app.get(path).await).await;
        assert_eq!(
            (status, err["code"].as_str()),
            (404, Some("not_found")),
            "{path}"
        );
    }
    let resp = app
        .http
        .delete(app.url("/v1/runs"))
        .bearer_auth(&app.api_key)
        .send()
        .await
        .unwrap();
    let allow = resp.headers()["allow"].to_str().unwrap().to_owned();
    let (status, err) = error_of(resp).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    let resp = app
        .http
        .put(app.url(&format!("/v1/runs/{run}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["allow"], "GET,HEAD");
    assert_eq!(error_of(resp).await.0, 405);
    let resp = app.http.post(app.url("/healthz")).send().await.unwrap();
    assert_eq!(error_of(resp).await.0, 405);
    // A body that is not declared JSON: 415 in the same shape.
    let resp = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(&app.api_key)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (415, Some("unsupported_media_type"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_before_path_query_and_body() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let nul_body = r#"{"input": "\u0000"}"#;
    // Method, path, and an optional (content type, body).
    type Request<'a> = (reqwest::Method, &'a str, Option<(&'a str, &'a str)>);
    let requests: Vec<Request> = vec![
        (
            reqwest::Method::POST,
            "/v1/runs",
            Some(("application/json", "{not json")),
        ),
        (
            reqwest::Method::POST,
            "/v1/runs",
            Some(("application/json", nul_body)),
        ),
        (
            reqwest::Method::POST,
            "/v1/runs",
            Some(("text/plain", "hi")),
        ),
        (
            reqwest::Method::POST,
            "/v1/runs/batch",
            Some(("application/json", "[]")),
        ),
        (
            reqwest::Method::GET,
            "/v1/runs?limit=abc&status=bogus",
            None,
        ),
        (reqwest::Method::GET, "/v1/runs/not-a-uuid", None),
        (reqwest::Method::POST, "/v1/runs/not-a-uuid/cancel", None),
        (
            reqwest::Method::POST,
            "/v1/runs/not-a-uuid/resume",
            Some(("application/json", "{")),
        ),
        (
            reqwest::Method::POST,
            "/v1/runs/not-a-uuid/stream-token",
            None,
        ),
        (
            reqwest::Method::GET,
            "/v1/runs/not-a-uuid/events?after=-1",
            None,
        ),
        (
            reqwest::Method::GET,
            "/v1/threads/not-a-uuid/messages?limit=x",
            None,
        ),
        (reqwest::Method::GET, "/v1/threads/not-a-uuid/events", None),
    ];
    for key in [None, Some("af_not_a_real_key"), Some("")] {
        for (method, path, body) in &requests {
            let mut req = app.http.request(method.clone(), app.url(path));
            if let Some(key) = key {
                req = req.header("authorization", format!("Bearer {key}"));
            }
            if let Some((content_type, body)) = body {
                req = req.header("content-type", *content_type).body(*body);
            }
            let (status, err) = error_of(req.send().await.unwrap()).await;
            assert_eq!(status, 401, "{method} {path} with {key:?}: {err}");
            assert_eq!(err["code"], "unauthorized");
        }
    }
    // A stream token is checked before the path, too: one for no run cannot read a bad id.
    let (status, _) = error_of(app.get("/v1/runs/not-a-uuid/events?token=abc").await).await;
    assert_eq!(status, 401);
    // Authenticated, a malformed id is 422 naming it on every endpoint.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/runs/not-a-uuid"),
        (reqwest::Method::POST, "/v1/runs/not-a-uuid/cancel"),
        (reqwest::Method::POST, "/v1/runs/not-a-uuid/stream-token"),
        (reqwest::Method::GET, "/v1/runs/not-a-uuid/events"),
        (reqwest::Method::GET, "/v1/threads/not-a-uuid/messages"),
        (reqwest::Method::GET, "/v1/threads/not-a-uuid/events"),
    ] {
        let resp = app
            .http
            .request(method.clone(), app.url(path))
            .bearer_auth(&app.api_key)
            .send()
            .await
            .unwrap();
        let (status, err) = error_of(resp).await;
        assert_eq!(status, 422, "{method} {path}: {err}");
        assert_eq!(message(&err), "id: must be a UUID", "{method} {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_urls_must_be_absolute_http_with_a_host_and_no_credentials() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let with_url = |url: &str| {
        json!({"input": "hi", "agent": {"model": "mock", "tools": [
            {"name": "t", "kind": "http", "url": url}]}})
    };
    for (url, why) in [
        ("http://", "must name a host"),
        ("https:///no-host", "must name a host"),
        (
            "http://tools .example/x",
            "must not contain spaces or control characters",
        ),
        (
            "http://tools.example/a b",
            "must not contain spaces or control characters",
        ),
        (
            "http://user:pw@tools.example/",
            "must not carry credentials (user:password@)",
        ),
        (
            "ftp://tools.example/x",
            "must be an http:// or https:// URL",
        ),
        (
            "gopher://tools.example/x",
            "must be an http:// or https:// URL",
        ),
        ("http:\\\\tools.example\\x", "must not contain backslashes"),
        ("http://tools.example:70000/", "has an invalid port"),
    ] {
        let (status, err) = error_of(app.post("/v1/runs", &with_url(url)).await).await;
        assert_eq!(status, 422, "{url}: {err}");
        assert_eq!(message(&err), format!("agent.tools[0].url: {why}"), "{url}");
    }
    let batch = json!({"runs": [with_url("https://tools.example/ok"), with_url("http://")]});
    let (status, err) = error_of(app.post("/v1/runs/batch", &batch).await).await;
    assert_eq!(status, 422);
    assert_eq!(
        message(&err),
        "runs[1].agent.tools[0].url: must name a host"
    );
    assert_eq!(count_rows(&env).await, (0, 0, 0));
    // Syntax only: which addresses may be reached is a separate policy.
    let ok = app
        .post("/v1/runs", &with_url(&env.tools.url("/add")))
        .await;
    assert_eq!(ok.status(), 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_only_on_their_own_listener() {
    let env = TestEnv::new().await;
    // Default: no metrics listener, and none on the public port.
    let app = env.spawn_api().await;
    let (status, _) = error_of(app.get("/metrics").await).await;
    assert_eq!(status, 404);
    let (status, _) = error_of(app.http.get(app.url("/metrics")).send().await.unwrap()).await;
    assert_eq!(status, 404, "not unauthenticated either");

    let api = agentfleet_api::Application::build(
        env.settings_with(&[("api.metrics_listen", "127.0.0.1:0")]),
    )
    .await
    .expect("api builds");
    let public = format!("http://127.0.0.1:{}", api.port());
    let metrics = format!(
        "http://127.0.0.1:{}",
        api.metrics_port().expect("api.metrics_listen is set")
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let served = tokio::spawn(api.run_until_stopped(async move { stopped.cancelled().await }));
    let http = reqwest::Client::new();
    let key = env.new_tenant_key().await;
    let created = http
        .post(format!("{public}/v1/runs"))
        .bearer_auth(&key)
        .json(&json!({"input": "hi", "agent": {"model": "mock"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 202);
    let resp = http.get(format!("{public}/metrics")).send().await.unwrap();
    assert_eq!(error_of(resp).await.0, 404);
    let resp = http.get(format!("{metrics}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("agentfleet_runs_created_total"), "{text}");
    // The metrics listener serves nothing of the API.
    let resp = http
        .get(format!("{metrics}/v1/runs"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await.0, 404);
    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(10), served)
        .await
        .expect("the API stops")
        .unwrap()
        .unwrap();
    let closed = http.get(format!("{metrics}/metrics")).send().await;
    assert!(closed.is_err(), "the metrics listener stops with the API");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_failure_answers_a_stable_error_without_internal_detail() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let created = app
        .start_run(&json!({"input": "hi", "agent": {"model": "mock"}}))
        .await;
    let (run, thread) = (
        created["id"].as_str().unwrap().to_owned(),
        created["thread_id"].as_str().unwrap().to_owned(),
    );
    // The key is authenticated (and cached); then the tables the endpoints read go missing.
    sqlx::query("ALTER TABLE runs RENAME TO runs_gone_x")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE messages RENAME TO messages_gone_x")
        .execute(&env.pool)
        .await
        .unwrap();
    let body = json!({"input": "hi", "agent": {"model": "mock"}, "thread_id": thread});
    let answers = vec![
        app.get("/v1/runs").await,
        app.get(&format!("/v1/runs/{run}")).await,
        app.get(&format!("/v1/threads/{thread}/messages")).await,
        app.post(
            "/v1/runs",
            &json!({"input": "hi", "agent": {"model": "mock"}}),
        )
        .await,
        app.post("/v1/runs", &body).await,
        app.post("/v1/runs/batch", &json!({"runs": [body.clone()]}))
            .await,
        app.post(&format!("/v1/runs/{run}/cancel"), &json!({}))
            .await,
    ];
    for resp in answers {
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 500, "{text}");
        assert_eq!(
            text, r#"{"error":{"code":"internal","message":"internal error"}}"#,
            "the detail goes to the log only"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_are_read_as_json_numbers_and_must_be_storable() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    // `3.0` is the integer 3, as JSON (and JSON Schema's `integer`) has it.
    let run = app
        .start_run(&json!({"input": "hi", "agent": {"model": "mock", "max_iterations": 3.0,
            "tools": [{"name": "t", "kind": "http", "url": "http://tools.example/t", "timeout_ms": 1500.0}]}}))
        .await;
    assert_eq!(run["max_iterations"], 3);
    assert_eq!(run["agent"]["tools"][0]["timeout_ms"], 1500);
    let (status, err) = error_of(
        app.post(
            "/v1/runs",
            &json!({"input": "hi", "agent": {"model": "mock", "max_iterations": 2.5}}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(message(&err).starts_with("agent.max_iterations"), "{err}");
    // A number Postgres would keep but print beyond what can be read back is refused, named.
    for (body, field) in [
        (
            json!({"input": "hi", "agent": {"model": "mock"}, "metadata": {"x": [-1.7976931348623157e308]}}),
            "metadata.x[0]",
        ),
        (
            json!({"input": "hi", "agent": {"model": "mock", "tools": [{"name": "t", "kind": "http",
                "url": "http://tools.example/t", "parameters": {"type": "number", "maximum": 1e301}}]}}),
            "agent.tools[0].parameters.maximum",
        ),
    ] {
        let (status, err) = error_of(app.post("/v1/runs", &body).await).await;
        assert_eq!(status, 422, "{err}");
        assert_eq!(
            message(&err),
            format!("{field}: must be a number within -1e300..=1e300")
        );
    }
    let stored = app
        .start_run(&json!({"input": "hi", "agent": {"model": "mock"}, "metadata": {"x": 1e300}}))
        .await;
    let read = app.run(stored["id"].as_str().unwrap()).await;
    assert_eq!(read["metadata"]["x"], 1e300);
    // A batch naming a thread that does not exist: 404, as for one run.
    let batch = json!({"runs": [{"input": "hi", "agent": {"model": "mock"}, "thread_id": uuid::Uuid::new_v4()}]});
    let (status, err) = error_of(app.post("/v1/runs/batch", &batch).await).await;
    assert_eq!(
        (status, message(&err)),
        (404, "runs[0].thread_id: thread not found")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_every_operation_of_this_deployment() {
    let env = TestEnv::with(&[("api.max_batch_runs", "7"), ("api.max_page_size", "60")]).await;
    let app = env.spawn_api().await;
    let resp = app.http.get(app.url("/openapi.json")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "served without credentials");
    let doc: Value = resp.json().await.unwrap();
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(schemes["stream_token"]["in"], "query");
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["AgentSpec"]["properties"]["model"]["enum"],
        json!(["mock"])
    );
    assert_eq!(schemas["CreateBatch"]["properties"]["runs"]["maxItems"], 7);
    assert_eq!(schemas["CreateRun"]["additionalProperties"], false);
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations.push(format!("{} {path}", method.to_uppercase()));
            let responses = op["responses"].as_object().unwrap();
            let success = responses.keys().find(|s| s.starts_with('2')).unwrap();
            let content = responses[success]["content"].as_object().unwrap();
            for (media, body) in content {
                let schema = &body["schema"];
                if media == "application/json" && path != "/openapi.json" {
                    assert!(
                        schema["$ref"].is_string(),
                        "{method} {path}: a named schema, not a bare object: {schema}"
                    );
                } else if media == "text/event-stream" {
                    assert_eq!(
                        schema["properties"]["data"]["contentMediaType"],
                        "application/json"
                    );
                }
            }
            if !path.starts_with("/v1/") {
                continue;
            }
            assert!(!op["security"].as_array().unwrap().is_empty(), "{path}");
            let mut statuses = vec!["401", "408", "422", "500", "503"];
            if op.get("requestBody").is_some() {
                statuses.extend(["400", "413", "415"]);
            }
            if path.contains("{id}") {
                statuses.push("404");
                let id = op["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == "id" && p["in"] == "path")
                    .unwrap();
                assert_eq!(id["schema"]["format"], "uuid", "{method} {path}");
            }
            for status in statuses {
                let body = &responses
                    .get(status)
                    .unwrap_or_else(|| panic!("{method} {path} documents {status}"))["content"]["application/json"]
                    ["schema"]["$ref"];
                assert_eq!(
                    body, "#/components/schemas/ErrorBody",
                    "{method} {path} {status}"
                );
            }
        }
    }
    operations.sort();
    assert_eq!(
        operations,
        [
            "DELETE /v1/mcp-servers/{name}",
            "DELETE /v1/webhooks/{id}",
            "GET /healthz",
            "GET /openapi.json",
            "GET /readyz",
            "GET /v1/batches",
            "GET /v1/batches/{id}",
            "GET /v1/batches/{id}/events",
            "GET /v1/batches/{id}/results",
            "GET /v1/export",
            "GET /v1/mcp-servers",
            "GET /v1/mcp-servers/{name}",
            "GET /v1/runs",
            "GET /v1/runs/counts",
            "GET /v1/runs/{id}",
            "GET /v1/runs/{id}/events",
            "GET /v1/runs/{id}/tasks",
            "GET /v1/threads/{id}/events",
            "GET /v1/threads/{id}/messages",
            "GET /v1/usage",
            "GET /v1/webhooks",
            "GET /v1/webhooks/{id}",
            "GET /v1/webhooks/{id}/deliveries",
            "POST /v1/batches",
            "POST /v1/batches/{id}/cancel",
            "POST /v1/mcp-servers",
            "POST /v1/runs",
            "POST /v1/runs/batch",
            "POST /v1/runs/{id}/cancel",
            "POST /v1/runs/{id}/resume",
            "POST /v1/runs/{id}/stream-token",
            "POST /v1/webhooks",
            "POST /v1/webhooks/{id}/deliveries/{delivery_id}/retry",
            "POST /v1/webhooks/{id}/rotate-secret",
        ]
    );
    let limit = doc["paths"]["/v1/runs"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap()
        .clone();
    assert_eq!(limit["schema"]["maximum"], 60);
    // Answers match their schemas: a run as the document names its fields.
    let run = app
        .start_run(&json!({"input": "hi", "agent": {"model": "mock"}}))
        .await;
    let mut fields: Vec<&str> = run
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut documented: Vec<&str> = schemas["Run"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    documented.sort_unstable();
    assert_eq!(fields, documented);
}
