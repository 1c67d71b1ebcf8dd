//! The `load` section (`--only load`): runs offered at a steady rate (open loop) with a
//! realistic script, sized to keep about `--in-flight` runs in flight, every run's SSE client
//! attached from submission to its end; what that costs the machine and how fast a token
//! travels from the model to the client.
//!
//! The scripted model (`mock-llm`) and the tool server (`tool-server`) run as processes of
//! their own, so the CPU split tells the fleet, the harness's clients and the scripted
//! services apart, and the model's connections are those to its port alone.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentfleet_tests::harness::{ChildProcess, binary, free_address, redis_url, wait_for};
use agentfleet_tests::mock_llm::{STAMP_LEN, epoch_ms, script, stamp_age_ms};

use crate::Report;
use crate::common::{Ctx, percentile, sorted};
use crate::cpu::{CpuSampler, Group};

/// The load section's knobs (`bench --only load --help`); unset ones take the issue's
/// defaults, or tiny ones with `--smoke`.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "load section")]
pub struct LoadArgs {
    /// Runs to keep in flight (submitted, not yet ended as seen by their SSE client): the
    /// offered rate is found from it (default 1000; 10 with --smoke).
    #[arg(long)]
    pub in_flight: Option<usize>,
    /// Seconds to sustain it, measured after the ramp (default 120; 3 with --smoke).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Runs per second to offer, instead of finding the rate that keeps --in-flight.
    #[arg(long)]
    pub offered_rate: Option<f64>,
    /// The model's wait before its first byte, per call (default 800; 40 with --smoke).
    #[arg(long)]
    pub first_byte_ms: Option<u64>,
    /// Model calls per run, the last one answering without tools.
    #[arg(long, default_value_t = 3)]
    pub model_turns: usize,
    /// Tokens the model streams per call, one chunk each (default 80; 10 with --smoke).
    #[arg(long)]
    pub tokens_per_turn: Option<usize>,
    /// The model's streaming rate (default 40; 400 with --smoke).
    #[arg(long)]
    pub tokens_per_s: Option<f64>,
    /// Tool calls per run, spread over the calls before the last.
    #[arg(long, default_value_t = 2)]
    pub tool_calls: usize,
    /// How long each tool call takes to answer (default 300; 30 with --smoke).
    #[arg(long)]
    pub tool_ms: Option<u64>,
    /// Share of runs that ask the user a question (the built-in `ask`).
    #[arg(long, default_value_t = 0.10)]
    pub question_share: f64,
    /// Share of runs whose last tool call needs a confirmation (`risk: high`).
    #[arg(long, default_value_t = 0.05)]
    pub confirm_share: f64,
    /// How long the user takes to answer a question or a confirmation, through
    /// `POST /v1/runs/{id}/resume` (default 2000; 100 with --smoke).
    #[arg(long)]
    pub answer_after_ms: Option<u64>,
    /// Share of SSE clients cut once on purpose mid-run, which reconnect with `Last-Event-ID`.
    #[arg(long, default_value_t = 0.10)]
    pub cut_share: f64,
}

/// The knobs resolved.
#[derive(Clone, Debug)]
struct Plan {
    in_flight: usize,
    duration: Duration,
    offered_rate: Option<f64>,
    first_byte_ms: u64,
    turns: usize,
    tokens: usize,
    chunk_gap_ms: u64,
    tool_calls: usize,
    tool_ms: u64,
    question_share: f64,
    confirm_share: f64,
    answer_after: Duration,
    cut_share: f64,
    workers: usize,
    slots: usize,
    sample_every: Duration,
}

