//! A model without native tool calls (`tool_calling = "xml"`): its calls, written in its
//! streamed text and cut across chunks, run like native ones — confirmation included — and
//! a malformed block fails the run with a tenant-safe error.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(60);

async fn xml_env() -> (TestEnv, TestApp, InProcessWorker) {
    let env = TestEnv::new().await;
    let url = env.llm.base_url();
    let models = [
        ("models.mockx.base_url", url.as_str()),
        ("models.mockx.model", "mock-x"),
        ("models.mockx.tool_calling", "xml"),
    ];
    let app = env.spawn_api_with(&models).await;
    let worker = env.spawn_worker_with(&models).await;
    (env, app, worker)
}

fn xml_run(turns: Value, tools: Value) -> Value {
    json!({"input": agentfleet_tests::mock_llm::script(turns), "agent": {
        "model": "mockx", "system_prompt": "You are a test agent.", "tools": tools, "max_iterations": 5}})
}

const ADD_CALL: &str = "Let me add.\n<function_calls>\n<invoke name=\"add\">\n\
    <parameter name=\"a\">2</parameter>\n<parameter name=\"b\">3</parameter>\n</invoke>\n</function_calls>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xml_mode_models_calls_run_like_native_ones() {
    let (env, app, _worker) = xml_env().await;
    let body = xml_run(
        // 23 pieces: the block is cut inside its tags.
        json!([{"content": ADD_CALL, "chunks": 23}, {"content": "The sum is 5."}]),
        json!([http_tool(&env, "add", "/add")]),
    );
    let id = app.start_run(&body).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");

    let calls = env.tools.calls_to("/add");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body["arguments"], json!({"a": 2, "b": 3}));
    let requests = env.llm.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert!(r.get("tools").is_none(), "no native tools: {r}");
        let system = r["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.starts_with("You are a test agent.")
                && system.contains("<function_calls>")
                && system.contains("- add: add tool"),
            "{system}"
        );
    }
    let second = requests[1]["messages"].as_array().unwrap();
    let assistant = second.iter().find(|m| m["role"] == "assistant").unwrap();
    assert!(assistant.get("tool_calls").is_none());
    assert!(
        assistant["content"]
            .as_str()
            .unwrap()
            .contains("<invoke name=\"add\">")
    );
    let results = second.last().unwrap();
    assert_eq!(results["role"], "user");
    let results = results["content"].as_str().unwrap();
    assert!(
        results.starts_with("<function_results>") && results.contains("\"sum\":5"),
        "{results}"
    );

    let events = app.events(&id, 0, T).await;
    assert_gap_free(&events);
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "message_delta")
        .map(|e| e["data"]["text"].as_str().unwrap().to_string())
        .collect();
    assert!(deltas.starts_with("Let me add."), "{deltas}");
    assert!(
        !deltas.contains("<function_calls") && !deltas.contains("<invoke"),
        "{deltas}"
    );
    let first = events
        .iter()
        .find(|e| e["type"] == "message_completed")
        .unwrap();
    assert_eq!(first["data"]["tool_calls"][0]["name"], "add");
    assert_eq!(first["data"]["content"], "Let me add.\n");
    let kinds = types(&events);
    for kind in ["tool_started", "tool_completed", "run_completed"] {
        assert!(kinds.iter().any(|k| k == kind), "{kinds:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_risky_xml_call_waits_for_approval_and_runs_once() {
    let (env, app, _worker) = xml_env().await;
    let call = "<function_calls><invoke name=\"pay\"><parameter name=\"amount\">10</parameter>\
                </invoke></function_calls>";
    let mut tool = http_tool(&env, "pay", "/side-effect");
    tool["risk"] = json!("high");
    let body = xml_run(
        json!([{"content": call, "chunks": 7}, {"content": "Paid."}]),
        json!([tool]),
    );
    let id = app.start_run(&body).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let waiting = app.wait_status(&id, &["waiting_for_confirmation"], T).await;
    assert!(
        env.tools.calls_to("/side-effect").is_empty(),
        "nothing ran yet"
    );
    let pending = &waiting["pending"]["tool_calls"][0];
    assert_eq!(pending["name"], "pay");
    let call_id = pending["tool_call_id"].as_str().unwrap().to_string();
    let decisions = json!({"decisions": [{"tool_call_id": call_id, "approve": true}]});
    assert_eq!(
        app.post(&format!("/v1/runs/{id}/resume"), &decisions)
            .await
            .status(),
        202
    );
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let calls = env.tools.calls_to("/side-effect");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body["arguments"], json!({"amount": 10}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_block_fails_the_run_with_a_clear_code() {
    let (env, app, _worker) = xml_env().await;
    let body = xml_run(
        json!([{"content": "<function_calls><invoke name=\"add\"><parameter name=\"a\">1"}]),
        json!([http_tool(&env, "add", "/add")]),
    );
    let id = app.start_run(&body).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "model_stream_error", "{done}");
    let message = done["error"]["message"].as_str().unwrap();
    assert!(!message.contains("127.0.0.1"), "{message}");
    assert!(env.tools.calls_to("/add").is_empty());
}
