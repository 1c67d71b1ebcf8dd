//! Counting tokens the way a model does: with its tokenizer (`tiktoken-rs` encodings of the
//! OpenAI families), or an estimate of 4 bytes a token for a model configured with
//! `tokenizer = "estimate"`.
//!
//! Every count is bounded in CPU whatever a tool or model sent: text is tokenized in slices
//! (byte-pair merging is quadratic in the length of one word, and hostile text can be one
//! word), and past [`MAX_TOKENIZED_BYTES`] per text the rest counts one token a byte (an upper
//! bound: a token is at least one byte), so a huge text is over-counted, never under.

use serde_json::Value;

pub use agentfleet_shared::config::Tokenizer;

/// Tokens the chat format adds around each message (OpenAI's counting guide says 3; one more
/// covers a name or tool call id's framing).
pub const PER_MESSAGE: usize = 4;
/// Tokens priming the reply.
pub const REPLY_PRIMING: usize = 3;
/// Text tokenized exactly per text; beyond it, a byte counts as a token.
const MAX_TOKENIZED_BYTES: usize = 64 * 1024;
/// Text is tokenized in slices of at most this many bytes (a slice boundary may split a token
/// in two: the count is then one higher, never lower).
const SLICE_BYTES: usize = 1024;

/// Tokens of `text`.
pub fn count(tokenizer: Tokenizer, text: &str) -> usize {
    let (tokens, rest) = count_prefix(tokenizer, text);
    tokens + rest
}

/// Tokens of the first [`MAX_TOKENIZED_BYTES`] of `text`, and the bytes left uncounted.
pub fn count_prefix(tokenizer: Tokenizer, text: &str) -> (usize, usize) {
    let bpe = match tokenizer {
        Tokenizer::Estimate => return (text.len().div_ceil(4), 0),
        Tokenizer::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Tokenizer::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    };
    let mut rest = text;
    let mut tokens = 0;
    let mut budget = MAX_TOKENIZED_BYTES;
    while !rest.is_empty() && budget > 0 {
        let mut end = rest.len().min(SLICE_BYTES).min(budget);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            break;
        }
        tokens += bpe.encode_ordinary(&rest[..end]).len();
        budget -= end;
        rest = &rest[end..];
    }
    (tokens, rest.len())
}

/// At least the tokens `text` can be under any byte-level tokenizer (one a byte): the fast
/// check that spares tokenizing a history that fits anyway.
pub fn upper_bound(tokenizer: Tokenizer, text: &str) -> usize {
    upper_bound_of_len(tokenizer, text.len())
}

/// [`upper_bound`] of a text of `len` bytes.
pub fn upper_bound_of_len(tokenizer: Tokenizer, len: usize) -> usize {
    match tokenizer {
        Tokenizer::Estimate => len.div_ceil(4),
        _ => len,
    }
}

/// Bytes of `items` written as one compact JSON array (as `Value::Array(..).to_string()`
/// gives), counted without building the array or the string.
pub fn array_json_len<'a>(items: impl IntoIterator<Item = &'a Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let mut n: usize = 0;
    for item in items {
        serde_json::to_writer(&mut count, item).expect("a JSON value serializes");
        n += 1;
    }
    // The brackets and the commas between items.
    count.0 + 2 + n.saturating_sub(1)
}

/// The text of a chat message's content (a string, or the text parts of a list) and of its
/// tool calls: what `expand_message` reads back.
pub fn content_text(message: &Value) -> String {
    let mut text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    if let Some(calls) = message.get("tool_calls") {
        text.push_str(&calls.to_string());
    }
    text
}

/// All a chat message makes the model read: [`content_text`] and the id a tool result answers.
pub fn message_text(message: &Value) -> String {
    let mut text = content_text(message);
    if let Some(id) = message.get("tool_call_id").and_then(Value::as_str) {
        text.push(' ');
        text.push_str(id);
    }
    text
}

/// Tokens of one message, framing included.
pub fn message(tokenizer: Tokenizer, message: &Value) -> usize {
    count(tokenizer, &message_text(message)) + PER_MESSAGE
}

/// At least [`message`]'s count (see [`upper_bound`]).
pub fn message_upper_bound(tokenizer: Tokenizer, message: &Value) -> usize {
    upper_bound(tokenizer, &message_text(message)) + PER_MESSAGE
}

/// Tokens of a request's `tools` array (its JSON, which is what providers render).
pub fn tools(tokenizer: Tokenizer, tools: &[Value]) -> usize {
    if tools.is_empty() {
        return 0;
    }
    count(tokenizer, &Value::Array(tools.to_vec()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_arrays_json_length_is_counted_as_its_text_would_be() {
        let items = [
            json!({"type": "function", "function": {"name": "echo", "description": "é \"q\""}}),
            json!([1, 2.5, null, "x"]),
            json!("tail"),
        ];
        assert_eq!(
            array_json_len(&items),
            Value::Array(items.to_vec()).to_string().len()
        );
        assert_eq!(array_json_len(&items[..1]), items[0].to_string().len() + 2);
        assert_eq!(array_json_len(&[]), "[]".len());
    }

    #[test]
    fn counts_match_the_encodings() {
        // "hello world" is two tokens in both encodings.
        assert_eq!(count(Tokenizer::O200kBase, "hello world"), 2);
        assert_eq!(count(Tokenizer::Cl100kBase, "hello world"), 2);
        assert_eq!(count(Tokenizer::Estimate, "hello world"), 3);
        let m = json!({"role": "user", "content": "hello world"});
        assert_eq!(message(Tokenizer::O200kBase, &m), 2 + PER_MESSAGE);
        assert!(message_upper_bound(Tokenizer::O200kBase, &m) >= message(Tokenizer::O200kBase, &m));
    }

    #[test]
    fn huge_text_is_counted_in_bounded_time_and_never_under() {
        // One endless word: the worst case of byte-pair merging, sliced.
        let text = "a".repeat(MAX_TOKENIZED_BYTES + 4000);
        let n = count(Tokenizer::O200kBase, &text);
        assert!(n >= 4000 + 8, "{n}");
        assert!(n <= text.len(), "{n}");
    }

    #[test]
    fn tool_calls_and_ids_are_counted() {
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
        let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"});
        assert!(message(Tokenizer::O200kBase, &call) > PER_MESSAGE + 5);
        assert!(message(Tokenizer::O200kBase, &result) > PER_MESSAGE + 1);
    }
}
