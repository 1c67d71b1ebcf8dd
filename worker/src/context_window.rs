//! Fits a thread's history into the model's context budget, in tiers (the async half, which
//! calls the model for summaries and records what happened, is `context_summary`):
//!
//! 1. old tool results are cut to a head and a handle (`m<position>`) the built-in
//!    `expand_message` tool reads back;
//! 2. then older user and assistant messages, the same way;
//! 3. then the oldest part is summarised by the model: one summary message stands for
//!    everything before a turn boundary (stored, and reused by later runs of the thread);
//! 4. past the allowed summaries, the oldest turns are dropped, and a newest turn too large
//!    on its own has its long contents cut in the middle.
//!
//! The newest turn (the last assistant message with its tool results, or the last user
//! message) is never compressed: it is what the model answers. Positions index the thread's
//! whole history as the worker holds it (loaded once per holding, then appended), which only
//! ever grows, so a handle or a summary's `covers` means the same message in every run.
//!
//! Tokens are counted with the model's tokenizer (`tokens`); a history whose byte count alone
//! fits (a token is at least a byte) is never tokenized.

use serde_json::Value;

use crate::tokens::{self, Tokenizer};

/// A summary of the history's first `covers` messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub covers: usize,
    pub text: String,
}

impl Summary {
    /// The message that stands for the summarised part.
    pub fn message(&self) -> Value {
        serde_json::json!({"role": "user", "content": format!(
            "[Summary of the earlier conversation, which outgrew the context window]\n{}",
            self.text
        )})
    }
}

/// What compaction did to one request, for the `context_compacted` event.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// `tool_results`, `messages`, `summary` or `dropped`.
    pub tier: &'static str,
    /// Messages this step compressed, summarised or dropped.
    pub messages: usize,
    pub tokens_before: usize,
    pub tokens_after: usize,
}

/// The figures compaction works with.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub tokenizer: Tokenizer,
    /// Tokens the history may take (the system prompt and tools already subtracted).
    pub budget: usize,
    pub keep_head_bytes: usize,
    /// Where a summary should leave the history, as a percentage of the budget.
    pub target_percent: u8,
    /// Tokens a summary may take.
    pub summary_tokens: usize,
}

/// The outcome of [`Compaction::fit`].
#[derive(Debug)]
pub enum Fit {
    /// The messages to send, oldest first.
    Ready(Vec<Value>),
    /// Summarise messages `from..upto` (after the summary so far, if any), then fit again.
    Summarise { from: usize, upto: usize },
}

/// A run's compaction state for one holding: monotonic, so a message once compressed stays
/// compressed in every later request (what a provider's prompt cache wants too).
#[derive(Debug, Default)]
pub struct Compaction {
    pub summary: Option<Summary>,
    /// The stored summary was looked up (done once, when the history first overflows).
    pub summary_loaded: bool,
    /// Tool results before this position are compressed.
    results_before: usize,
    /// User and assistant messages before this position are compressed.
    messages_before: usize,
    /// Tokens of each history message as it is, by position.
    counts: Vec<usize>,
    /// At least the tokens of each history message (its bytes), by position.
    upper: Vec<usize>,
    /// At least the tokens of the system prompt and tools (they do not change in a holding).
    pub fixed_upper: Option<usize>,
    /// What the requests so far compacted, not yet announced.
    pub steps: Vec<Step>,
}

impl Compaction {
    /// Whether anything is compressed or summarised (then `expand_message` is offered).
    pub fn active(&self) -> bool {
        self.summary.is_some() || self.results_before > 0 || self.messages_before > 0
    }

    /// Whether the history as it is fits, by its byte count alone (each message measured
    /// once per holding).
    pub fn fits_as_is(&mut self, history: &[Value], limits: &Limits) -> bool {
        if self.active() {
            return false;
        }
        while self.upper.len() < history.len() {
            let m = &history[self.upper.len()];
            self.upper
                .push(tokens::message_upper_bound(limits.tokenizer, m));
        }
        self.upper.iter().sum::<usize>() <= limits.budget
    }

