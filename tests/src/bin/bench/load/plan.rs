//! What the section offers: the plan of runs (rate, mix, script) for `--in-flight`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::Ctx;

/// The knobs resolved.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) in_flight: usize,
    pub(super) duration: Duration,
    pub(super) offered_rate: Option<f64>,
    pub(super) first_byte_ms: u64,
    pub(super) turns: usize,
    pub(super) tokens: usize,
    pub(super) chunk_gap_ms: u64,
    pub(super) tool_calls: usize,
    pub(super) tool_ms: u64,
    pub(super) question_share: f64,
    pub(super) confirm_share: f64,
    pub(super) answer_after: Duration,
    pub(super) cut_share: f64,
    pub(super) workers: usize,
    pub(super) slots: usize,
    pub(super) sample_every: Duration,
}

impl Plan {
    pub(super) fn of(ctx: &Ctx) -> anyhow::Result<Plan> {
        let a = &ctx.args.load;
        let smoke = ctx.args.smoke;
        let pick =
            |v: Option<u64>, full: u64, tiny: u64| v.unwrap_or(if smoke { tiny } else { full });
        let in_flight = a.in_flight.unwrap_or(if smoke { 10 } else { 1000 });
        let duration_s = a.duration_s.unwrap_or(if smoke { 3.0 } else { 120.0 });
        let tokens_per_s = a.tokens_per_s.unwrap_or(if smoke { 400.0 } else { 40.0 });
        let share = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        anyhow::ensure!(
            (1..=100_000).contains(&in_flight),
            "--in-flight must be within 1..=100000"
        );
        anyhow::ensure!(
            duration_s.is_finite() && (1.0..=86_400.0).contains(&duration_s),
            "--duration-s must be within 1..=86400"
        );
        anyhow::ensure!(
            tokens_per_s.is_finite() && (1.0..=10_000.0).contains(&tokens_per_s),
            "--tokens-per-s must be within 1..=10000"
        );
        if let Some(rate) = a.offered_rate {
            anyhow::ensure!(
                rate.is_finite() && (0.1..=10_000.0).contains(&rate),
                "--offered-rate must be within 0.1..=10000 runs per second"
            );
        }
        anyhow::ensure!(
            (1..=20).contains(&a.model_turns),
            "--model-turns must be within 1..=20"
        );
        anyhow::ensure!(
            a.tool_calls <= 8 * a.model_turns.saturating_sub(1),
            "--tool-calls go to the model calls before the last, at most 8 each \
             (worker.max_parallel_tool_calls): ask for fewer, or for more --model-turns"
        );
        anyhow::ensure!(
            share(a.question_share) && share(a.confirm_share) && share(a.cut_share),
            "--question-share, --confirm-share and --cut-share are shares within 0..=1"
        );
        anyhow::ensure!(
            a.question_share + a.confirm_share <= 1.0,
            "--question-share and --confirm-share together must not pass 1 (a run pauses once)"
        );
        anyhow::ensure!(
            a.question_share == 0.0 || a.model_turns >= 2,
            "a question needs a model call before the last (--model-turns 2 or more)"
        );
        anyhow::ensure!(
            a.confirm_share == 0.0 || a.tool_calls >= 1,
            "a confirmation needs a tool call (--tool-calls 1 or more)"
        );
        let tokens = a.tokens_per_turn.unwrap_or(if smoke { 10 } else { 80 });
        anyhow::ensure!(
            (1..=10_000).contains(&tokens),
            "--tokens-per-turn must be within 1..=10000"
        );
        let workers = ctx.args.workers.unwrap_or(1);
        // Paused and queued runs hold no slot; a quarter more than the target leaves room for
        // the in-flight count's swings.
        let slots = ctx
            .args
            .slots
            .unwrap_or_else(|| (in_flight * 5 / 4).div_ceil(workers).max(16));
        Ok(Plan {
            in_flight,
            duration: Duration::from_secs_f64(duration_s),
            offered_rate: a.offered_rate,
            first_byte_ms: pick(a.first_byte_ms, 800, 40),
            turns: a.model_turns,
            tokens,
            chunk_gap_ms: (1000.0 / tokens_per_s).round() as u64,
            tool_calls: a.tool_calls,
            tool_ms: pick(a.tool_ms, 300, 30),
            question_share: a.question_share,
            confirm_share: a.confirm_share,
            answer_after: Duration::from_millis(pick(a.answer_after_ms, 2000, 100)),
            cut_share: a.cut_share,
            workers,
            slots,
            sample_every: Duration::from_millis(if smoke { 200 } else { 1000 }),
        })
    }

    /// The tool calls of model call `turn` (0-based): the run's calls dealt round the calls
    /// before the last.
    pub(super) fn calls_in(&self, turn: usize) -> usize {
        let tool_turns = self.turns - 1;
        if turn >= tool_turns {
            return 0;
        }
        self.tool_calls / tool_turns + usize::from(turn < self.tool_calls % tool_turns)
    }

