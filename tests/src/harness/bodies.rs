//! Request bodies (agents, tools, scripted runs) and assertions on event lists.

use serde_json::{Value, json};

use super::env::TestEnv;

/// An agent spec using the scripted model and `tools`.
pub fn agent(tools: Value) -> Value {
    json!({"model": "mock", "system_prompt": "You are a test agent.", "tools": tools, "max_iterations": 10})
}

/// An http tool definition pointing at the tool server.
pub fn http_tool(env: &TestEnv, name: &str, path: &str) -> Value {
    json!({"name": name, "description": format!("{name} tool"), "kind": "http", "url": env.tools.url(path),
           "parameters": {"type": "object"}})
}

/// A run request whose input carries a model script.
pub fn scripted_run(turns: Value, tools: Value) -> Value {
    json!({"input": crate::mock_llm::script(turns), "agent": agent(tools)})
}

/// A scripted planner turn that calls `plan` with `tasks` (`[{"title", "input"}]`).
pub fn plan_call(tasks: Value) -> Value {
    json!({"tool_calls": [{"name": "plan", "arguments": {"tasks": tasks}}]})
}

/// A scripted planner turn that calls `complete`.
pub fn complete_call() -> Value {
    json!({"tool_calls": [{"name": "complete", "arguments": {"summary": "done"}}]})
}

/// A plan-and-solve run of the scripted planner `turns`, with `plan` settings.
pub fn planner_run(turns: Value, plan: Value) -> Value {
    let mut body = scripted_run(turns, json!([]));
    body["agent"]["mode"] = json!("plan_and_solve");
    body["agent"]["plan"] = plan;
    body
}

/// Asserts ids are exactly 1..=n in order.
pub fn assert_gap_free(events: &[Value]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e["id"].as_u64(),
            Some(i as u64 + 1),
            "event ids must be 1..n without gaps: {events:#?}"
        );
    }
}

pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect()
}
