//! The history the model sees, as a holding keeps it: the thread's messages, oldest first, each
//! also kept serialised. A model call sends the whole history every time, so a long run would
//! otherwise escape every string of it again at every call (`perf`, ten tool turns with 2 KB
//! results: the request's serialisation was a tenth of a worker's samples); with the JSON kept,
//! a call copies bytes. Each message is serialised once, when it joins.

use std::ops::Deref;

use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    messages: Vec<Value>,
    /// The messages' JSON, comma-separated: what goes between a request's `[` and `]`.
    json: Vec<u8>,
}

impl History {
    pub fn push(&mut self, message: Value) {
        if !self.messages.is_empty() {
            self.json.push(b',');
        }
        serde_json::to_writer(&mut self.json, &message).expect("a JSON value serialises");
        self.messages.push(message);
    }

    /// The messages' JSON, comma-separated (empty for an empty history).
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    pub fn into_messages(self) -> Vec<Value> {
        self.messages
    }
}

impl From<Vec<Value>> for History {
    fn from(messages: Vec<Value>) -> History {
        let mut history = History {
            messages: Vec::with_capacity(messages.len()),
            json: Vec::new(),
        };
        for message in messages {
            history.push(message);
        }
        history
    }
}

impl Deref for History {
    type Target = [Value];

    fn deref(&self) -> &[Value] {
        &self.messages
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The kept JSON is the messages' own serialisation, whichever way they joined.
    #[test]
    fn the_kept_json_is_the_messages_serialised() {
        let messages = vec![
            json!({"role": "user", "content": "hi \"there\"\n"}),
            json!({"role": "assistant", "content": null,
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "echo", "arguments": "{\"x\":1}"}}]}),
        ];
        let mut pushed = History::default();
        assert_eq!(pushed.json(), b"");
        for m in messages.clone() {
            pushed.push(m);
        }
        let built = History::from(messages.clone());
        assert_eq!(pushed, built);
        let array = format!("[{}]", String::from_utf8(built.json().to_vec()).unwrap());
        assert_eq!(
            serde_json::from_str::<Value>(&array).unwrap(),
            json!(messages)
        );
        assert_eq!(array, serde_json::to_string(&messages).unwrap());
        assert_eq!(&*built, &messages[..]);
        assert_eq!(built.into_messages(), messages);
    }
}
