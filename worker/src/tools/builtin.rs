//! Built-in tools. `complete` ends the run; `ask` pauses it for the user's answer. Both are
//! terminating: calls after them in the same response are skipped.

use serde_json::{Value, json};

pub const COMPLETE: &str = "complete";
pub const ASK: &str = "ask";

pub fn is_terminating(name: &str) -> bool {
    name == COMPLETE || name == ASK
}

pub fn definitions() -> Vec<Value> {
    vec![
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
}

pub fn ask_schema() -> Value {
    definitions()[1]["function"]["parameters"].clone()
}

pub fn complete_schema() -> Value {
    definitions()[0]["function"]["parameters"].clone()
}