    /// The messages to send for `history`, compressing further as needed; `may_summarise`
    /// false skips tier 3 (summaries spent or failing).
    pub fn fit(&mut self, history: &[Value], limits: &Limits, may_summarise: bool) -> Fit {
        if self.fits_as_is(history, limits) {
            return Fit::Ready(history.to_vec());
        }
        self.count(history, limits.tokenizer);
        if self
            .summary
            .as_ref()
            .is_some_and(|s| s.covers > history.len())
        {
            // Cannot happen with an append-only history; a summary of something else is
            // worse than none.
            self.summary = None;
        }
        let start = self.summary.as_ref().map_or(0, |s| s.covers);
        let newest = newest_turn(history).max(start);
        let mut total = self.total(history, start, limits);

        for tier in [Tier::ToolResults, Tier::Messages] {
            if total <= limits.budget {
                break;
            }
            let before = total;
            let mut compressed = 0;
            let mark = self.mark(tier).max(start);
            for (i, message) in history.iter().enumerate().take(newest).skip(mark) {
                if total <= limits.budget {
                    break;
                }
                if tier.covers(message)
                    && let Some(short) = compress(message, i, limits.keep_head_bytes)
                {
                    total = total - self.counts[i] + tokens::message(limits.tokenizer, &short);
                    compressed += 1;
                }
                *self.mark_mut(tier) = i + 1;
            }
            if compressed > 0 {
                self.steps.push(Step {
                    tier: tier.name(),
                    messages: compressed,
                    tokens_before: before,
                    tokens_after: total,
                });
            }
        }
        if total <= limits.budget {
            return Fit::Ready(self.view(history, start, limits.keep_head_bytes));
        }

        // Summarising helps only if the newest turn, which stays, fits beside a summary.
        let newest_cost = self.cost_of(history, newest, history.len(), limits);
        if may_summarise && newest > start && newest_cost + limits.summary_tokens <= limits.budget {
            // Summarise up to the first turn boundary after which the rest fits the target,
            // but no more than one call can read.
            let target = (limits.budget * limits.target_percent as usize / 100)
                .saturating_sub(limits.summary_tokens);
            let reading = limits.budget.saturating_sub(limits.summary_tokens);
            let mut rest = total - self.summary_cost(limits);
            let mut read = self.summary_cost(limits);
            let mut upto = start;
            for i in start..newest {
                let cost = self.cost(history, i, limits);
                if read + cost > reading && upto > start {
                    break;
                }
                read += cost;
                rest -= cost;
                if is_boundary(&history[i + 1]) {
                    upto = i + 1;
                    if rest <= target {
                        break;
                    }
                }
            }
            if upto > start {
                return Fit::Summarise { from: start, upto };
            }
        }

        // Drop the oldest turns (the newest is always kept), then the summary, then cut what
        // is left if the newest turn alone is too large.
        let before = total;
        let mut drop_before = start;
        for i in start..newest {
            if total <= limits.budget && is_boundary(&history[i]) {
                break;
            }
            total -= self.cost(history, i, limits);
            drop_before = i + 1;
        }
        let mut view = self.view(history, drop_before, limits.keep_head_bytes);
        if total > limits.budget && self.summary.is_some() {
            total -= self.summary_cost(limits);
            view.remove(0);
        }
        if total > limits.budget {
            view = shrink(view, limits.budget);
        }
        self.steps.push(Step {
            tier: "dropped",
            messages: drop_before - start,
            tokens_before: before,
            tokens_after: total.min(limits.budget),
        });
        Fit::Ready(view)
    }

    /// The history `from..upto` as the summarising call reads it (compressed as it is sent).
    pub fn part(
        &self,
        history: &[Value],
        from: usize,
        upto: usize,
        keep_head: usize,
    ) -> Vec<Value> {
        (from..upto)
            .map(|i| self.as_sent(history, i, keep_head))
            .collect()
    }

    /// Records the new summary.
    pub fn summarised(
        &mut self,
        summary: Summary,
        messages: usize,
        limits: &Limits,
        before: usize,
    ) {
        self.summary = Some(summary);
        let after = self.summary_cost(limits);
        self.steps.push(Step {
            tier: "summary",
            messages,
            tokens_before: before,
            tokens_after: after,
        });
    }

    /// Tokens of the history's part `from..upto` as sent.
    pub fn cost_of(&self, history: &[Value], from: usize, upto: usize, limits: &Limits) -> usize {
        (from..upto).map(|i| self.cost(history, i, limits)).sum()
    }

    fn count(&mut self, history: &[Value], tokenizer: Tokenizer) {
        while self.counts.len() < history.len() {
            let i = self.counts.len();
            self.counts.push(tokens::message(tokenizer, &history[i]));
        }
    }

