//! Parsing an OpenAI-compatible chat-completions stream: each SSE `data:` payload is folded
//! into the answer so far. No I/O happens here (`model_call` reads the stream and forwards the
//! text), so every rule of the format is unit-tested below.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use agentfleet_shared::sanitize::strip_nul_in;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Token usage as the provider reported it (never negative; see [`ChunkUsage`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

#[derive(Debug, Clone)]
pub struct ModelResponse {
    pub content: String,
    pub tool_calls: Vec<ModelToolCall>,
    /// `None`: the provider sent no usage (the worker then estimates it).
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Malformed(String),
    #[error("the stream ended before the response was complete")]
    Truncated,
}

/// One `data:` payload. Read without building what is not used: a payload of millions of
/// empty choices, call pieces or `usage` arrays would otherwise take many times its own size
/// in memory (an 8 MiB chunk, ~200 MB of `Choice`s).
#[derive(Deserialize)]
struct Chunk {
    #[serde(default, deserialize_with = "choices")]
    choices: Vec<Choice>,
    /// Any JSON: an odd value is ignored, not fatal.
    #[serde(default)]
    usage: ChunkUsage,
}

/// Choices one payload may carry (a stream asks for one), and tool-call pieces one choice may
/// (the most calls a response may make, `worker.max_tool_calls_per_response`, is 1024).
const MAX_CHOICES: usize = 16;
const MAX_CALL_PIECES: usize = 1024;

fn choices<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Choice>, D::Error> {
    d.deserialize_seq(AtMost(MAX_CHOICES, std::marker::PhantomData))
}

fn call_pieces<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ToolCallDelta>, D::Error> {
    d.deserialize_seq(AtMost(MAX_CALL_PIECES, std::marker::PhantomData))
}

/// A list of at most `.0` items; a longer one fails the payload as it is read.
struct AtMost<T>(usize, std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for AtMost<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a list of at most {} items", self.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            if items.len() == self.0 {
                return Err(serde::de::Error::custom(format!(
                    "a list of more than {} items",
                    self.0
                )));
            }
            items.push(item);
        }
        Ok(items)
    }
}

/// An OpenAI `usage` object read leniently: a hostile or broken provider's figure that is
/// negative, fractional, absurdly large or not a number never fails the call. Each count is
/// read as a non-negative `i64` (saturating; anything else counts 0) and clamped further where
/// it is recorded. `None` when `usage` is not an object (absent, `null`, anything else, read
/// without being built).
#[derive(Default)]
struct ChunkUsage(Option<Usage>);

impl<'de> Deserialize<'de> for ChunkUsage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ChunkUsage, D::Error> {
        d.deserialize_any(Lenient(ChunkUsage, ChunkUsage(None)))
    }
}

/// One count of `usage`.
struct Count(i64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
        d.deserialize_any(Lenient(|_| Count(0), Count(0)))
    }
}

/// Reads any JSON value: an object as `usage` (through `.0`), a number as a [`Count`], anything
/// else (consumed, not built) as `.1`.
struct Lenient<F, V>(F, V);

