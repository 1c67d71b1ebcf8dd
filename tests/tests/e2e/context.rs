//! Context management with real servers: a 60-iteration run whose tool results total more
//! than ten times the model's context window completes with every request under budget (as
//! counted from what the scripted model received, with the model's tokenizer), compacts in
//! tiers, can read a compressed message back, and leaves a summary the thread's next run
//! reuses without summarising again.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;
use agentfleet_tests::mock_llm::SUMMARISE_MARKER;

const CONTEXT_TOKENS: usize = 6000;
const MAX_TOKENS: usize = 1000;
const T: Duration = Duration::from_secs(180);

/// Tokens of a request as a provider counts them: every message's text and tool calls with
/// 3 tokens of framing each, the tools' JSON, and 3 priming the reply.
fn request_tokens(bpe: &tiktoken_rs::CoreBPE, request: &Value) -> usize {
    let count = |s: &str| bpe.encode_ordinary(s).len();
    let mut total = 3;
    for m in request["messages"].as_array().unwrap() {
        total += 3;
        if let Some(c) = m["content"].as_str() {
            total += count(c);
        }
        if let Some(calls) = m.get("tool_calls") {
            total += count(&calls.to_string());
        }
    }
    if let Some(tools) = request.get("tools") {
        total += count(&tools.to_string());
    }
    total
}