    fn mark(&self, tier: Tier) -> usize {
        match tier {
            Tier::ToolResults => self.results_before,
            Tier::Messages => self.messages_before,
        }
    }

    fn mark_mut(&mut self, tier: Tier) -> &mut usize {
        match tier {
            Tier::ToolResults => &mut self.results_before,
            Tier::Messages => &mut self.messages_before,
        }
    }

    fn compressed(&self, message: &Value, i: usize) -> bool {
        (Tier::ToolResults.covers(message) && i < self.results_before)
            || (Tier::Messages.covers(message) && i < self.messages_before)
    }

    fn as_sent(&self, history: &[Value], i: usize, keep_head: usize) -> Value {
        if self.compressed(&history[i], i)
            && let Some(short) = compress(&history[i], i, keep_head)
        {
            return short;
        }
        history[i].clone()
    }

    fn cost(&self, history: &[Value], i: usize, limits: &Limits) -> usize {
        if self.compressed(&history[i], i)
            && let Some(short) = compress(&history[i], i, limits.keep_head_bytes)
        {
            return tokens::message(limits.tokenizer, &short);
        }
        self.counts[i]
    }

    fn summary_cost(&self, limits: &Limits) -> usize {
        self.summary
            .as_ref()
            .map_or(0, |s| tokens::message(limits.tokenizer, &s.message()))
    }

    fn total(&self, history: &[Value], start: usize, limits: &Limits) -> usize {
        self.summary_cost(limits) + self.cost_of(history, start, history.len(), limits)
    }

    /// The summary (if any), then the messages from `from` on, compressed as marked.
    fn view(&self, history: &[Value], from: usize, keep_head: usize) -> Vec<Value> {
        let mut out = Vec::with_capacity(history.len() - from + 1);
        if let Some(s) = &self.summary {
            out.push(s.message());
        }
        out.extend((from..history.len()).map(|i| self.as_sent(history, i, keep_head)));
        out
    }
}

#[derive(Debug, Clone, Copy)]
enum Tier {
    ToolResults,
    Messages,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::ToolResults => "tool_results",
            Tier::Messages => "messages",
        }
    }

    fn covers(self, message: &Value) -> bool {
        let is_tool = role(message) == "tool";
        match self {
            Tier::ToolResults => is_tool,
            Tier::Messages => !is_tool,
        }
    }
}

fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

/// A turn starts at any message but a tool result (which belongs to the call before it).
fn is_boundary(message: &Value) -> bool {
    role(message) != "tool"
}

/// Where the newest turn starts.
fn newest_turn(history: &[Value]) -> usize {
    history.iter().rposition(is_boundary).unwrap_or(0)
}

/// The handle `expand_message` takes for the message at `position`.
pub fn handle(position: usize) -> String {
    format!("m{position}")
}

/// The position a handle names.
pub fn position(handle: &str) -> Option<usize> {
    handle.strip_prefix('m')?.parse().ok()
}

/// The message with its text content cut to a head and a handle; `None` when that would not
/// make it shorter.
fn compress(message: &Value, position: usize, keep: usize) -> Option<Value> {
    let content = message.get("content")?.as_str()?;
    // A marker costs about this much: compressing less would not pay.
    if content.len() <= keep + 160 {
        return None;
    }
    let mut end = keep;
    while !content.is_char_boundary(end) {
        end -= 1;
    }
    let mut short = message.clone();
    short["content"] = Value::String(format!(
        "{}\n[… compressed to fit the context window: {} bytes in all; call expand_message with id \"{}\" to read it]",
        &content[..end],
        content.len(),
        handle(position)
    ));
    Some(short)
}

/// Cuts the middle of long string contents until the messages fit (or cannot shrink further).
fn shrink(mut messages: Vec<Value>, budget_tokens: usize) -> Vec<Value> {
    // A token is at least a byte: cutting to the budget in bytes is cutting enough.
    let per_message = (budget_tokens / messages.len().max(1)).max(256);
    for msg in &mut messages {
        if let Some(Value::String(s)) = msg.get_mut("content")
            && s.len() > per_message
        {
            *s = cut_middle(s, per_message);
        }
    }
    messages
}