    /// The model call that carries the question and the confirmed call: the last one with tool
    /// calls (or the first, when none has any).
    pub(super) fn pausing_turn(&self) -> usize {
        (0..self.turns - 1)
            .rev()
            .find(|t| self.calls_in(*t) > 0)
            .unwrap_or(0)
    }

    /// The script of a run of `kind`, as the scripted model plays it.
    pub(super) fn script(&self, kind: Kind) -> Value {
        let turns: Vec<Value> = (0..self.turns)
            .map(|t| {
                let mut calls: Vec<Value> = (0..self.calls_in(t))
                    .map(|_| json!({"name": "slow", "arguments": {"ms": self.tool_ms}}))
                    .collect();
                if t == self.pausing_turn() {
                    if kind == Kind::Confirm
                        && let Some(last) = calls.last_mut()
                    {
                        last["name"] = json!("slow_confirmed");
                    }
                    if kind == Kind::Question {
                        calls.push(json!({"name": "ask", "arguments": {"text": QUESTION}}));
                    }
                }
                json!({
                    // The model replaces each four-character piece by its send time.
                    "content": "tokn".repeat(self.tokens),
                    "chunks": self.tokens,
                    "stamp": true,
                    "delay_ms": self.first_byte_ms,
                    "chunk_delay_ms": self.chunk_gap_ms,
                    // A call's arguments stream at about four characters a token, as the text.
                    "call_chunks": CALL_CHUNKS,
                    "tool_calls": calls,
                })
            })
            .collect();
        Value::Array(turns)
    }

    /// What a run of `kind` lasts with no time spent in the fleet: the scripted model's waits
    /// and chunk gaps, the tools' answers and the user's.
    pub(super) fn scripted_secs(&self, kind: Kind) -> f64 {
        let mut ms = 0.0;
        for t in 0..self.turns {
            let mut calls = self.calls_in(t);
            if t == self.pausing_turn() && kind == Kind::Question {
                calls += 1;
            }
            // The role event, the pieces, each call's head and argument pieces, the finish and
            // the usage: one gap before each but the first.
            let frames = 1 + self.tokens + calls * (1 + CALL_CHUNKS) + 2;
            ms += (self.first_byte_ms + self.chunk_gap_ms * (frames as u64 - 1)) as f64;
            if self.calls_in(t) > 0 {
                ms += self.tool_ms as f64;
            }
        }
        if kind != Kind::Plain {
            ms += self.answer_after.as_secs_f64() * 1000.0;
        }
        ms / 1000.0
    }

    /// The mean scripted duration over the mix of kinds.
    pub(super) fn mean_scripted_secs(&self) -> f64 {
        let plain = 1.0 - self.question_share - self.confirm_share;
        plain * self.scripted_secs(Kind::Plain)
            + self.question_share * self.scripted_secs(Kind::Question)
            + self.confirm_share * self.scripted_secs(Kind::Confirm)
    }

    /// The longest scripted duration of the mix.
    pub(super) fn longest_scripted_secs(&self) -> f64 {
        let mut longest = self.scripted_secs(Kind::Plain);
        if self.question_share > 0.0 {
            longest = longest.max(self.scripted_secs(Kind::Question));
        }
        if self.confirm_share > 0.0 {
            longest = longest.max(self.scripted_secs(Kind::Confirm));
        }
        longest
    }

    pub(super) fn config_json(&self, rate: f64) -> Value {
        json!({
            "in_flight": self.in_flight,
            "duration_s": self.duration.as_secs_f64(),
            "offered_rate": rate,
            "rate_given": self.offered_rate.is_some(),
            "first_byte_ms": self.first_byte_ms,
            "model_turns": self.turns,
            "tokens_per_turn": self.tokens,
            "chunk_gap_ms": self.chunk_gap_ms,
            "tool_calls": self.tool_calls,
            "tool_ms": self.tool_ms,
            "question_share": self.question_share,
            "confirm_share": self.confirm_share,
            "answer_after_ms": self.answer_after.as_millis() as u64,
            "cut_share": self.cut_share,
            "workers": self.workers,
            "slots": self.slots,
            "mean_scripted_s": self.mean_scripted_secs(),
        })
    }
}

pub(super) const QUESTION: &str = "Which region do you mean?";
/// Pieces of each tool call's arguments (`{"ms":300}` is about three tokens).
pub(super) const CALL_CHUNKS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Plain,
    Question,
    Confirm,
}

/// A fixed sequence in 0..1 per run index (the same mix in every invocation).
pub(super) fn unit(index: u64, salt: u64) -> f64 {
    // splitmix64
    let mut z = index.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
