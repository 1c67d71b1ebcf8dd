//! A model call's token usage: the provider's figures when it reports them, else an estimate
//! made with a real tokenizer (`o200k_base`, the encoding of current OpenAI models), recorded
//! as estimated so nobody reads it as a bill.

use serde_json::Value;

use crate::model_call::{Messages, ModelResponse, Usage};

/// Tokens per message the chat format adds around its content (OpenAI's own counting guide
/// uses 3, plus 3 priming the reply).
const PER_MESSAGE: i64 = 3;
const REPLY_PRIMING: i64 = 3;

/// What one model call used, and whether it is an estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnUsage {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub estimated: bool,
}

impl TurnUsage {
    pub const ZERO: TurnUsage = TurnUsage {
        prompt_tokens: 0,
        completion_tokens: 0,
        estimated: false,
    };

    /// Both calls' figures (an estimate if either is one).
    pub fn plus(self, other: TurnUsage) -> TurnUsage {
        TurnUsage {
            prompt_tokens: self.prompt_tokens.saturating_add(other.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_add(other.completion_tokens),
            estimated: self.estimated || other.estimated,
        }
    }

    /// A non-streaming answer's `usage`, when it has both figures as non-negative integers.
    pub fn reported(answer: &Value) -> Option<TurnUsage> {
        let figure = |k: &str| answer["usage"][k].as_i64().filter(|n| *n >= 0);
        Some(TurnUsage {
            prompt_tokens: figure("prompt_tokens")?,
            completion_tokens: figure("completion_tokens")?,
            estimated: false,
        })
    }

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

/// What the chat format adds to the prompt of a call of `messages` messages.
pub fn chat_overhead(messages: i64) -> i64 {
    messages * PER_MESSAGE + REPLY_PRIMING
}

/// The provider's usage, or an estimate over the request's messages and tools and the
/// response. The tokenizer is built once per process, on first use (it takes a while), on a
/// blocking thread, as is every estimate: it is CPU work the run's task must not stall on.
pub async fn of_call(messages: &Messages, tools: &[Value], response: &ModelResponse) -> TurnUsage {
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
        .map(crate::tokens::message_text)
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
        prompt_tokens: prompt + chat_overhead(messages),
        completion_tokens: completion,
        estimated: true,
    }
}

/// Tokens of `text` under `o200k_base`: the first 64 KiB tokenized, the rest at 4 bytes a
/// token (an estimate of usage, not a bound).
fn count_tokens(text: &str) -> i64 {
    let (tokens, rest) = crate::tokens::count_prefix(crate::tokens::Tokenizer::O200kBase, text);
    (tokens + rest.div_ceil(4)) as i64
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
        let messages = Messages::from(vec![json!({"role": "user", "content": "hello world"})]);
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
        let text = "a".repeat(64 * 1024 + 4000);
        let n = count_tokens(&text);
        assert!(n >= 1000 + 8, "{n}");
        assert!(n < (64 * 1024 / 2) as i64, "{n}");
    }
}
