//! A model call's token usage: the provider's figures when it reports them, else an estimate
//! made with a real tokenizer (`o200k_base`, the encoding of current OpenAI models), recorded
//! as estimated so nobody reads it as a bill.

use serde_json::Value;

use crate::model_call::{ModelResponse, Usage};

/// Tokens per message the chat format adds around its content (OpenAI's own counting guide
/// uses 3, plus 3 priming the reply).
const PER_MESSAGE: i64 = 3;
const REPLY_PRIMING: i64 = 3;
/// Text tokenized exactly per message or call; beyond it, 4 bytes count as a token. Bounds
/// the CPU one estimate may take whatever a provider or a tool sends (prompts are bounded by
/// the context window anyway; a completion only by `worker.max_model_response_bytes`).
const MAX_TOKENIZED_BYTES: usize = 64 * 1024;
/// Text is tokenized in slices of at most this many bytes: byte-pair merging is quadratic in
/// the length of one word, and hostile text can be one word long (a slice boundary may split
/// a token: an estimate can afford that).
const SLICE_BYTES: usize = 1024;

/// What one model call used, and whether it is an estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnUsage {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub estimated: bool,
}

impl TurnUsage {
    /// Each figure within `0..=MAX_TURN_TOKENS`: what is recorded and announced.
    pub fn bounded(self) -> TurnUsage {
        let bound = |n: i64| n.clamp(0, agentfleet_shared::store::turns::MAX_TURN_TOKENS);
        TurnUsage {
            prompt_tokens: bound(self.prompt_tokens),
            completion_tokens: bound(self.completion_tokens),
            estimated: self.estimated,
        }
    }
}

/// The provider's usage, or an estimate over the request's messages and tools and the
/// response. The tokenizer is built once per process, on first use (it takes a while), on a
/// blocking thread, as is every estimate: it is CPU work the run's task must not stall on.
pub async fn of_call(messages: &[Value], tools: &[Value], response: &ModelResponse) -> TurnUsage {
    if let Some(Usage {
        prompt_tokens,
        completion_tokens,
    }) = response.usage
    {
        return TurnUsage {
            prompt_tokens,
            completion_tokens,
            estimated: false,
        };
    }
    let prompt: Vec<String> = messages
        .iter()
        .map(message_text)
        .chain(tools.iter().map(Value::to_string))
        .collect();
    let completion: Vec<String> = std::iter::once(response.content.clone())
        .chain(
            response
                .tool_calls
                .iter()
                .flat_map(|c| [c.name.clone(), c.arguments.clone()]),
        )
        .collect();
    let messages = messages.len() as i64;
    let bytes = |texts: &[String]| {
        texts
            .iter()
            .map(|t| t.len().div_ceil(4) as i64)
            .sum::<i64>()
    };
    // A panic in the tokenizer must not fail the run: then 4 bytes count as a token.
    let fallback = (bytes(&prompt), bytes(&completion));
    let (prompt, completion) = tokio::task::spawn_blocking(move || {
        let count = |texts: &[String]| texts.iter().map(|t| count_tokens(t)).sum::<i64>();
        (count(&prompt), count(&completion))
    })
    .await
    .unwrap_or(fallback);
    TurnUsage {
        prompt_tokens: prompt + messages * PER_MESSAGE + REPLY_PRIMING,
        completion_tokens: completion,
        estimated: true,
    }
}

/// The text of a chat message the model reads: its content (a string, or the text parts of a
/// list) and any tool calls it carries.
fn message_text(message: &Value) -> String {
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

/// Tokens of `text` under `o200k_base`: the first [`MAX_TOKENIZED_BYTES`] tokenized, the
/// rest at 4 bytes a token.
fn count_tokens(text: &str) -> i64 {
    let bpe = tiktoken_rs::o200k_base_singleton();
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
        tokens += bpe.encode_ordinary(&rest[..end]).len() as i64;
        budget -= end;
        rest = &rest[end..];
    }
    tokens + rest.len().div_ceil(4) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn response(content: &str, usage: Option<Usage>) -> ModelResponse {
        ModelResponse {
            content: content.into(),
            tool_calls: vec![],
            usage,
            finish_reason: Some("stop".into()),
        }
    }

    #[tokio::test]
    async fn the_providers_figures_win_and_an_estimate_is_marked() {
        let messages = [json!({"role": "user", "content": "hello world"})];
        let reported = Usage {
            prompt_tokens: 11,
            completion_tokens: 22,
        };
        let u = of_call(&messages, &[], &response("hi there", Some(reported))).await;
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.estimated),
            (11, 22, false)
        );
        let u = of_call(&messages, &[], &response("hi there", None)).await;
        // "hello world" and "hi there" are two tokens each in o200k_base.
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.estimated),
            (2 + PER_MESSAGE + REPLY_PRIMING, 2, true)
        );
    }

    #[test]
    fn huge_text_is_counted_in_bounded_time() {
        // One endless word: the worst case of byte-pair merging, sliced.
        let text = "a".repeat(MAX_TOKENIZED_BYTES + 4000);
        let n = count_tokens(&text);
        assert!(n >= 1000 + 8, "{n}");
        assert!(n < (MAX_TOKENIZED_BYTES / 2) as i64, "{n}");
    }
}