fn system_of(request: &Value) -> &str {
    request["messages"][0]["content"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_stays_under_budget_and_its_summary_serves_the_next_run() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let context = CONTEXT_TOKENS.to_string();
    let max_tokens = MAX_TOKENS.to_string();
    let prompt = format!("{SUMMARISE_MARKER}: summarise the conversation.");
    let _worker = env
        .spawn_worker_with(&[
            ("models.mock.context_tokens", &context),
            ("models.mock.max_tokens", &max_tokens),
            ("context.summary_prompt", &prompt),
        ])
        .await;
    let bpe = tiktoken_rs::o200k_base().unwrap();

    // 60 model turns: 59 tool calls (one of them reads back the first, compressed, result),
    // then an answer. The script is in the system prompt: the first user message will be
    // summarised away.
    let text_call = json!({"tool_calls": [{"name": "text", "arguments": {"words": 500}}]});
    let mut first = text_call.clone();
    first["repeat"] = json!(10);
    let mut rest = text_call.clone();
    rest["repeat"] = json!(48);
    let script = agentfleet_tests::mock_llm::script(json!([
        first,
        {"tool_calls": [{"name": "expand_message", "arguments": {"id": "m2"}}]},
        rest,
        {"content": "done"}
    ]));
    let tool = http_tool(&env, "text", "/text");
    let body = json!({"input": "Collect the texts.", "agent": {
        "model": "mock", "system_prompt": script, "tools": [tool], "max_iterations": 70}});
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let thread = run["thread_id"].as_str().unwrap().to_string();
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");

    let requests = env.llm.requests();
    let turns: Vec<&Value> = requests
        .iter()
        .filter(|r| !system_of(r).starts_with(SUMMARISE_MARKER))
        .collect();
    assert_eq!(turns.len(), 60, "one request per iteration");
    let results: usize = env.tools.calls_to("/text").iter().map(|_| ()).count();
    assert_eq!(results, 58);
    // The premise: what the tools returned is over ten times the context window.
    let result_tokens: usize = app
        .messages(&thread)
        .await
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            bpe.encode_ordinary(m["body"]["content"].as_str().unwrap())
                .len()
        })
        .sum();
    assert!(
        result_tokens > 10 * CONTEXT_TOKENS,
        "tool results total {result_tokens} tokens"
    );
    for (i, r) in turns.iter().enumerate() {
        let n = request_tokens(&bpe, r);
        assert!(
            n <= CONTEXT_TOKENS - MAX_TOKENS,
            "request {i} carried {n} tokens, over {}",
            CONTEXT_TOKENS - MAX_TOKENS
        );
    }
    let summaries = env.llm.state().summaries();
    assert!(summaries >= 1, "the oldest part was summarised");
    let largest = turns.iter().map(|r| request_tokens(&bpe, r)).max().unwrap();
    eprintln!(
        "60 requests, the largest {largest} tokens; tool results {result_tokens} tokens; {summaries} summaries"
    );
    for r in requests
        .iter()
        .filter(|r| system_of(r).starts_with(SUMMARISE_MARKER))
    {
        let n = request_tokens(&bpe, r);
        assert!(
            n <= CONTEXT_TOKENS - MAX_TOKENS,
            "a summarising call carried {n} tokens"
        );
    }

    // Every compaction was announced and recorded.
    let events = app.events(&id, 0, Duration::from_secs(30)).await;
    assert_gap_free(&events);
    let tiers: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "context_compacted")
        .flat_map(|e| e["data"]["steps"].as_array().unwrap().clone())
        .map(|s| s["tier"].as_str().unwrap().to_string())
        .collect();
    eprintln!("compaction steps: {tiers:?}");
    assert!(tiers.contains(&"tool_results".to_string()), "{tiers:?}");
    assert!(tiers.contains(&"summary".to_string()), "{tiers:?}");
    let messages = app.messages(&thread).await;
    let recorded: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "status" && m["body"]["type"] == "context_compacted")
        .collect();
    assert_eq!(
        recorded.len(),
        events
            .iter()
            .filter(|e| e["type"] == "context_compacted")
            .count(),
        "each compaction is a status message of the thread"
    );
    let stored = recorded
        .iter()
        .rev()
        .find_map(|m| m["body"]["summary"].as_str())
        .expect("a stored summary")
        .to_string();
    assert!(stored.starts_with("mock summary of"), "{stored}");

    // The summarising calls are billed with the run: its usage is its calls' plus theirs.
    let compacted_usage: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "context_compacted")
        .filter_map(|e| e["data"].get("usage"))
        .collect();
    assert!(
        !compacted_usage.is_empty(),
        "a summary's event carries its usage"
    );
    let sum = |kind: &str, field: &str| -> i64 {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["data"]["usage"][field].as_i64().unwrap_or(0))
            .sum()
    };
    let (summary_prompt, summary_completion) = agentfleet_tests::mock_llm::SUMMARY_USAGE;
    let n = summaries as i64;
    assert_eq!(
        sum("context_compacted", "prompt_tokens"),
        n * summary_prompt
    );
    assert_eq!(
        sum("context_compacted", "completion_tokens"),
        n * summary_completion
    );
    let run = app.run(&id).await;
    assert_eq!(
        run["usage"]["prompt_tokens"].as_i64().unwrap(),
        sum("message_completed", "prompt_tokens") + n * summary_prompt,
        "{}",
        run["usage"]
    );
    assert_eq!(
        run["usage"]["completion_tokens"].as_i64().unwrap(),
        sum("message_completed", "completion_tokens") + n * summary_completion
    );

    // `expand_message` read the first result back whole.
    let expanded = events
        .iter()
        .find(|e| e["type"] == "tool_completed" && e["data"]["name"] == "expand_message")
        .expect("expand_message ran");
    assert_eq!(expanded["data"]["ok"], true, "{expanded}");
    let first_result = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["body"]["content"].as_str())
        .unwrap();
    let page = expanded["data"]["result"]["content"].as_str().unwrap();
    assert!(
        first_result.starts_with(page) && page.len() > 1000,
        "the page is the start of the first result"
    );
    // The newest turn is never compressed: the last request carries the last result whole.
    let last_result = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["body"]["content"].as_str())
        .unwrap();
    let last_request = turns.last().unwrap();
    assert!(
        last_request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["content"].as_str() == Some(last_result)),
        "the newest tool result is sent whole"
    );

    // The thread's next run starts from the stored summary, without summarising again.
    let body = json!({"input": "What did you find?", "thread_id": thread, "agent": {
        "model": "mock", "system_prompt": agentfleet_tests::mock_llm::script(json!([{"content": "ok"}])),
        "tools": [http_tool(&env, "text", "/text")], "max_iterations": 5}});
    let second = app.start_run(&body).await;
    let second_id = second["id"].as_str().unwrap().to_string();
    let done = app
        .wait_status(&second_id, &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        env.llm.state().summaries(),
        summaries,
        "the next run reused the summary"
    );
    let requests = env.llm.requests();
    let next = requests.last().unwrap();
    let sent = next["messages"].as_array().unwrap();
    assert!(
        sent.iter()
            .any(|m| m["content"].as_str().is_some_and(|c| c.contains(&stored))),
        "the next run's request carries the stored summary"
    );
    assert_eq!(
        sent.last().unwrap()["content"],
        "What did you find?",
        "and ends with the new input"
    );
    assert!(request_tokens(&bpe, next) <= CONTEXT_TOKENS - MAX_TOKENS);
}
