//! `[models.<name>]`: the models an agent may name, by the name clients use.

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// OpenAI-compatible base URL, e.g. `https://api.openai.com/v1` (requests go to
    /// `{base_url}/chat/completions`); `http://` or `https://`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <api_key>`; empty sends none. A secret.
    #[serde(default)]
    pub api_key: String,
    /// The model id sent upstream, e.g. `gpt-4o-mini`; not empty.
    pub model: String,
    /// `max_tokens` of every request (left out when unset); also what the context budget keeps free
    /// for the answer (4096 when unset).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `temperature` of every request (left out when unset).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// The model's context window in tokens: a run's requests are kept within it, less the answer's
    /// `max_tokens`, by compressing and summarising its history (`[context]`).
    #[serde(default = "default_context_tokens")]
    pub context_tokens: usize,
    /// How the worker counts this model's tokens to keep requests within `context_tokens`.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// How the model calls tools (docs/tools.md, "Models without native tool calls").
    #[serde(default)]
    pub tool_calling: ToolCalling,
    /// Speak HTTP/2 only: on an `http://` URL without negotiating it (h2c with prior knowledge),
    /// on `https://` as the only protocol offered. For a gateway that supports it, many model
    /// streams share one connection (`worker.model_streams_per_connection`) instead of one
    /// connection each. When false, `http://` speaks HTTP/1.1 and `https://` negotiates.
    #[serde(default)]
    pub http2: bool,
    /// `chat_completions_url`'s answer, parsed at its first call.
    #[serde(skip)]
    chat_url: std::sync::OnceLock<Option<url::Url>>,
}

impl ModelSettings {
    /// `{base_url}/chat/completions`, parsed once for the life of the settings (reqwest would
    /// parse the text again on every call). `None` when it does not parse: the caller passes
    /// the text on and reqwest names the error.
    pub fn chat_completions_url(&self) -> Option<&url::Url> {
        self.chat_url
            .get_or_init(|| url::Url::parse(&self.chat_completions_text()).ok())
            .as_ref()
    }

    /// `{base_url}/chat/completions` as text.
    pub fn chat_completions_text(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

/// How a model calls tools (docs/tools.md, "Models without native tool calls").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCalling {
    /// The request's `tools`, the answer's `tool_calls`.
    #[default]
    Native,
    /// Described in the system prompt, written in the answer's text: for models without
    /// native tool calls.
    Xml,
}

/// A model's tokenizer: the exact encoding of OpenAI-family models, or an estimate of 4 bytes
/// a token for models whose tokenizer the worker does not have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// GPT-4o, GPT-4.1, o-series and later.
    #[default]
    O200kBase,
    /// GPT-4, GPT-3.5.
    Cl100kBase,
    /// 4 bytes a token: an estimate, not a bound (a margin in `context_tokens` is advisable).
    Estimate,
}

fn default_context_tokens() -> usize {
    100_000
}

impl ModelSettings {
    /// Checks the model configured as `models.<name>`.
    pub(super) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        if !(self.base_url.starts_with("http://") || self.base_url.starts_with("https://")) {
            return Err(invalid(
                &format!("models.{name}.base_url"),
                "must be an http(s) URL",
            ));
        }
        if self.model.is_empty() {
            return Err(invalid(
                &format!("models.{name}.model"),
                "must not be empty",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn models_are_configured_by_name() {
        let s = load(&[
            ("models.fast.base_url", "http://127.0.0.1:1/v1"),
            ("models.fast.model", "gpt-x"),
        ])
        .unwrap();
        assert_eq!(s.models["fast"].model, "gpt-x");
        let err = load(&[
            ("models.bad.base_url", "ftp://x"),
            ("models.bad.model", "m"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("models.bad.base_url"), "{err}");
    }
}