impl<'de, F: FnOnce(Option<Usage>) -> V, V: FromCount> Visitor<'de> for Lenient<F, V> {
    type Value = V;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<V, A::Error> {
        let mut usage = Usage::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "prompt_tokens" => usage.prompt_tokens = map.next_value::<Count>()?.0,
                "completion_tokens" => usage.completion_tokens = map.next_value::<Count>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((self.0)(Some(usage)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<V, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.1)
    }

    fn visit_i64<E>(self, v: i64) -> Result<V, E> {
        Ok(V::from_count(v.max(0)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<V, E> {
        Ok(V::from_count(i64::try_from(v).unwrap_or(i64::MAX)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<V, E> {
        // `as` saturates, and NaN becomes 0.
        Ok(V::from_count((v as i64).max(0)))
    }

    fn visit_bool<E>(self, _: bool) -> Result<V, E> {
        Ok(self.1)
    }

    fn visit_str<E>(self, _: &str) -> Result<V, E> {
        Ok(self.1)
    }

    fn visit_unit<E>(self) -> Result<V, E> {
        Ok(self.1)
    }

    fn visit_none<E>(self) -> Result<V, E> {
        Ok(self.1)
    }
}

/// What a number read by [`Lenient`] makes: a count, or no `usage`.
trait FromCount {
    fn from_count(n: i64) -> Self;
}

impl FromCount for Count {
    fn from_count(n: i64) -> Count {
        Count(n)
    }
}

impl FromCount for ChunkUsage {
    fn from_count(_: i64) -> ChunkUsage {
        ChunkUsage(None)
    }
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default, deserialize_with = "call_pieces")]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// Default of `worker.max_tool_calls_per_response`.
pub const DEFAULT_MAX_TOOL_CALLS: usize = 128;

/// The answer so far. Tool calls arrive in pieces keyed by `index`: the id and name once, the
/// arguments as fragments to concatenate.
pub struct StreamParser {
    content: String,
    calls: BTreeMap<usize, ModelToolCall>,
    /// More distinct calls than this make the response malformed: each becomes a row, a
    /// dispatch and a result in the next request, and a stream of tiny chunks with a new
    /// `index` each would otherwise ask for hundreds of thousands of them.
    max_calls: usize,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    done: bool,
}

impl Default for StreamParser {
    fn default() -> Self {
        StreamParser::new(DEFAULT_MAX_TOOL_CALLS)
    }
}

impl StreamParser {
    pub fn new(max_calls: usize) -> StreamParser {
        StreamParser {
            content: String::new(),
            calls: BTreeMap::new(),
            max_calls,
            usage: None,
            finish_reason: None,
            done: false,
        }
    }

    /// Folds one `data:` payload in; returns the text it added, to forward to clients.
    pub fn feed(&mut self, data: &str) -> Result<Option<String>, StreamError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| StreamError::Malformed(format!("{e}: {}", truncate(data, 200))))?;
        if let Some(u) = chunk.usage.0 {
            self.usage = Some(u);
        }
        let mut added = String::new();
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                self.content.push_str(&text);
                added.push_str(&text);
            }
            for tc in choice.delta.tool_calls {
                if self.calls.len() == self.max_calls && !self.calls.contains_key(&tc.index) {
                    return Err(StreamError::Malformed(format!(
                        "more than {} tool calls in one response",
                        self.max_calls
                    )));
                }
                let entry = self.calls.entry(tc.index).or_insert_with(|| ModelToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                if let Some(id) = tc.id {
                    entry.id = id;
                }
                if let Some(f) = tc.function {
                    if let Some(n) = f.name {
                        entry.name.push_str(&n);
                    }
                    if let Some(a) = f.arguments {
                        entry.arguments.push_str(&a);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                self.finish_reason = choice.finish_reason;
            }
        }
        Ok((!added.is_empty()).then_some(added))
    }

    /// `[DONE]` was read: nothing more belongs to this response.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The complete response, once the stream has ended. A stream that ended without `[DONE]`
    /// or a finish reason was cut off; a tool call without a name cannot be executed; a call
    /// without an id gets one (some providers omit it); NUL characters, which Postgres cannot
    /// store, are removed.
    pub fn finish(self) -> Result<ModelResponse, StreamError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(StreamError::Truncated);
        }
        let mut content = self.content;
        strip_nul_in(&mut content);
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, mut call) in self.calls {
            strip_nul_in(&mut call.id);
            strip_nul_in(&mut call.name);
            strip_nul_in(&mut call.arguments);
            if call.name.is_empty() {
                return Err(StreamError::Malformed(format!(
                    "tool call #{index} has no function name"
                )));
            }
            if call.id.is_empty() {
                call.id = format!("call_{index}_{}", uuid::Uuid::new_v4().simple());
            }
            tool_calls.push(call);
        }
        Ok(ModelResponse {
            content,
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason,
        })
    }
}

/// `s` cut to at most `max` bytes on a character boundary, marked with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feed_all(chunks: &[serde_json::Value]) -> StreamParser {
        let mut p = StreamParser::default();
        for c in chunks {
            p.feed(&c.to_string()).unwrap();
        }
        p
    }

    #[test]
    fn a_payload_of_too_many_choices_or_call_pieces_is_malformed_and_odd_usage_is_skipped() {
        let mut p = StreamParser::default();
        let choices = vec![json!({}); MAX_CHOICES + 1];
        let err = p
            .feed(&json!({"choices": choices}).to_string())
            .unwrap_err();
        assert!(err.to_string().contains("more than 16 items"), "{err}");
        let pieces = vec![json!({"index": 0}); MAX_CALL_PIECES + 1];
        let chunk = json!({"choices": [{"delta": {"tool_calls": pieces}}]});
        assert!(p.feed(&chunk.to_string()).is_err());
        // A `usage` of any other shape is read past, not kept; the counts of an object are.
        let mut p = StreamParser::default();
        let odd = json!({"choices": [], "usage": [[[]], {"a": [1, 2]}, "x"]});
        p.feed(&odd.to_string()).unwrap();
        assert_eq!(p.usage, None);
        let nested = json!({"choices": [], "usage": {"x": {"prompt_tokens": 9},
                            "prompt_tokens": {"deep": 1}, "completion_tokens": 3.7}});
        p.feed(&nested.to_string()).unwrap();
        assert_eq!(
            p.usage,
            Some(Usage {
                prompt_tokens: 0,
                completion_tokens: 3
            })
        );
    }

    #[test]
    fn more_distinct_calls_than_the_limit_are_malformed_and_pieces_of_known_ones_are_not() {
        let call = |index: usize| {
            json!({"choices": [{"delta": {"tool_calls": [
                {"index": index, "function": {"name": "f", "arguments": "{}"}}]}}]})
            .to_string()
        };
        let mut p = StreamParser::new(2);
        p.feed(&call(0)).unwrap();
        p.feed(&call(7)).unwrap();
        // More pieces of a call already open are fine at the limit.
        p.feed(&call(0)).unwrap();
        let err = p.feed(&call(8)).unwrap_err();
        assert_eq!(err.to_string(), "more than 2 tool calls in one response");
    }

