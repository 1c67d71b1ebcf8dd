//! Built-in tools. `complete` ends the run; `ask` pauses it for the user's answer. Both are
//! terminating: calls after them in the same response are skipped. `expand_message` reads
//! back a message compaction shortened (`context_window`); it is offered once there is one.

use std::sync::LazyLock;

use serde_json::{Value, json};

use super::http::HttpOutcome;

pub const COMPLETE: &str = "complete";
pub const ASK: &str = "ask";
pub const EXPAND_MESSAGE: &str = "expand_message";
/// A plan-and-solve planner's call that fans a round of tasks out (offered to planners only).
pub const PLAN: &str = "plan";

pub fn is_terminating(name: &str) -> bool {
    name == COMPLETE || name == ASK
}

/// `complete` and `ask` as a chat-completions request offers them, built once: every model
/// call offers them.
pub fn definitions() -> &'static [Value] {
    static DEFINITIONS: LazyLock<[Value; 2]> = LazyLock::new(|| {
        [
            json!({"type": "function", "function": {
                "name": COMPLETE,
                "description": "Call when the task is done. Ends the run.",
                "parameters": {"type": "object", "properties": {
                    "summary": {"type": "string", "description": "What was achieved."}}}
            }}),
            json!({"type": "function", "function": {
                "name": ASK,
                "description": "Ask the user a question and wait for the answer.",
                "parameters": {"type": "object", "properties": {
                    "text": {"type": "string", "description": "The question."},
                    "attachments": {"type": "array", "items": {"type": "string"}}
                }, "required": ["text"]}
            }}),
        ]
    });
    &*DEFINITIONS
}

/// What a planner is offered: `plan` and `complete`, built once.
pub fn planner_definitions() -> &'static [Value] {
    static DEFINITIONS: LazyLock<[Value; 2]> = LazyLock::new(|| {
        [
            json!({"type": "function", "function": {
                "name": PLAN,
                "description": "Start a round of tasks. Each task is worked on by an executor \
                    agent, the tasks of a round in parallel; the result of this call is the \
                    outcome of every task. Then plan the next round or call `complete`.",
                "parameters": plan_schema()
            }}),
            definitions()[0].clone(),
        ]
    });
    &*DEFINITIONS
}

fn plan_schema() -> Value {
    json!({"type": "object", "properties": {
        "tasks": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "title": {"type": "string", "description": "A short name for the task."},
            "input": {"type": "string", "description": "Everything the executor needs to do it."}
        }, "required": ["title", "input"]}},
        "note": {"type": "string", "description": "Why this round (optional)."}
    }, "required": ["tasks"]})
}

/// Most bytes of a task's title and input.
const MAX_TITLE_BYTES: usize = 200;

/// The tasks of a `plan` call's arguments, or the error the model reads: the arguments'
/// shape, 1 to `max_tasks` tasks, a title and input for each, and a round left
/// (`rounds_done` < `max_rounds`). `max_input_bytes` bounds each task's input.
pub fn check_plan(
    raw: &str,
    max_tasks: u32,
    rounds_done: i32,
    max_rounds: u32,
    max_input_bytes: usize,
) -> Result<Vec<agentfleet_shared::store::plans::NewTask>, String> {
    use agentfleet_shared::store::plans::NewTask;
    if rounds_done >= max_rounds as i32 {
        return Err(format!(
            "no round left: this plan allows {max_rounds} rounds and all were used; call \
             `complete`"
        ));
    }
    let args: Value = serde_json::from_str(raw)
        .map_err(|_| "the arguments must be a JSON object: {\"tasks\": [...]}".to_owned())?;
    let Some(tasks) = args.get("tasks").and_then(Value::as_array) else {
        return Err("`tasks` must be an array of {\"title\", \"input\"} objects".into());
    };
    if tasks.is_empty() {
        return Err("`tasks` is empty: give at least one task, or call `complete`".into());
    }
    if tasks.len() > max_tasks as usize {
        return Err(format!(
            "{} tasks given, at most {max_tasks} per round: split the work into fewer tasks",
            tasks.len()
        ));
    }
    tasks
        .iter()
        .enumerate()
        .map(|(i, task)| {
            let text = |field: &str| {
                task.get(field)
                    .and_then(Value::as_str)
                    .map(|s| s.replace('\0', ""))
                    .filter(|s| !s.trim().is_empty())
                    .ok_or_else(|| format!("tasks[{i}].{field} must be a non-empty string"))
            };
            let (mut title, input) = (text("title")?, text("input")?);
            if input.len() > max_input_bytes {
                return Err(format!(
                    "tasks[{i}].input is longer than {max_input_bytes} bytes"
                ));
            }
            if title.len() > MAX_TITLE_BYTES {
                let mut end = MAX_TITLE_BYTES;
                while !title.is_char_boundary(end) {
                    end -= 1;
                }
                title.truncate(end);
            }
            Ok(NewTask { title, input })
        })
        .collect()
}

