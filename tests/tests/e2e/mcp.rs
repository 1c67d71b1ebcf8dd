//! MCP tools against a real MCP server (`rmcp`, streamable HTTP): listing and calling, the
//! confirmation of a risky MCP call, the egress policy, the per-run cap on concurrent tool
//! calls, and servers registered per tenant with sealed auth headers.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_shared::egress::DENIED_MESSAGE;
use agentfleet_tests::harness::*;
use agentfleet_tests::mcp_server::McpServer;

const T: Duration = Duration::from_secs(60);

/// An environment whose egress policy opens exactly the MCP server's address.
async fn env_for(mcp: &McpServer, extra: &[(&str, &str)]) -> TestEnv {
    let allow = mcp.addr().to_string();
    let mut overrides = vec![("egress.allow", allow.as_str())];
    overrides.extend_from_slice(extra);
    TestEnv::with(&overrides).await
}

fn inline(name: &str, url: &str, tools: Option<&[&str]>, risk: &str) -> Value {
    let mut t = json!({"name": name, "kind": "mcp", "url": url, "risk": risk});
    if let Some(tools) = tools {
        t["tools"] = json!(tools);
    }
    t
}

fn completions(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "tool_completed")
        .map(|e| e["data"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_an_mcp_server_completes_and_the_model_sees_the_result() {
    let mcp = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "calc__add", "arguments": {"a": 2, "b": 3}},
                               {"name": "calc__fail", "arguments": {}}]},
               {"content": "the sum is 5"}]),
        json!([inline("calc", &mcp.url(), None, "low")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Offered under `<entry>__<tool>`, with the server's schema.
    let requests = env.llm.requests();
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    for name in ["calc__add", "calc__transfer", "calc__slow", "calc__fail"] {
        assert!(offered.contains(&name), "{name} offered: {offered:?}");
    }
    let add = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "calc__add")
        .unwrap();
    assert_eq!(add["function"]["parameters"]["required"], json!(["a", "b"]));

    // The results reached the model: the sum, and the isError result as an error.
    let tool_messages: Vec<String> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    // In the order the calls finished.
    assert_eq!(tool_messages.len(), 2, "{tool_messages:?}");
    assert!(
        tool_messages.iter().any(|m| m.contains("\"sum\":5")),
        "{tool_messages:?}"
    );
    assert!(
        tool_messages
            .iter()
            .any(|m| m == r#"{"error":"the MCP tool failed: failed on purpose"}"#),
        "{tool_messages:?}"
    );
    let events = app.events(id, 0, T).await;
    let done = completions(&events);
    let fail = done.iter().find(|d| d["name"] == "calc__fail").unwrap();
    assert_eq!(fail["ok"], false, "{fail}");

    // The call carried the run's idempotency metadata and deadline.
    let calls = mcp.state().calls_to("add");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, json!({"a": 2, "b": 3}));
    let call_id = events
        .iter()
        .find(|e| e["type"] == "tool_started" && e["data"]["name"] == "calc__add")
        .unwrap()["data"]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        calls[0].meta["idempotency_key"],
        format!("{id}:{call_id}"),
        "{:?}",
        calls[0].meta
    );
    assert_eq!(calls[0].meta["deadline_ms"], 30000);

    // The tool list is cached: a second run lists nothing new.
    let lists = mcp.state().lists();
    let again = scripted_run(
        json!([{"content": "nothing to do"}]),
        json!([inline("calc", &mcp.url(), None, "low")]),
    );
    let run = app.start_run(&again).await;
    let id = run["id"].as_str().unwrap();
    app.wait_status(id, &["completed"], T).await;
    assert_eq!(mcp.state().lists(), lists, "the cached list was reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_risky_mcp_call_waits_for_approval_then_runs_exactly_once() {
    let mcp = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "bank__transfer", "arguments": {"amount": 10}},
                               {"name": "calc__add", "arguments": {"a": 1, "b": 1}}]},
               {"content": "transferred"}]),
        json!([
            inline("calc", &mcp.url(), Some(&["add"]), "low"),
            inline("bank", &mcp.url(), Some(&["transfer"]), "high"),
        ]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let waiting = app
        .wait_status(id, &["waiting_for_confirmation", "failed", "completed"], T)
        .await;
    assert_eq!(waiting["status"], "waiting_for_confirmation", "{waiting}");
    let pending = waiting["pending"]["tool_calls"].as_array().unwrap().clone();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["name"], "bank__transfer");
    assert_eq!(pending[0]["risk"], "high");
    // The subset: only the picked tools are offered.
    let offered: Vec<String> = env.llm.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !offered
            .iter()
            .any(|n| n == "calc__transfer" || n == "bank__add")
    );
    assert!(
        mcp.state().calls().is_empty(),
        "nothing ran before the decision"
    );

    let call = pending[0]["tool_call_id"].as_str().unwrap();
    let resp = app
        .post(
            &format!("/v1/runs/{id}/resume"),
            &json!({"decisions": [{"tool_call_id": call, "approve": true}]}),
        )
        .await;
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let transfers = mcp.state().calls_to("transfer");
    assert_eq!(transfers.len(), 1, "approved, it ran exactly once");
    assert_eq!(transfers[0].arguments, json!({"amount": 10}));
    assert_eq!(transfers[0].meta["idempotency_key"], format!("{id}:{call}"));
    assert_eq!(mcp.state().calls_to("add").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_the_egress_policy_refuses_fails_the_run_clearly() {
    let mcp = McpServer::start().await.unwrap();
    // Another server on loopback, which the policy does not open.
    let internal = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;

    // A literal refused address is refused at submission, naming the field.
    let literal = scripted_run(
        json!([{"content": "x"}]),
        json!([inline("x", &internal.url(), None, "low")]),
    );
    let resp = app.post("/v1/runs", &literal).await;
    assert_eq!(resp.status(), 422);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("agent.tools[0].url: "),
        "{err}"
    );

    // By name, it resolves to a refused address: the run fails with a clear reason.
    let by_name = format!("http://localhost:{}/mcp", internal.addr().port());
    let body = scripted_run(
        json!([{"content": "x"}]),
        json!([inline("x", &by_name, None, "low")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let failed = app.wait_status(id, &["failed", "completed"], T).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(
        failed["error"]["code"], "mcp_server_unavailable",
        "{failed}"
    );
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("agent.tools[0] (`x`): ") && message.ends_with(DENIED_MESSAGE),
        "{message}"
    );
    assert_eq!(internal.state().lists(), 0, "nothing reached it");
    assert!(internal.state().calls().is_empty());
    assert_eq!(env.llm.requests().len(), 0, "the model was not called");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tool_calls_of_a_run_are_capped() {
    let mcp = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[("worker.max_parallel_tool_calls", "3")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let slow = |n: usize| -> Value {
        json!(
            (0..n)
                .map(|_| json!({"name": "t__slow", "arguments": {"ms": 400}}))
                .collect::<Vec<_>>()
        )
    };
    // The agent lowers the cap to 2.
    let mut body = scripted_run(
        json!([{"tool_calls": slow(6)}, {"content": "done"}]),
        json!([inline("t", &mcp.url(), Some(&["slow"]), "low")]),
    );
    body["agent"]["max_parallel_tool_calls"] = json!(2);
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(mcp.state().calls_to("slow").len(), 6);
    assert_eq!(mcp.state().max_in_flight(), 2, "the agent's cap held");

    // Asking for more than the worker's cap gets the worker's cap (3).
    let mcp2 = McpServer::start().await.unwrap();
    let env2 = env_for(&mcp2, &[("worker.max_parallel_tool_calls", "3")]).await;
    let app2 = env2.spawn_api().await;
    let _worker2 = env2.spawn_worker().await;
    let mut body = scripted_run(
        json!([{"tool_calls": slow(6)}, {"content": "done"}]),
        json!([inline("t", &mcp2.url(), Some(&["slow"]), "low")]),
    );
    body["agent"]["max_parallel_tool_calls"] = json!(50);
    let run = app2.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app2.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        mcp2.state().max_in_flight() <= 3,
        "{}",
        mcp2.state().max_in_flight()
    );

    // The field is validated.
    body["agent"]["max_parallel_tool_calls"] = json!(0);
    let resp = app2.post("/v1/runs", &body).await;
    assert_eq!(resp.status(), 422);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("agent.max_parallel_tool_calls"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tool_entries_are_validated() {
    let mcp = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[]).await;
    let app = env.spawn_api().await;
    let cases = [
        (json!({"name": "m", "kind": "mcp"}), "agent.tools[0].server"),
        (
            json!({"name": "m", "kind": "mcp", "url": mcp.url(), "server": "s"}),
            "agent.tools[0].url",
        ),
        (
            json!({"name": "m", "kind": "mcp", "server": "bad name!"}),
            "agent.tools[0].server",
        ),
        (
            json!({"name": "m", "kind": "mcp", "url": mcp.url(), "tools": []}),
            "agent.tools[0].tools",
        ),
        (
            json!({"name": "x".repeat(33), "kind": "mcp", "url": mcp.url()}),
            "agent.tools[0].name",
        ),
        (
            json!({"name": "h", "kind": "http", "url": mcp.url(), "server": "s"}),
            "agent.tools[0].kind",
        ),
    ];
    for (tool, field) in cases {
        let body = scripted_run(json!([{"content": "x"}]), json!([tool.clone()]));
        let resp = app.post("/v1/runs", &body).await;
        assert_eq!(resp.status(), 422, "{tool}");
        let err: Value = resp.json().await.unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}: ")),
            "{tool}: {err}"
        );
    }
}

/// Base64 of 32 bytes: the sealing key of the registration tests.
const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const TOKEN: &str = "Bearer sekret-token-4711";

async fn post_as(app: &TestApp, key: &str, path: &str, body: &Value) -> reqwest::Response {
    app.http
        .post(app.url(path))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_server_sends_its_sealed_header_and_never_shows_it() {
    let mcp = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[("mcp.encryption_key", KEY)]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let resp = app
        .post(
            "/v1/mcp-servers",
            &json!({"name": "bank", "url": mcp.url(), "description": "the bank",
                    "headers": [{"name": "Authorization", "value": TOKEN}]}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let created = resp.text().await.unwrap();
    assert!(!created.contains("sekret"), "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    assert_eq!(created["name"], "bank");
    assert_eq!(created["header_names"], json!(["Authorization"]));
    for path in ["/v1/mcp-servers", "/v1/mcp-servers/bank"] {
        let resp = app.get(path).await;
        assert_eq!(resp.status(), 200, "{path}");
        let text = resp.text().await.unwrap();
        assert!(
            text.contains("Authorization") && !text.contains("sekret"),
            "{path}: {text}"
        );
    }
    // Not in Postgres as plaintext, anywhere in the row.
    let (row,): (String,) = sqlx::query_as("SELECT row_to_json(m)::text FROM mcp_servers m")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(!row.contains("sekret"), "{row}");
    let (sealed,): (Vec<u8>,) = sqlx::query_as("SELECT headers_sealed FROM mcp_servers")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(!sealed.windows(6).any(|w| w == b"sekret"));

    // An agent naming it reaches it with the header.
    let body = scripted_run(
        json!([{"tool_calls": [{"name": "b__add", "arguments": {"a": 1, "b": 2}}]},
               {"content": "3"}]),
        json!([{"name": "b", "kind": "mcp", "server": "bank", "tools": ["add"]}]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let calls = mcp.state().calls_to("add");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].authorization.as_deref(), Some(TOKEN));
    // Nor does the run or its events show it.
    let events = serde_json::to_string(&app.events(id, 0, T).await).unwrap();
    assert!(!events.contains("sekret"));

    // Another tenant sees nothing of it, and its agents cannot name it.
    let other = env.new_tenant_key().await;
    let resp = app.get_as("/v1/mcp-servers/bank", &other).await;
    assert_eq!(resp.status(), 404);
    let list: Value = app
        .get_as("/v1/mcp-servers", &other)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["data"], json!([]));
    // Refused at submission (not found, as an unknown thread), naming the field, and nothing
    // is created.
    let resp = post_as(&app, &other, "/v1/runs", &body).await;
    assert_eq!(resp.status(), 404);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(
        err["error"]["message"],
        "agent.tools[0].server: no MCP server named `bank` is registered (POST /v1/mcp-servers)"
    );
    let batch = json!({"runs": [body.clone(), body.clone()]});
    let resp = post_as(&app, &other, "/v1/runs/batch", &batch).await;
    assert_eq!(resp.status(), 404);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("runs[0].agent.tools[0].server: "),
        "{err}"
    );
    let mut item = body.clone();
    item["custom_id"] = json!("one");
    let resp = post_as(&app, &other, "/v1/batches", &json!({"runs": [item]})).await;
    assert_eq!(resp.status(), 404);
    let listed: Value = app.get_as("/v1/runs", &other).await.json().await.unwrap();
    assert_eq!(listed["data"], json!([]), "nothing was created");
    assert_eq!(
        mcp.state().calls_to("add").len(),
        1,
        "it never reached the server"
    );

    // Deleted, it is gone.
    let resp = app
        .http
        .delete(app.url("/v1/mcp-servers/bank"))
        .bearer_auth(&app.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(app.get("/v1/mcp-servers/bank").await.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_are_validated() {
    let mcp = McpServer::start().await.unwrap();
    let env = env_for(&mcp, &[("mcp.max_servers_per_tenant", "2")]).await;
    let app = env.spawn_api().await;
    let url = mcp.url();
    let cases = [
        (json!({"name": "bad name", "url": url}), "name"),
        (json!({"name": "a", "url": "ftp://x/"}), "url"),
        (
            json!({"name": "a", "url": "http://169.254.169.254/mcp"}),
            "url",
        ),
        (
            json!({"name": "a", "url": url, "headers": [{"name": "X-Key", "value": "v"}]}),
            "headers",
        ),
    ];
    for (body, field) in cases {
        let resp = app.post("/v1/mcp-servers", &body).await;
        assert_eq!(resp.status(), 422, "{body}");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid_request");
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}: ")),
            "{body}: {err}"
        );
    }
    // Without mcp.encryption_key, headers are refused clearly; without headers it works.
    let err: Value = app
        .post(
            "/v1/mcp-servers",
            &json!({"name": "a", "url": url, "headers": [{"name": "X-Key", "value": "v"}]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mcp.encryption_key is not configured"),
        "{err}"
    );
    let ok = json!({"name": "a", "url": url});
    assert_eq!(app.post("/v1/mcp-servers", &ok).await.status(), 201);
    let dup = app.post("/v1/mcp-servers", &ok).await;
    assert_eq!(dup.status(), 409);
    let err: Value = dup.json().await.unwrap();
    assert_eq!(err["error"]["code"], "mcp_server_exists");
    assert_eq!(
        app.post("/v1/mcp-servers", &json!({"name": "b", "url": url}))
            .await
            .status(),
        201
    );
    let full = app
        .post("/v1/mcp-servers", &json!({"name": "c", "url": url}))
        .await;
    assert_eq!(full.status(), 409);
    let err: Value = full.json().await.unwrap();
    assert_eq!(err["error"]["code"], "too_many_mcp_servers");
    // A path that cannot be a name is 422 naming it; an unknown name 404.
    let resp = app.get("/v1/mcp-servers/bad%20name").await;
    assert_eq!(resp.status(), 422);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("name: "),
        "{err}"
    );
    assert_eq!(app.get("/v1/mcp-servers/nope").await.status(), 404);

    // With a key: reserved and malformed headers name their field.
    let app2 = env.spawn_api_with(&[("mcp.encryption_key", KEY)]).await;
    for (headers, field) in [
        (json!([{"name": "Accept", "value": "x"}]), "headers[0].name"),
        (
            json!([{"name": "bad name", "value": "x"}]),
            "headers[0].name",
        ),
        (
            json!([{"name": "X-A", "value": "x"}, {"name": "x-a", "value": "y"}]),
            "headers[1].name",
        ),
        (
            json!([{"name": "X-A", "value": "a\r\nInjected: 1"}]),
            "headers[0].value",
        ),
    ] {
        let body = json!({"name": "h", "url": url, "headers": headers});
        let resp = app2.post("/v1/mcp-servers", &body).await;
        assert_eq!(resp.status(), 422, "{body}");
        let err: Value = resp.json().await.unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}: ")),
            "{body}: {err}"
        );
    }
}

/// Runs an agent whose only tool entry is `tool`; asserts the run fails, before the model, as
/// `mcp_server_unavailable` with `message`.
async fn assert_listing_fails(app: &TestApp, tool: Value, message: &str) {
    let body = scripted_run(json!([{"content": "x"}]), json!([tool]));
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let failed = app.wait_status(id, &["failed", "completed"], T).await;
    assert_eq!(
        failed["error"]["code"], "mcp_server_unavailable",
        "{failed}"
    );
    assert_eq!(failed["error"]["message"], message);
}

/// A listing is bounded over all its pages, not only per response: a server that always
/// answers with a further cursor fails at the page cap (well before the listing's time limit),
/// and one whose pages each fit `mcp.max_list_bytes` fails once their sum does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_pages_forever_or_outgrows_its_bytes_over_pages_fails_the_run() {
    let mcp = McpServer::start().await.unwrap();
    // A page of the wordy listing is ~200 KB; its two pages ~400 KB.
    let env = env_for(
        &mcp,
        &[
            ("mcp.max_list_bytes", "300000"),
            ("mcp.list_timeout_ms", "60000"),
        ],
    )
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let pages = agentfleet_worker::tools::mcp::MAX_LIST_PAGES;
    for (tool, message) in [
        (
            inline("endless", &mcp.endless_url(), None, "low"),
            format!(
                "agent.tools[0] (`endless`): the MCP server's tool list runs over more than {pages} pages"
            ),
        ),
        (
            inline("wordy", &mcp.wordy_url(), None, "low"),
            "agent.tools[0] (`wordy`): the MCP server's tool list is larger than 300000 bytes"
                .to_string(),
        ),
    ] {
        assert_listing_fails(&app, tool, &message).await;
    }
    assert_eq!(env.llm.requests().len(), 0, "the model was not called");
    // The paged listing itself (two tools a page) still gives every tool.
    let body = scripted_run(
        json!([{"content": "x"}]),
        json!([inline("paged", &mcp.url(), Some(&["add", "fail"]), "low")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["failed", "completed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_past_its_bounds_or_missing_a_picked_tool_fails_the_run_naming_the_entry() {
    let mcp = McpServer::start().await.unwrap();
    // The server offers 4 tools.
    let env = env_for(&mcp, &[("mcp.max_tools_per_server", "3")]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    for (tool, message) in [
        (
            inline("many", &mcp.url(), None, "low"),
            "agent.tools[0] (`many`): the MCP server offers more than 3 tools",
        ),
        (
            inline("pick", &mcp.url(), Some(&["nope"]), "low"),
            "agent.tools[0] (`pick`): the MCP server offers more than 3 tools",
        ),
    ] {
        assert_listing_fails(&app, tool, message).await;
    }
    // Within the bounds, a picked tool the server lacks is named.
    let env = env_for(&mcp, &[]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let body = scripted_run(
        json!([{"content": "x"}]),
        json!([inline("pick", &mcp.url(), Some(&["add", "nope"]), "low")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap();
    let failed = app.wait_status(id, &["failed", "completed"], T).await;
    assert_eq!(
        failed["error"]["message"],
        "agent.tools[0] (`pick`): the MCP server offers no tool `nope`"
    );
    assert_eq!(env.llm.requests().len(), 0, "the model was not called");
}