impl Plan {
    fn of(ctx: &Ctx) -> anyhow::Result<Plan> {
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
    fn calls_in(&self, turn: usize) -> usize {
        let tool_turns = self.turns - 1;
        if turn >= tool_turns {
            return 0;
        }
        self.tool_calls / tool_turns + usize::from(turn < self.tool_calls % tool_turns)
    }

    /// The model call that carries the question and the confirmed call: the last one with tool
    /// calls (or the first, when none has any).
    fn pausing_turn(&self) -> usize {
        (0..self.turns - 1)
            .rev()
            .find(|t| self.calls_in(*t) > 0)
            .unwrap_or(0)
    }

    /// The script of a run of `kind`, as the scripted model plays it.
    fn script(&self, kind: Kind) -> Value {
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
    fn scripted_secs(&self, kind: Kind) -> f64 {
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
    fn mean_scripted_secs(&self) -> f64 {
        let plain = 1.0 - self.question_share - self.confirm_share;
        plain * self.scripted_secs(Kind::Plain)
            + self.question_share * self.scripted_secs(Kind::Question)
            + self.confirm_share * self.scripted_secs(Kind::Confirm)
    }

    /// The longest scripted duration of the mix.
    fn longest_scripted_secs(&self) -> f64 {
        let mut longest = self.scripted_secs(Kind::Plain);
        if self.question_share > 0.0 {
            longest = longest.max(self.scripted_secs(Kind::Question));
        }
        if self.confirm_share > 0.0 {
            longest = longest.max(self.scripted_secs(Kind::Confirm));
        }
        longest
    }

    fn config_json(&self, rate: f64) -> Value {
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

const QUESTION: &str = "Which region do you mean?";
/// Pieces of each tool call's arguments (`{"ms":300}` is about three tokens).
const CALL_CHUNKS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Question,
    Confirm,
}

/// A fixed sequence in 0..1 per run index (the same mix in every invocation).
fn unit(index: u64, salt: u64) -> f64 {
    // splitmix64
    let mut z = index.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Token latencies, one bucket a millisecond up to a minute (and one for longer).
struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Histogram {
    const MAX_MS: usize = 60_000;

    fn new() -> Histogram {
        Histogram {
            buckets: (0..=Self::MAX_MS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn record(&self, ms: u64) {
        let i = (ms as usize).min(Self::MAX_MS);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// The percentile `p` of the counts recorded between two snapshots, in ms.
fn histogram_percentile(before: &[u64], after: &[u64], p: f64) -> f64 {
    let counts: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return f64::NAN;
    }
    let rank = ((total - 1) as f64 * p).round() as u64;
    let mut seen = 0;
    for (ms, n) in counts.iter().enumerate() {
        seen += n;
        if seen > rank {
            return ms as f64;
        }
    }
    Histogram::MAX_MS as f64
}

/// What the clients counted, all runs together.
#[derive(Default)]
struct Counters {
    submitted: AtomicU64,
    submit_failed: AtomicU64,
    completed: AtomicU64,
    /// Ended failed or cancelled, or without an end by the drain's deadline.
    not_completed: AtomicU64,
    tokens: AtomicU64,
    /// Tokens the model sent before the client's connection was asked for: replayed after a
    /// reconnect, not timed.
    tokens_replayed: AtomicU64,
    /// Streams that ended or failed neither at a pause nor at the run's end, nor cut on purpose.
    dropped: AtomicU64,
    /// Runs whose client saw at least one such drop.
    runs_with_drops: AtomicU64,
    cut: AtomicU64,
    pause_reconnects: AtomicU64,
    /// Connection attempts refused (429 too_many_streams, other statuses) or failed.
    refused: AtomicU64,
    gaps: AtomicU64,
    duplicates: AtomicU64,
    rebuilt: AtomicU64,
    answers: AtomicU64,
    answers_failed: AtomicU64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// What the run tasks share.
struct Shared {
    http: reqwest::Client,
    base: String,
    key: String,
    in_flight: AtomicUsize,
    counters: Counters,
    latency: Histogram,
    /// Completed runs: id, text streamed (bytes), duration (ms).
    finished: std::sync::Mutex<Vec<(String, usize, f64)>>,
    answer_after: Duration,
    stop: CancellationToken,
    /// The first submission that failed, and why (printed).
    first_error: std::sync::Mutex<Option<String>>,
    /// The first `stream_rebuilt` events clients saw (printed: Redis lost a run's events).
    rebuilt: std::sync::Mutex<Vec<String>>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    data: DeltaData<'a>,
}

#[derive(Deserialize)]
struct DeltaData<'a> {
    #[serde(borrow, default)]
    text: std::borrow::Cow<'a, str>,
}

/// How a connection of a run's SSE client ended.
enum End {
    /// The run's terminal event: completed or not.
    Finished(bool),
    /// Cut on purpose.
    Cut,
    /// The server closed it (after a pause, or not) or it failed.
    Closed,
}

/// One run: submitted, followed by its SSE client to its end (reconnecting after pauses, cuts
/// and drops with `Last-Event-ID`), answered as a user would.
async fn one_run(shared: Arc<Shared>, body: Arc<Vec<u8>>, cut_after: Option<Duration>) {
    let started = Instant::now();
    let c = &shared.counters;
    let posted = shared
        .http
        .post(format!("{}/v1/runs", shared.base))
        .bearer_auth(&shared.key)
        .header("content-type", "application/json")
        .body(body.as_ref().clone())
        .send()
        .await;
    let id = match posted {
        Ok(resp) if resp.status() == 202 => match resp.json::<Value>().await {
            Ok(v) => Ok(v["id"].as_str().unwrap_or_default().to_owned()),
            Err(e) => Err(e.to_string()),
        },
        Ok(resp) => Err(format!(
            "{}: {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        )),
        Err(e) => Err(e.to_string()),
    };
    let id = match id {
        Ok(id) if !id.is_empty() => id,
        failed => {
            let mut first = shared.first_error.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert_with(|| format!("POST /v1/runs: {failed:?}"));
            String::new()
        }
    };
    if id.is_empty() {
        add(&c.submit_failed);
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let url = format!("{}/v1/runs/{id}/events", shared.base);
    let mut cut_at = cut_after.map(|d| tokio::time::Instant::now() + d);
    let mut last_id = 0u64;
    let mut paused = false;
    let mut dropped = false;
    let mut text_bytes = 0usize;
    // The text of the current message not yet read as whole stamps.
    let mut pending = String::new();
    let mut connections = 0usize;
    let outcome = loop {
        if shared.stop.is_cancelled() {
            break None;
        }
        connections += 1;
        let asked_ms = epoch_ms();
        let mut req = shared.http.get(&url).bearer_auth(&shared.key);
        if last_id > 0 {
            req = req.header("Last-Event-ID", last_id.to_string());
        }
        let resp = tokio::select! {
            r = req.send() => r,
            () = shared.stop.cancelled() => break None,
        };
        let resp = match resp {
            Ok(r) if r.status().is_success() => r,
            _ => {
                add(&c.refused);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = resp.bytes_stream().eventsource();
        let end = loop {
            let next = tokio::select! {
                next = stream.next() => next,
                () = async { tokio::time::sleep_until(cut_at.expect("a cut")).await }, if cut_at.is_some() => {
                    cut_at = None;
                    break End::Cut;
                }
                () = shared.stop.cancelled() => break End::Closed,
            };
            let Some(Ok(event)) = next else {
                break End::Closed;
            };
            let Ok(event_id) = event.id.parse::<u64>() else {
                continue;
            };
            if event_id <= last_id {
                add(&c.duplicates);
                continue;
            }
            if event_id != last_id + 1 && event.event != "stream_rebuilt" {
                add(&c.gaps);
            }
            last_id = event_id;
            paused = false;
            match event.event.as_str() {
                "message_delta" => {
                    let Ok(envelope) = serde_json::from_str::<Envelope>(&event.data) else {
                        continue;
                    };
                    let now = epoch_ms();
                    text_bytes += envelope.data.text.len();
                    pending.push_str(&envelope.data.text);
                    let whole = pending.len() / STAMP_LEN * STAMP_LEN;
                    for stamp in pending.as_bytes()[..whole].chunks(STAMP_LEN) {
                        let Some(age) = std::str::from_utf8(stamp)
                            .ok()
                            .and_then(|s| stamp_age_ms(s, now))
                        else {
                            continue;
                        };
                        add(&c.tokens);
                        if now - age >= asked_ms {
                            shared.latency.record(age);
                        } else {
                            add(&c.tokens_replayed);
                        }
                    }
                    pending.drain(..whole);
                }
                // A new message (or a recovered attempt redoing one) starts its stamps afresh.
                "iteration_started" | "run_recovered" | "message_completed" => pending.clear(),
                "stream_rebuilt" => {
                    add(&c.rebuilt);
                    let mut seen = shared.rebuilt.lock().unwrap_or_else(|e| e.into_inner());
                    if seen.len() < 3 {
                        let data: String = event.data.chars().take(300).collect();
                        seen.push(format!(
                            "run {id}, id {event_id} on connection {connections} ({cuts} cut so far): {data}",
                            cuts = usize::from(cut_at.is_none() && cut_after.is_some()),
                        ));
                    }
                }
                "input_required" => {
                    paused = true;
                    answer(&shared, &id, json!({"input": "The northern one."}));
                }
                "confirmation_required" => {
                    paused = true;
                    let data: Value = serde_json::from_str(&event.data).unwrap_or_default();
                    let decisions: Vec<Value> = data["data"]["tool_calls"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|call| json!({"tool_call_id": call["tool_call_id"], "approve": true}))
                        .collect();
                    answer(&shared, &id, json!({"decisions": decisions}));
                }
                "run_completed" => break End::Finished(true),
                "run_failed" | "run_cancelled" => break End::Finished(false),
                _ => {}
            }
        };
        match end {
            End::Finished(ok) => break Some(ok),
            End::Cut => add(&c.cut),
            // The stream ends after a pausing event: reconnect and wait there for the resume.
            End::Closed if paused => add(&c.pause_reconnects),
            End::Closed => {
                if shared.stop.is_cancelled() {
                    break None;
                }
                add(&c.dropped);
                dropped = true;
            }
        }
    };
    if dropped {
        add(&c.runs_with_drops);
    }
    if outcome == Some(true) {
        add(&c.completed);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        shared
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, text_bytes, ms));
    } else {
        add(&c.not_completed);
    }
    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
}

/// The user's answer, after `answer_after` (a task of its own: the client stays attached).
fn answer(shared: &Arc<Shared>, id: &str, body: Value) {
    let (shared, url) = (
        shared.clone(),
        format!("{}/v1/runs/{id}/resume", shared.base),
    );
    tokio::spawn(async move {
        tokio::time::sleep(shared.answer_after).await;
        let ok = shared
            .http
            .post(url)
            .bearer_auth(&shared.key)
            .json(&body)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        add(if ok {
            &shared.counters.answers
        } else {
            &shared.counters.answers_failed
        });
    });
}

/// One reading of the sampler.
#[derive(Clone, Debug)]
struct Sample {
    /// Seconds since the first submission.
    at: f64,
    in_flight: usize,
    /// Runs held by a worker (`running`).
    running: i64,
    worker_rss_kib: u64,
    model_connections: usize,
}

/// A helper process of this section (the scripted model, the tool server), killed when
/// dropped.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn spawn_helper(name: &str, listen: &str) -> anyhow::Result<Helper> {
    let child = Command::new(binary(name))
        .args(["--listen", listen])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {name}"))?;
    let helper = Helper(child);
    let http = reqwest::Client::new();
    wait_for(
        &format!("{name} to answer"),
        Duration::from_secs(30),
        || {
            let req = http.get(format!("http://{listen}/health")).send();
            async move { req.await.ok().filter(|r| r.status().is_success()) }
        },
    )
    .await;
    Ok(helper)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Established TCP connections whose local port is `port` (the server's side of each).
fn connections_to(port: u16) -> usize {
    established_on(
        &std::fs::read_to_string("/proc/net/tcp").unwrap_or_default(),
        port,
    )
}

/// The connections of a `/proc/net/tcp` text in state ESTABLISHED (`01`) whose local port is
/// `port`.
fn established_on(proc_net_tcp: &str, port: u16) -> usize {
    let local = format!(":{port:04X}");
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let (Some(local_address), Some(_), Some(state)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return false;
            };
            local_address.ends_with(&local) && state == "01"
        })
        .count()
}

async fn redis_used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// A run's Redis keys (its event list, fence and id base): the bytes of the list's elements,
/// and what `MEMORY USAGE` says all of them take.
async fn run_keys(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    id: &str,
) -> anyhow::Result<(usize, i64)> {
    let key = |name: &str| format!("{prefix}:run:{id}:{name}");
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(key("events"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    let mut usage = 0;
    for name in ["events", "fence", "base"] {
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key(name))
            .arg("SAMPLES")
            .arg(0)
            .query_async(conn)
            .await?;
        usage += bytes.unwrap_or(0);
    }
    Ok((items.iter().map(String::len).sum(), usage))
}

/// The database's tables: heap (with free space and visibility maps), TOAST (with its
/// indexes) and indexes, in bytes; and the server's WAL position.
#[derive(Clone, Copy, Debug, Default)]
struct PgBytes {
    heap: i64,
    toast: i64,
    indexes: i64,
    wal: i64,
}

async fn pg_bytes(pool: &sqlx::PgPool) -> anyhow::Result<PgBytes> {
    let (heap, toast, indexes, wal): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(pg_table_size(c.oid)), 0)::int8
                  - coalesce(sum(CASE WHEN c.reltoastrelid <> 0
                                      THEN pg_total_relation_size(c.reltoastrelid) END), 0)::int8,
                coalesce(sum(CASE WHEN c.reltoastrelid <> 0
                                  THEN pg_total_relation_size(c.reltoastrelid) END), 0)::int8,
                coalesce(sum(pg_indexes_size(c.oid)), 0)::int8,
                (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind IN ('r', 'm', 'p')
            AND n.nspname NOT IN ('pg_catalog', 'information_schema')
            AND n.nspname NOT LIKE 'pg_toast%'",
    )
    .fetch_one(pool)
    .await?;
    Ok(PgBytes {
        heap,
        toast,
        indexes,
        wal,
    })
}

/// Reads the in-flight count, the held runs, the workers' memory and the model's connections
/// every `every`, until `stop`.
fn sample(
    shared: Arc<Shared>,
    pool: sqlx::PgPool,
    workers: Vec<u32>,
    model_port: u16,
    t0: Instant,
    every: Duration,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return samples,
            }
            let (running,): (i64,) =
                sqlx::query_as("SELECT count(*) FROM runs WHERE status = 'running'")
                    .fetch_one(&pool)
                    .await
                    .unwrap_or((0,));
            samples.push(Sample {
                at: t0.elapsed().as_secs_f64(),
                in_flight: shared.in_flight.load(Ordering::Relaxed),
                running,
                worker_rss_kib: workers.iter().map(|pid| rss_kib(*pid)).sum(),
                model_connections: connections_to(model_port),
            });
        }
    })
}

/// What the clients had counted at one moment.
struct Tally {
    at: Instant,
    utc: chrono::DateTime<chrono::Utc>,
    completed: u64,
    finished: u64,
    tokens: u64,
    latency: Vec<u64>,
}

impl Tally {
    fn now(shared: &Shared) -> Tally {
        let c = &shared.counters;
        Tally {
            at: Instant::now(),
            utc: chrono::Utc::now(),
            completed: get(&c.completed),
            finished: get(&c.completed) + get(&c.not_completed),
            tokens: get(&c.tokens),
            latency: shared.latency.snapshot(),
        }
    }
}

/// The CPU, the clients' counts, Redis's used_memory and command counts at the start of the
/// sustained window.
type WindowStart = (
    crate::cpu::CpuSnapshot,
    Tally,
    u64,
    Option<std::collections::HashMap<String, u64>>,
);

/// Runs offered at a steady rate, sized for `--in-flight`, each with its SSE client, and what
/// the machine, the fleet and the servers spend on them.
pub async fn load(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let plan = Plan::of(ctx)?;
    let model_addr = free_address();
    let tools_addr = free_address();
    let model = spawn_helper("mock-llm", &model_addr).await?;
    let tools = spawn_helper("tool-server", &tools_addr).await?;
    let model_port: u16 = model_addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("the model's port")?;
    // The API of this section keeps the production defaults the shared one's test settings
    // change (keep-alives every 15 s, not every second), and lets the one tenant hold a stream
    // per run in flight: the default allows 1000 per tenant and API process.
    let streams = (plan.in_flight * 2).max(1000).to_string();
    let (api, base) = ctx
        .env
        .spawn_api_process(&[
            ("AGENTFLEET__EVENTS__KEEPALIVE_SECS", "15"),
            ("AGENTFLEET__API__MAX_STREAMS_PER_TENANT", streams.as_str()),
            // The API refuses an agent whose tool the workers could not call.
            ("AGENTFLEET__EGRESS__ALLOW", tools_addr.as_str()),
        ])
        .await;
    let slots = plan.slots.to_string();
    let model_url = format!("http://{model_addr}/v1");
    let workers = ctx.workers(
        plan.workers,
        &[
            ("worker.concurrency", slots.as_str()),
            ("database.max_connections", "20"),
            ("models.mock.base_url", model_url.as_str()),
            ("egress.allow", tools_addr.as_str()),
        ],
    );
    let queue = format!("{}.runs", ctx.env.prefix);
    wait_for(
        "the workers to consume",
        Duration::from_secs(60),
        || async { (ctx.env.queue_stats(&queue).await.1 as usize >= plan.workers).then_some(()) },
    )
    .await;
    let worker_pids: Vec<u32> = workers.iter().map(ChildProcess::pid).collect();
    let tool = |name: &str, risky: bool| {
        let mut t = json!({"name": name, "kind": "http", "url": format!("http://{tools_addr}/slow"),
                           "parameters": {"type": "object"}});
        if risky {
            t["risk"] = json!("high");
        }
        t
    };
    let agent = json!({
        "model": "mock",
        "tools": [tool("slow", false), tool("slow_confirmed", true)],
        "max_iterations": plan.turns + 2,
    });
    let body = |kind: Kind| -> anyhow::Result<Arc<Vec<u8>>> {
        Ok(Arc::new(serde_json::to_vec(
            &json!({"input": script(plan.script(kind)), "agent": agent}),
        )?))
    };
    let bodies = [
        (Kind::Plain, body(Kind::Plain)?),
        (Kind::Question, body(Kind::Question)?),
        (Kind::Confirm, body(Kind::Confirm)?),
    ];

    let backend: Option<(i32,)> = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_optional(&ctx.env.pool)
        .await
        .ok()
        .flatten();
    let postmaster = backend.and_then(|(pid,)| crate::cpu::parent_of(pid as u32));
    let sampler = CpuSampler::new(vec![
        Group::postgres(postmaster),
        Group::pids("api", vec![api.pid()]),
        Group::pids("workers", worker_pids.clone()),
        Group::redis(),
        Group::rabbitmq(),
        Group::pids("model", vec![model.0.id()]),
        Group::pids("tools", vec![tools.0.id()]),
        Group::this("clients"),
    ]);
    let redis = redis::Client::open(redis_url())?;
    let mut rconn = redis.get_multiplexed_async_connection().await?;
    let rss_idle: u64 = worker_pids.iter().map(|pid| rss_kib(*pid)).sum();
    let redis_before = redis_used_memory(&mut rconn).await?;
    let pg_before = pg_bytes(&ctx.env.pool).await?;

    let shared = Arc::new(Shared {
        http: ctx.http.clone(),
        base: base.clone(),
        key: ctx.key.clone(),
        in_flight: AtomicUsize::new(0),
        counters: Counters::default(),
        latency: Histogram::new(),
        finished: std::sync::Mutex::new(Vec::new()),
        answer_after: plan.answer_after,
        stop: CancellationToken::new(),
        first_error: std::sync::Mutex::new(None),
        rebuilt: std::sync::Mutex::new(Vec::new()),
    });
    let t0 = Instant::now();
    let stop_sampling = CancellationToken::new();
    let sampling = sample(
        shared.clone(),
        ctx.env.pool.clone(),
        worker_pids.clone(),
        model_port,
        t0,
        plan.sample_every,
        stop_sampling.clone(),
    );

    // Little's law: L = λ·W. The first rate comes from the scripted duration. Once the longest
    // run could have ended, the in-flight count, averaged, says what W is at that load and the
    // rate is set from it; a second correction, one run's length later, catches the change of W
    // with the new rate (unless --offered-rate fixes the rate). At 1,000 in flight the first
    // lowered the rate by 6–11 % in trials, the second by about 2 %.
    let mean_secs = plan.mean_scripted_secs();
    let longest = plan.longest_scripted_secs();
    let n = plan.in_flight as f64;
    let mut rate = plan.offered_rate.unwrap_or(n / mean_secs);
    let mut rates = vec![rate];
    let mut corrections: std::collections::VecDeque<(f64, f64)> = if plan.offered_rate.is_none() {
        [(1.1, 1.6), (2.6, 3.1)]
            .into_iter()
            .map(|(from, to)| (from * longest, to * longest))
            .collect()
    } else {
        Default::default()
    };
    let mut measured: (f64, u64) = (0.0, 0);
    let sustain_from = if corrections.is_empty() {
        1.5 * longest
    } else {
        3.6 * longest
    };
    let sustain_to = sustain_from + plan.duration.as_secs_f64();
    let cap = plan.in_flight * 3 + 100;
    let mut window: Option<WindowStart> = None;
    let mut late = Duration::ZERO;
    let mut due = 0.0f64;
    let mut index = 0u64;
    loop {
        let now = t0.elapsed().as_secs_f64();
        if window.is_none() && now >= sustain_from {
            let used = redis_used_memory(&mut rconn).await.unwrap_or(0);
            let commands = crate::ops::redis_commandstats().await.ok();
            window = Some((sampler.snapshot()?, Tally::now(&shared), used, commands));
        }
        if now >= sustain_to {
            break;
        }
        if let Some(&(from, to)) = corrections.front() {
            let in_flight = shared.in_flight.load(Ordering::Relaxed) as f64;
            if now >= from && now < to {
                measured = (measured.0 + in_flight, measured.1 + 1);
            } else if now >= to {
                corrections.pop_front();
                if measured.1 > 0 {
                    let held = measured.0 / measured.1 as f64;
                    rate = (rate * n / held.max(1.0)).clamp(rate / 4.0, rate * 4.0);
                    rates.push(rate);
                }
                measured = (0.0, 0);
            }
        }
        let at = t0 + Duration::from_secs_f64(due);
        tokio::time::sleep_until(at.into()).await;
        while shared.in_flight.load(Ordering::Relaxed) >= cap {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        late = late.max(Instant::now().saturating_duration_since(at));
        let u = unit(index, 1);
        let kind = if u < plan.question_share {
            Kind::Question
        } else if u < plan.question_share + plan.confirm_share {
            Kind::Confirm
        } else {
            Kind::Plain
        };
        let cut = (unit(index, 2) < plan.cut_share)
            .then(|| Duration::from_secs_f64(mean_secs * (0.1 + 0.8 * unit(index, 3))));
        let body = bodies
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, b)| b.clone())
            .expect("a body per kind");
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        add(&shared.counters.submitted);
        tokio::spawn(one_run(shared.clone(), body, cut));
        index += 1;
        due += 1.0 / rate;
    }
    let end_cpu = sampler.snapshot()?;
    let end = Tally::now(&shared);
    let redis_at_end = redis_used_memory(&mut rconn).await.unwrap_or(0);
    let commands_at_end = crate::ops::redis_commandstats().await.ok();
    let in_flight_at_end = shared.in_flight.load(Ordering::Relaxed);
    // What the keys of runs in flight hold right now (a sample).
    let active: Vec<(String,)> = sqlx::query_as(
        "SELECT id::text FROM runs
          WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')
          ORDER BY random() LIMIT 200",
    )
    .fetch_all(&ctx.env.pool)
    .await?;
    let mut active_usage = (0i64, 0usize);
    for (id,) in &active {
        let (_, usage) = run_keys(&mut rconn, &ctx.env.prefix, id).await?;
        active_usage = (active_usage.0 + usage, active_usage.1 + 1);
    }
    let (start_cpu, start, redis_at_start, commands_at_start) =
        window.context("the sustained window never opened")?;
    let cpu = sampler.usage(&start_cpu, &end_cpu);
    let steps: Vec<String> = rates.iter().map(|r| format!("{r:.1}")).collect();
    println!(
        "load: runs/s offered {}; {} submitted, draining {in_flight_at_end} in flight",
        steps.join(" -> "),
        get(&shared.counters.submitted)
    );

    // Drain: every run still in flight gets to its end, or is counted as not completed.
    let drain = Duration::from_secs_f64(3.0 * longest + 60.0);
    let deadline = Instant::now() + drain;
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shared.stop.cancel();
    let deadline = Instant::now() + Duration::from_secs(10);
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_sampling.cancel();
    let samples = sampling.await?;
    let redis_after = redis_used_memory(&mut rconn).await.unwrap_or(0);
    // A final iteration's timing is written by the worker's next statement or sweep.
    tokio::time::sleep(Duration::from_secs(if ctx.args.smoke { 1 } else { 3 })).await;
    let pg_after = pg_bytes(&ctx.env.pool).await?;

    if let Some(error) = shared
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        println!("load: a submission failed: {error}");
    }

    for seen in shared
        .rebuilt
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        println!("load: stream_rebuilt seen: {seen}");
    }

    // ---- figures ----
    let section = "load";
    let secs = end.at.duration_since(start.at).as_secs_f64();
    let (from_s, to_s) = (
        start.at.duration_since(t0).as_secs_f64(),
        end.at.duration_since(t0).as_secs_f64(),
    );
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= from_s && s.at <= to_s)
        .collect();
    let mean = |f: &dyn Fn(&Sample) -> f64| {
        inside.iter().map(|s| f(s)).sum::<f64>() / inside.len().max(1) as f64
    };
    let in_flight_mean = mean(&|s| s.in_flight as f64);
    let in_flight_min = inside.iter().map(|s| s.in_flight).min().unwrap_or(0);
    let running_mean = mean(&|s| s.running as f64);
    let full = !ctx.args.smoke;
    report.add(
        section,
        "runs in flight, mean over the window",
        in_flight_mean,
        &format!("(asked {}; min {in_flight_min})", plan.in_flight),
        full.then_some(("goal >= 1000", in_flight_mean >= 1000.0)),
    );
    report.add(
        section,
        "runs held by a worker (running), mean",
        running_mean,
        &format!("({} x {} slots)", plan.workers, plan.slots),
        None,
    );
    report.add(section, "offered runs/s", rate, "/s", None);
    report.add(
        section,
        "latest submission behind its moment",
        late.as_secs_f64() * 1000.0,
        "ms",
        None,
    );
    let completed = (end.completed - start.completed) as f64;
    report.add(
        section,
        "completed runs/s over the window",
        completed / secs,
        &format!("/s ({secs:.0} s)"),
        None,
    );
    let durations = {
        let finished = shared.finished.lock().unwrap_or_else(|e| e.into_inner());
        sorted(finished.iter().map(|(_, _, ms)| *ms).collect())
    };
    report.add(
        section,
        "run duration p50 (POST to run_completed at the client)",
        percentile(&durations, 0.5),
        &format!("ms (scripted mean {:.0})", mean_secs * 1000.0),
        None,
    );
    report.add(
        section,
        "run duration p99",
        percentile(&durations, 0.99),
        "ms",
        None,
    );

    // CPU
    let busy = cpu.machine_ms / (secs * 1000.0);
    report.add(
        section,
        "machine cores busy over the window",
        busy,
        "cores",
        Some(("goal <= 1.6", busy <= 1.6)),
    );
    let tokens = (end.tokens - start.tokens) as f64;
    let per_run = |ms: f64| ms / completed.max(1.0);
    let per_k_tokens = |ms: f64| ms / (tokens / 1000.0).max(1e-9);
    report.add(
        section,
        "machine CPU per completed run",
        per_run(cpu.machine_ms),
        "ms",
        None,
    );
    report.add(
        section,
        "machine CPU per 1,000 streamed tokens",
        per_k_tokens(cpu.machine_ms),
        &format!("ms ({tokens:.0} tokens in the window)"),
        None,
    );
    let mut parts = Vec::new();
    let mut split = serde_json::Map::new();
    let mut groups: Vec<(&str, f64)> = cpu.groups.clone();
    groups.push(("other", cpu.other_ms()));
    for (name, ms) in &groups {
        report.add(
            section,
            &format!("{name} CPU per run"),
            per_run(*ms),
            &format!("ms ({:.2} ms per 1,000 tokens)", per_k_tokens(*ms)),
            None,
        );
        let cores = *ms / (secs * 1000.0);
        parts.push(format!("{name} {cores:.2}"));
        split.insert(
            (*name).to_owned(),
            json!({"ms_per_run": per_run(*ms), "ms_per_1000_tokens": per_k_tokens(*ms), "cores": cores}),
        );
    }
    println!(
        "load: cores busy: {} · machine {busy:.2}",
        parts.join(" · ")
    );
    report.json.insert("load.cpu".into(), Value::Object(split));
    let harness: f64 = groups
        .iter()
        .filter(|(name, _)| ["model", "tools", "clients"].contains(name))
        .map(|(_, ms)| ms)
        .sum::<f64>()
        / (secs * 1000.0);
    report.add(
        section,
        "cores busy less the harness (model, tools, clients)",
        busy - harness,
        &format!("cores (the harness {harness:.2})"),
        None,
    );
    if let (Some(before), Some(after)) = (&commands_at_start, &commands_at_end) {
        let commands = crate::ops::commands_delta(before, after);
        let total: u64 = commands.iter().map(|(_, n)| n).sum();
        report.add(
            section,
            "Redis commands per run",
            total as f64 / completed.max(1.0),
            "(whole server)",
            None,
        );
        let top: Vec<String> = commands
            .iter()
            .take(8)
            .map(|(name, n)| format!("{name} {:.1}", *n as f64 / completed.max(1.0)))
            .collect();
        println!("load: redis commands per run: {}", top.join(" · "));
    }

    // Token latency
    let p50 = histogram_percentile(&start.latency, &end.latency, 0.5);
    let p99 = histogram_percentile(&start.latency, &end.latency, 0.99);
    report.add(
        section,
        "token latency p50 (model write to SSE client read)",
        p50,
        "ms (1 ms resolution)",
        None,
    );
    report.add(
        section,
        "token latency p99",
        p99,
        "ms",
        Some(("goal <= 150 ms", p99 <= 150.0)),
    );
    let c = &shared.counters;
    report.add(
        section,
        "tokens replayed after a reconnect (not timed)",
        get(&c.tokens_replayed) as f64,
        &format!("(of {} tokens)", get(&c.tokens)),
        None,
    );

    // Framework time per iteration, as e2e reports it, of the window's iterations.
    let fw: Vec<(i64,)> = sqlx::query_as(
        "SELECT total_us - model_us - tools_us FROM iterations
          WHERE started_at >= $1 AND started_at < $2",
    )
    .bind(start.utc)
    .bind(end.utc)
    .fetch_all(&ctx.env.pool)
    .await?;
    let fw = sorted(fw.into_iter().map(|(v,)| v as f64 / 1000.0).collect());
    report.add(
        section,
        "framework time per iteration p50",
        percentile(&fw, 0.5),
        "ms (goal <= 5 is for e2e --rate)",
        None,
    );
    report.add(
        section,
        "framework time per iteration p99",
        percentile(&fw, 0.99),
        "ms (goal <= 25 is for e2e --rate)",
        None,
    );

    // Memory and connections
    let rss_per_run =
        mean(&|s| s.worker_rss_kib.saturating_sub(rss_idle) as f64 / s.in_flight.max(1) as f64);
    let rss_per_held =
        mean(&|s| s.worker_rss_kib.saturating_sub(rss_idle) as f64 / s.running.max(1) as f64);
    report.add(
        section,
        "worker RSS per in-flight run (above idle)",
        rss_per_run,
        &format!(
            "KiB ({rss_per_held:.1} per held run; idle {:.1} MiB)",
            rss_idle as f64 / 1024.0
        ),
        Some(("goal <= 48 KiB", rss_per_run <= 48.0)),
    );
    let max_rss = inside.iter().map(|s| s.worker_rss_kib).max().unwrap_or(0);
    report.add(
        section,
        "worker RSS, highest in the window",
        max_rss as f64 / 1024.0,
        "MiB",
        None,
    );
    let conns = mean(&|s| s.model_connections as f64);
    let conns_max = inside
        .iter()
        .map(|s| s.model_connections)
        .max()
        .unwrap_or(0);
    report.add(
        section,
        "model connections open, mean",
        conns,
        &format!(
            "(max {conns_max}; {:.2} per held run)",
            conns / running_mean.max(1.0)
        ),
        None,
    );

    // Redis: the finished runs' keys first (sampled), then what an in-flight run adds.
    let finished = shared
        .finished
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let step = (finished.len() / 200).max(1);
    let (mut listed, mut usage, mut text, mut counted) = (0usize, 0i64, 0usize, 0usize);
    for (id, text_bytes, _) in finished.iter().step_by(step).take(200) {
        let (items, bytes) = run_keys(&mut rconn, &ctx.env.prefix, id).await?;
        if items == 0 {
            continue;
        }
        listed += items;
        usage += bytes;
        text += text_bytes;
        counted += 1;
    }
    let ratio = listed as f64 / text.max(1) as f64;
    report.add(
        section,
        "finished run's list bytes / its streamed text",
        ratio,
        &format!(
            "ratio ({counted} runs sampled, {} B of text a run)",
            text / counted.max(1)
        ),
        Some(("goal <= 2x", ratio <= 2.0)),
    );
    let usage_per_run = usage as f64 / counted.max(1) as f64;
    report.add(
        section,
        "Redis MEMORY USAGE of a finished run's keys",
        usage_per_run,
        &format!("B ({:.2}x its text)", usage as f64 / text.max(1) as f64),
        None,
    );
    let finished_total = get(&c.completed) + get(&c.not_completed);
    let info_per_finished =
        (redis_after as f64 - redis_before as f64) / finished_total.max(1) as f64;
    report.add(
        section,
        "Redis used_memory growth per finished run",
        info_per_finished,
        "B (INFO memory, whole server)",
        None,
    );
    let retention_h = 24.0;
    let day_at_100 = usage_per_run * 100.0 * 86_400.0;
    report.add(
        section,
        "Redis memory kept at 100 runs/s, 24 h retention",
        day_at_100 / f64::from(1u32 << 30),
        "GiB",
        None,
    );
    let keep_1gib_h = f64::from(1u32 << 30) / (usage_per_run.max(1.0) * 100.0) / 3600.0;
    report.add(
        section,
        "retention that keeps it under 1 GiB at 100 runs/s",
        keep_1gib_h.min(retention_h * 365.0),
        "h",
        None,
    );
    let active_per_run = active_usage.0 as f64 / active_usage.1.max(1) as f64;
    report.add(
        section,
        "Redis MEMORY USAGE of an in-flight run's keys",
        active_per_run,
        &format!(
            "B ({} runs in flight sampled at the window's end)",
            active_usage.1
        ),
        None,
    );
    // The whole server's growth, less what the finished runs keep: the in-flight runs' keys
    // and everything else they cost Redis (the API's subscription, its buffers), and whatever
    // else uses the server meanwhile.
    let in_flight_redis =
        (redis_at_end as f64 - redis_before as f64 - end.finished as f64 * info_per_finished)
            / in_flight_at_end.max(1) as f64;
    report.add(
        section,
        "Redis used_memory per in-flight run",
        in_flight_redis,
        &format!(
            "B (INFO memory at the window's end less the finished runs'; {:.1} MiB grew in the window)",
            (redis_at_end as f64 - redis_at_start as f64) / 1_048_576.0
        ),
        None,
    );

    // Postgres
    let runs = get(&c.submitted).max(1) as f64;
    let d = |f: fn(&PgBytes) -> i64| (f(&pg_after) - f(&pg_before)) as f64 / runs;
    let (heap, toast, indexes, wal) = (
        d(|b| b.heap),
        d(|b| b.toast),
        d(|b| b.indexes),
        d(|b| b.wal),
    );
    report.add(
        section,
        "Postgres bytes per run: heap + TOAST + indexes",
        heap + toast + indexes,
        &format!("B (heap {heap:.0}, TOAST {toast:.0}, indexes {indexes:.0})"),
        None,
    );
    report.add(
        section,
        "Postgres WAL per run",
        wal,
        "B (the whole server's)",
        None,
    );

    // The clients
    let dropped = get(&c.dropped);
    report.add(
        section,
        "SSE clients dropped",
        get(&c.runs_with_drops) as f64,
        &format!("({dropped} streams ended early)"),
        Some(("goal 0", get(&c.runs_with_drops) == 0)),
    );
    report.add(
        section,
        "SSE streams cut on purpose / reconnected at a pause",
        get(&c.cut) as f64,
        &format!(
            "/ {} (refused or failed to connect: {})",
            get(&c.pause_reconnects),
            get(&c.refused)
        ),
        None,
    );
    let broken = get(&c.gaps) + get(&c.duplicates);
    report.add(
        section,
        "event ids with a gap or a duplicate across reconnects",
        broken as f64,
        &format!(
            "({} gaps, {} duplicates, {} stream_rebuilt)",
            get(&c.gaps),
            get(&c.duplicates),
            get(&c.rebuilt)
        ),
        Some(("goal 0", broken == 0)),
    );
    let not_completed = get(&c.not_completed) + get(&c.submit_failed);
    report.add(
        section,
        "runs not completed",
        not_completed as f64,
        &format!(
            "(of {}; {} submissions failed, {} answers failed)",
            get(&c.submitted),
            get(&c.submit_failed),
            get(&c.answers_failed)
        ),
        Some(("goal 0", not_completed == 0)),
    );
    let mut config = plan.config_json(rate);
    config["rates"] = json!(rates);
    report.json.insert("load.config".into(), config);
    report.json.insert(
        "load.samples".into(),
        json!(
            samples
                .iter()
                .map(|s| json!([
                    s.at,
                    s.in_flight,
                    s.running,
                    s.worker_rss_kib,
                    s.model_connections
                ]))
                .collect::<Vec<_>>()
        ),
    );
    drop(workers);
    drop(api);
    drop((model, tools));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(turns: usize, tool_calls: usize) -> Plan {
        Plan {
            in_flight: 10,
            duration: Duration::from_secs(1),
            offered_rate: None,
            first_byte_ms: 800,
            turns,
            tokens: 80,
            chunk_gap_ms: 25,
            tool_calls,
            tool_ms: 300,
            question_share: 0.1,
            confirm_share: 0.05,
            answer_after: Duration::from_secs(2),
            cut_share: 0.1,
            workers: 1,
            slots: 16,
            sample_every: Duration::from_secs(1),
        }
    }

    #[test]
    fn tool_calls_are_dealt_round_the_calls_before_the_last() {
        let p = plan(3, 2);
        assert_eq!((p.calls_in(0), p.calls_in(1), p.calls_in(2)), (1, 1, 0));
        assert_eq!(p.pausing_turn(), 1);
        let p = plan(4, 5);
        assert_eq!(
            (0..4).map(|t| p.calls_in(t)).collect::<Vec<_>>(),
            [2, 2, 1, 0]
        );
        let p = plan(3, 1);
        assert_eq!(p.pausing_turn(), 0, "the last call with tool calls");
        let p = plan(2, 0);
        assert_eq!(p.pausing_turn(), 0);
    }

    #[test]
    fn scripts_pause_where_their_kind_says() {
        let p = plan(3, 2);
        let plain = p.script(Kind::Plain);
        let question = p.script(Kind::Question);
        let confirm = p.script(Kind::Confirm);
        assert_eq!(plain.as_array().unwrap().len(), 3);
        assert_eq!(
            plain[1]["tool_calls"],
            json!([{"name": "slow", "arguments": {"ms": 300}}])
        );
        assert_eq!(question[1]["tool_calls"][1]["name"], "ask");
        assert_eq!(confirm[1]["tool_calls"][0]["name"], "slow_confirmed");
        assert_eq!(confirm[0]["tool_calls"][0]["name"], "slow");
        assert_eq!(plain[2]["tool_calls"], json!([]));
        assert_eq!(plain[0]["content"].as_str().unwrap().len(), 4 * 80);
    }

    #[test]
    fn the_scripted_duration_counts_every_wait() {
        let p = plan(3, 2);
        // Per call: 800 ms, then 25 ms before each frame but the first: role, 80 pieces, the
        // finish and the usage, and per tool call its head and three argument pieces.
        let tool_turn = 800.0 + 25.0 * (1.0 + 80.0 + 4.0 + 2.0 - 1.0) + 300.0;
        let last = 800.0 + 25.0 * (1.0 + 80.0 + 2.0 - 1.0);
        let plain = p.scripted_secs(Kind::Plain);
        assert!(
            (plain - (2.0 * tool_turn + last) / 1000.0).abs() < 1e-9,
            "{plain}"
        );
        let confirm = p.scripted_secs(Kind::Confirm);
        assert!((confirm - plain - 2.0).abs() < 1e-9);
        let question = p.scripted_secs(Kind::Question);
        assert!(
            (question - plain - 2.0 - 0.1).abs() < 1e-9,
            "the ask streams too"
        );
        assert!(p.longest_scripted_secs() >= question);
    }

    #[test]
    fn percentiles_of_a_histogram_count_only_the_window() {
        let h = Histogram::new();
        h.record(500);
        let before = h.snapshot();
        for ms in [10, 20, 30, 40, 200_000] {
            h.record(ms);
        }
        let after = h.snapshot();
        assert_eq!(histogram_percentile(&before, &after, 0.5), 30.0);
        assert_eq!(histogram_percentile(&before, &after, 0.0), 10.0);
        assert_eq!(
            histogram_percentile(&before, &after, 1.0),
            Histogram::MAX_MS as f64
        );
        assert!(histogram_percentile(&after, &after, 0.5).is_nan());
    }

    #[test]
    fn established_connections_are_counted_on_the_local_port() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:1F90 0100007F:C351 06 00000000:00000000 00:00000000 00000000     0        0 4 1";
        assert_eq!(established_on(text, 8080), 1);
        assert_eq!(established_on(text, 50000), 1);
        assert_eq!(established_on(text, 1), 0);
    }

    #[test]
    fn the_mix_of_kinds_and_cuts_follows_the_shares() {
        let n = 20_000;
        let questions = (0..n).filter(|i| unit(*i, 1) < 0.1).count();
        let cuts = (0..n).filter(|i| unit(*i, 2) < 0.1).count();
        assert!((1800..2200).contains(&questions), "{questions}");
        assert!((1800..2200).contains(&cuts), "{cuts}");
    }
}
