//! Built-in tools. `complete` ends the run; `ask` pauses it for the user's answer. Both are
//! terminating: calls after them in the same response are skipped. `expand_message` reads
//! back a message compaction shortened (`context_window`); it is offered once there is one.

use std::sync::LazyLock;

use serde_json::{Value, json};

use super::http::HttpOutcome;

pub const COMPLETE: &str = "complete";
pub const ASK: &str = "ask";
pub const EXPAND_MESSAGE: &str = "expand_message";

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