fn cut_middle(s: &str, max: usize) -> String {
    let keep = max / 2;
    let mut head = keep.min(s.len());
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len().saturating_sub(keep);
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &s[..head],
        tail - head,
        &s[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(budget: usize) -> Limits {
        Limits {
            tokenizer: Tokenizer::Estimate,
            budget,
            keep_head_bytes: 100,
            target_percent: 50,
            summary_tokens: 50,
        }
    }

    /// A user turn, then `n` calls each answered by a result of `bytes` bytes.
    fn history(n: usize, bytes: usize) -> Vec<Value> {
        let mut h = vec![json!({"role": "user", "content": "go"})];
        for i in 0..n {
            let id = format!("c{i}");
            h.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
            h.push(json!({"role": "tool", "tool_call_id": id, "content": "x".repeat(bytes)}));
        }
        h
    }

    fn cost(view: &[Value]) -> usize {
        view.iter()
            .map(|m| tokens::message(Tokenizer::Estimate, m))
            .sum()
    }

    #[test]
    fn a_history_that_fits_is_sent_as_is() {
        let h = history(2, 100);
        let mut c = Compaction::default();
        let Fit::Ready(view) = c.fit(&h, &limits(10_000), true) else {
            panic!("no summary needed")
        };
        assert_eq!(view, h);
        assert!(c.steps.is_empty() && !c.active());
    }

    #[test]
    fn old_tool_results_go_first_and_the_newest_turn_stays_whole() {
        let h = history(6, 2000);
        let mut c = Compaction::default();
        let Fit::Ready(view) = c.fit(&h, &limits(1200), true) else {
            panic!("compressing results suffices")
        };
        assert!(cost(&view) <= 1200, "{}", cost(&view));
        assert_eq!(view.last(), h.last(), "the newest result is whole");
        let first = view[2]["content"].as_str().unwrap();
        assert!(
            first.contains("expand_message") && first.contains("\"m2\""),
            "{first}"
        );
        assert_eq!(c.steps[0].tier, "tool_results");
        // Monotonic: the next request keeps what was compressed, and adds nothing new.
        c.steps.clear();
        let Fit::Ready(again) = c.fit(&h, &limits(1200), true) else {
            panic!()
        };
        assert_eq!(again, view);
        assert!(c.steps.is_empty());
    }

    #[test]
    fn past_compression_the_oldest_part_is_summarised_at_turn_boundaries() {
        let h = history(40, 2000);
        let mut c = Compaction::default();
        let mut rounds = 0;
        let view = loop {
            match c.fit(&h, &limits(1200), true) {
                Fit::Ready(view) => break view,
                Fit::Summarise { from, upto } => {
                    assert_eq!(from, c.summary.as_ref().map_or(0, |s| s.covers));
                    assert!(upto > from && upto <= h.len() - 2, "{upto}");
                    assert_ne!(h[upto]["role"], "tool", "a turn boundary");
                    // One call reads at most the budget less the summary's room.
                    let read = c.cost_of(&h, from, upto, &limits(1200));
                    assert!(read <= 1200 - 50, "{read}");
                    let summary = Summary {
                        covers: upto,
                        text: "s".into(),
                    };
                    c.summarised(summary, upto - from, &limits(1200), read);
                    rounds += 1;
                    assert!(rounds < 10);
                }
            }
        };
        assert!(rounds >= 2, "more than one call can read: {rounds}");
        assert!(cost(&view) <= 1200);
        let covers = c.summary.as_ref().unwrap().covers;
        assert!(view[0]["content"].as_str().unwrap().starts_with("[Summary"));
        assert_eq!(view.len(), h.len() - covers + 1);
    }

    #[test]
    fn without_summaries_the_oldest_turns_are_dropped_whole() {
        let h = history(40, 2000);
        let mut c = Compaction::default();
        let Fit::Ready(view) = c.fit(&h, &limits(1200), false) else {
            panic!("no summary allowed")
        };
        assert!(cost(&view) <= 1200, "{}", cost(&view));
        assert_ne!(view[0]["role"], "tool", "starts at a turn");
        assert_eq!(view.last(), h.last());
        assert_eq!(c.steps.last().unwrap().tier, "dropped");
    }

    #[test]
    fn a_newest_turn_too_large_alone_is_cut_in_the_middle() {
        let h = history(1, 50_000);
        let mut c = Compaction::default();
        let Fit::Ready(view) = c.fit(&h, &limits(2000), true) else {
            panic!("nothing to summarise")
        };
        assert!(cost(&view) <= 2000, "{}", cost(&view));
        assert!(
            view.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .contains("bytes omitted")
        );
    }
}