    #[test]
    fn text_deltas_are_forwarded_and_concatenated() {
        let mut p = StreamParser::default();
        let a = p.feed(&json!({"choices": [{"delta": {"content": "Hel"}}]}).to_string());
        let b = p.feed(&json!({"choices": [{"delta": {"content": ""}}]}).to_string());
        let c = p.feed(
            &json!({"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]})
                .to_string(),
        );
        assert_eq!(
            (a, b, c),
            (Ok(Some("Hel".into())), Ok(None), Ok(Some("lo".into())))
        );
        assert_eq!(p.feed(" [DONE] "), Ok(None));
        assert!(p.is_done());
        let r = p.finish().unwrap();
        assert_eq!(r.content, "Hello");
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        assert!(r.tool_calls.is_empty());
    }

    #[test]
    fn tool_calls_are_assembled_by_index_from_fragments() {
        let p = feed_all(&[
            json!({"choices": [{"delta": {"tool_calls": [
                {"index": 1, "id": "call_b", "function": {"name": "second", "arguments": ""}},
                {"index": 0, "id": "call_a", "function": {"name": "first", "arguments": "{\"x\":"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}],
                   "usage": {"prompt_tokens": 12, "completion_tokens": 5}}),
        ]);
        let r = p.finish().unwrap();
        let calls: Vec<(&str, &str, &str)> = r
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [("call_a", "first", "{\"x\":1}"), ("call_b", "second", "{}")]
        );
        assert_eq!(
            r.usage,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 5
            })
        );
    }

    #[test]
    fn usage_is_absent_unless_sent_and_hostile_figures_are_bounded() {
        let done = json!({"choices": [{"delta": {}, "finish_reason": "stop"}]});
        // `usage: null` is what OpenAI puts in every chunk but the last.
        let none = feed_all(&[json!({"choices": [], "usage": null}), done.clone()]);
        assert_eq!(none.finish().unwrap().usage, None);
        let hostile = feed_all(&[
            done,
            json!({"choices": [], "usage": {"prompt_tokens": -5, "completion_tokens": 1e300}}),
        ]);
        assert_eq!(
            hostile.finish().unwrap().usage,
            Some(Usage {
                prompt_tokens: 0,
                completion_tokens: i64::MAX
            })
        );
        let odd = feed_all(
            &[json!({"choices": [{"delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": "many", "completion_tokens": 18446744073709551615u64}})],
        );
        assert_eq!(
            odd.finish().unwrap().usage,
            Some(Usage {
                prompt_tokens: 0,
                completion_tokens: i64::MAX
            })
        );
        let mut p = StreamParser::default();
        assert_eq!(
            p.feed(r#"{"choices": [], "usage": 7}"#),
            Ok(None),
            "ignored"
        );
    }

    #[test]
    fn a_call_without_an_id_gets_one_and_a_call_without_a_name_is_malformed() {
        let named = feed_all(&[json!({"choices": [{"delta": {"tool_calls": [
            {"index": 0, "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]})]);
        let call = &named.finish().unwrap().tool_calls[0];
        assert!(call.id.starts_with("call_0_"), "{}", call.id);
        let nameless = feed_all(&[json!({"choices": [{"delta": {"tool_calls": [
            {"index": 3, "id": "c", "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}]})]);
        assert_eq!(
            nameless.finish().unwrap_err(),
            StreamError::Malformed("tool call #3 has no function name".into())
        );
    }

    #[test]
    fn a_stream_without_done_or_finish_reason_is_truncated() {
        let p = feed_all(&[json!({"choices": [{"delta": {"content": "half an ans"}}]})]);
        assert_eq!(p.finish().unwrap_err(), StreamError::Truncated);
        // A finish reason without [DONE] is a complete answer (some servers just close).
        let p = feed_all(&[
            json!({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}),
        ]);
        assert_eq!(p.finish().unwrap().content, "ok");
    }

    #[test]
    fn a_payload_that_is_not_a_chunk_is_malformed_and_quoted_briefly() {
        let mut p = StreamParser::default();
        let long = format!("{{not json {}", "x".repeat(500));
        let Err(StreamError::Malformed(msg)) = p.feed(&long) else {
            panic!("accepted garbage");
        };
        assert!(msg.ends_with('…') && msg.len() < 320, "{msg}");
        // Unknown fields and chunks without choices (usage-only) are fine.
        assert_eq!(
            p.feed(r#"{"id": "x", "object": "chunk", "choices": []}"#),
            Ok(None)
        );
    }

    #[test]
    fn nul_characters_are_removed_from_everything_stored() {
        let p = feed_all(&[
            json!({"choices": [{"delta": {"content": "a\u{0}b", "tool_calls": [
            {"index": 0, "id": "c\u{0}1", "function": {"name": "f\u{0}", "arguments": "{\"x\": \"\u{0}\"}"}}]},
            "finish_reason": "tool_calls"}]}),
        ]);
        let r = p.finish().unwrap();
        assert_eq!(r.content, "ab");
        assert_eq!(
            r.tool_calls[0],
            ModelToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{\"x\": \"\"}".into(),
            }
        );
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("abc", 3), "abc");
    }
}
