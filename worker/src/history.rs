//! The history the model sees, as a holding keeps it: the thread's messages, oldest first, each
//! also kept serialised. A model call sends the whole history every time, so a long run would
//! otherwise escape every string of it again at every call (`perf`, ten tool turns with 2 KB
//! results: the request's serialisation was a tenth of a worker's samples); with the JSON kept,
//! a call copies bytes. Each message is serialised once, when it joins.

use std::ops::Deref;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct History {
    messages: Vec<Value>,
    /// The messages' JSON, comma-separated: what goes between a request's `[` and `]`. `None`
    /// for messages built for one request (a compacted view, an XML rendering), serialised
    /// straight into that request's body instead.
    json: Option<Vec<u8>>,
}

impl Default for History {
    fn default() -> History {
        History {
            messages: Vec::new(),
            json: Some(Vec::new()),
        }
    }
}

impl History {
    /// Messages one request sends once: not kept serialised.
    pub fn for_one_request(messages: Vec<Value>) -> History {
        History {
            messages,
            json: None,
        }
    }

    pub fn push(&mut self, message: Value) {
        if let Some(json) = &mut self.json {
            if !self.messages.is_empty() {
                json.push(b',');
            }
            serde_json::to_writer(json, &message).expect("a JSON value serialises");
        }
        self.messages.push(message);
    }

    /// Bytes of the kept JSON (0 when it is not kept).
    pub fn json_len(&self) -> usize {
        self.json.as_ref().map_or(0, Vec::len)
    }

    /// Appends the messages' JSON, comma-separated (nothing for an empty history).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match &self.json {
            Some(json) => out.extend_from_slice(json),
            None => {
                for (i, message) in self.messages.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut *out, message).expect("a JSON value serialises");
                }
            }
        }
    }

    /// The messages, without the JSON: taken when this is the only holder, else copied.
    pub fn into_messages(this: std::sync::Arc<History>) -> Vec<Value> {
        match std::sync::Arc::try_unwrap(this) {
            Ok(history) => history.messages,
            Err(shared) => shared.messages.clone(),
        }
    }
}

impl From<Vec<Value>> for History {
    fn from(messages: Vec<Value>) -> History {
        let mut history = History {
            messages: Vec::with_capacity(messages.len()),
            json: Some(Vec::new()),
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
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn written(history: &History) -> String {
        let mut out = Vec::new();
        history.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// The kept JSON is the messages' own serialisation, whichever way they joined; messages
    /// for one request write the same bytes without keeping them.
    #[test]
    fn the_kept_json_is_the_messages_serialised() {
        let messages = vec![
            json!({"role": "user", "content": "hi \"there\"\n"}),
            json!({"role": "assistant", "content": null,
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "echo", "arguments": "{\"x\":1}"}}]}),
        ];
        let mut pushed = History::default();
        assert_eq!(written(&pushed), "");
        for m in messages.clone() {
            pushed.push(m);
        }
        let built = History::from(messages.clone());
        assert_eq!(pushed, built);
        let array = format!("[{}]", written(&built));
        assert_eq!(array, serde_json::to_string(&messages).unwrap());
        assert_eq!(built.json_len(), array.len() - 2);
        let once = History::for_one_request(messages.clone());
        assert_eq!(written(&once), written(&built));
        assert_eq!(once.json_len(), 0);
        assert_eq!(&*built, &messages[..]);

        let shared = Arc::new(built);
        let kept = Arc::clone(&shared);
        assert_eq!(
            History::into_messages(shared),
            messages,
            "copied while shared"
        );
        assert_eq!(History::into_messages(kept), messages, "taken when alone");
    }
}
