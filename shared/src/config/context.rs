//! `[context]`: keeping a run's requests within its model's context window.

use serde::Deserialize;

use super::{ConfigError, invalid};

/// How a run's history is compacted when the next request would exceed the model's context
/// budget: old tool results, then old messages, are cut to a head; then the oldest part is
/// summarised by the model itself (docs/tools.md, "Context management").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextSettings {
    /// Bytes kept of a compressed message (its head); the rest is read back with the built-in
    /// `expand_message` tool. At most 16384.
    pub keep_head_bytes: usize,
    /// A summary leaves the history at most this percentage of the budget, so the next summary is
    /// many turns away. 10–90.
    pub summary_target_percent: u8,
    /// Summaries one request may need at most (each summarises what fits in one model call); past
    /// them the oldest turns are dropped.
    pub max_summary_rounds: u8,
    /// Completion tokens of a summary; at least 64.
    pub summary_max_tokens: u32,
    /// The system prompt of a summarising call; not empty.
    pub summary_prompt: String,
    /// Most bytes one `expand_message` call returns (it pages with `offset`); at least 256.
    pub expand_max_bytes: usize,
}

impl ContextSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(10..=90).contains(&self.summary_target_percent) {
            return Err(invalid(
                "context.summary_target_percent",
                "must be within 10..=90",
            ));
        }
        if self.keep_head_bytes > 16 * 1024 {
            return Err(invalid("context.keep_head_bytes", "must be at most 16384"));
        }
        if self.expand_max_bytes < 256 {
            return Err(invalid("context.expand_max_bytes", "must be at least 256"));
        }
        if self.summary_max_tokens < 64 {
            return Err(invalid("context.summary_max_tokens", "must be at least 64"));
        }
        if self.summary_prompt.trim().is_empty() {
            return Err(invalid("context.summary_prompt", "must not be empty"));
        }
        Ok(())
    }
}