pub fn ask_schema() -> &'static Value {
    &definitions()[1]["function"]["parameters"]
}

pub fn complete_schema() -> &'static Value {
    &definitions()[0]["function"]["parameters"]
}

pub fn expand_parameters() -> Value {
    json!({"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^m[0-9]{1,9}$",
               "description": "The id a compressed message names, e.g. \"m12\"."},
        "offset": {"type": "integer", "minimum": 0,
                   "description": "Byte offset to read from (for long messages; default 0)."}
    }, "required": ["id"], "additionalProperties": false})
}

pub const EXPAND_DESCRIPTION: &str = "Read back, whole, a message of this conversation that was \
    compressed to fit the context window. Long messages come in pages: call again with \
    `offset` set to the `next_offset` of the previous page.";

/// The `expand_message` definition of a chat-completions request.
pub fn expand_definition() -> Value {
    json!({"type": "function", "function": {
        "name": EXPAND_MESSAGE, "description": EXPAND_DESCRIPTION, "parameters": expand_parameters()
    }})
}

/// Answers `expand_message` from the thread's whole history (`history`, as the worker holds
/// it): at most `max_bytes` of the message's text from `offset`.
pub fn expand(history: &[Value], args: &Value, max_bytes: usize) -> HttpOutcome {
    let id = args["id"].as_str().unwrap_or_default();
    let offset = args["offset"].as_u64().unwrap_or(0) as usize;
    let Some(message) =
        crate::context_window::position(id).and_then(|position| history.get(position))
    else {
        let error = format!("no message `{id}` in this conversation");
        return HttpOutcome {
            ok: false,
            result: json!({"error": error}),
            model_content: json!({"error": error}).to_string(),
            truncated: false,
        };
    };
    let text = crate::tokens::content_text(message);
    let mut start = offset.min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = start.saturating_add(max_bytes).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let next = (end < text.len()).then_some(end);
    let result = json!({
        "id": id,
        "role": message.get("role"),
        "offset": start,
        "next_offset": next,
        "total_bytes": text.len(),
        "content": &text[start..end],
    });
    HttpOutcome {
        ok: true,
        model_content: result.to_string(),
        result,
        truncated: next.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_calls_are_checked_with_errors_the_model_can_act_on() {
        let ok = r#"{"tasks": [{"title": "a", "input": "do a"}, {"title": "b", "input": "do b"}]}"#;
        let tasks = check_plan(ok, 2, 0, 5, 1000).unwrap();
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[1].input, "do b");
        let err =
            |raw: &str, max_tasks, done| check_plan(raw, max_tasks, done, 5, 1000).unwrap_err();
        assert!(
            err(ok, 1, 0).contains("at most 1 per round"),
            "{}",
            err(ok, 1, 0)
        );
        assert!(err(r#"{"tasks": []}"#, 4, 0).contains("empty"));
        assert!(err("not json", 4, 0).contains("JSON object"));
        assert!(err(r#"{"tasks": "x"}"#, 4, 0).contains("array"));
        assert!(err(r#"{"tasks": [{"title": "a"}]}"#, 4, 0).contains("tasks[0].input"));
        assert!(err(ok, 4, 5).contains("no round left"));
        let long = format!(
            r#"{{"tasks": [{{"title": "a", "input": "{}"}}]}}"#,
            "x".repeat(2000)
        );
        assert!(err(&long, 4, 0).contains("longer than"));
    }

    #[test]
    fn expand_pages_through_a_message_and_refuses_unknown_ids() {
        let history = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "é".repeat(300)}),
        ];
        let first = expand(&history, &json!({"id": "m1"}), 256);
        assert!(first.ok);
        let next = first.result["next_offset"].as_u64().unwrap();
        assert!(next <= 256 && next > 200, "{next}");
        let second = expand(&history, &json!({"id": "m1", "offset": next}), 1024);
        let whole = format!(
            "{}{}",
            first.result["content"].as_str().unwrap(),
            second.result["content"].as_str().unwrap()
        );
        assert!(whole.starts_with(&"é".repeat(300)), "{whole}");
        assert!(second.result["next_offset"].is_null());
        for bad in ["m2", "x", "m"] {
            let out = expand(&history, &json!({"id": bad}), 256);
            assert!(!out.ok, "{bad}");
        }
    }
}
