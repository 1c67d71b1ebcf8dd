//! One run as its user makes it: submitted, followed by its SSE client to the end (reconnecting
//! with `Last-Event-ID` when cut), answered when it asks; and the latencies they record.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentfleet_tests::mock_llm::{STAMP_LEN, epoch_ms, stamp_age_ms};

/// Token latencies, one bucket a millisecond up to a minute (and one for longer).
pub(super) struct Histogram {
    pub(super) buckets: Vec<AtomicU64>,
}

impl Histogram {
    pub(super) const MAX_MS: usize = 60_000;

    pub(super) fn new() -> Histogram {
        Histogram {
            buckets: (0..=Self::MAX_MS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn record(&self, ms: u64) {
        let i = (ms as usize).min(Self::MAX_MS);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// The percentile `p` of the counts recorded between two snapshots, in ms.
pub(super) fn histogram_percentile(before: &[u64], after: &[u64], p: f64) -> f64 {
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
pub(super) struct Counters {
    pub(super) submitted: AtomicU64,
    pub(super) submit_failed: AtomicU64,
    pub(super) completed: AtomicU64,
    /// Ended failed or cancelled, or without an end by the drain's deadline.
    pub(super) not_completed: AtomicU64,
    pub(super) tokens: AtomicU64,
    /// Tokens the model sent before the client's connection was asked for: replayed after a
    /// reconnect, not timed.
    pub(super) tokens_replayed: AtomicU64,
    /// Streams that ended or failed neither at a pause nor at the run's end, nor cut on purpose.
    pub(super) dropped: AtomicU64,
    /// Runs whose client saw at least one such drop.
    pub(super) runs_with_drops: AtomicU64,
    pub(super) cut: AtomicU64,
    pub(super) pause_reconnects: AtomicU64,
    /// Connection attempts refused (429 too_many_streams, other statuses) or failed.
    pub(super) refused: AtomicU64,
    pub(super) gaps: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) rebuilt: AtomicU64,
    pub(super) answers: AtomicU64,
    pub(super) answers_failed: AtomicU64,
}

pub(super) fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// What the run tasks share.
pub(super) struct Shared {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
    pub(super) key: String,
    pub(super) in_flight: AtomicUsize,
    pub(super) counters: Counters,
    pub(super) latency: Histogram,
    /// Completed runs: id, text streamed (bytes), duration (ms).
    pub(super) finished: std::sync::Mutex<Vec<(String, usize, f64)>>,
    pub(super) answer_after: Duration,
    pub(super) stop: CancellationToken,
    /// The first submission that failed, and why (printed).
    pub(super) first_error: std::sync::Mutex<Option<String>>,
    /// The first `stream_rebuilt` events clients saw (printed: Redis lost a run's events).
    pub(super) rebuilt: std::sync::Mutex<Vec<String>>,
}

#[derive(Deserialize)]
pub(super) struct Envelope<'a> {
    #[serde(borrow)]
    pub(super) data: DeltaData<'a>,
}

#[derive(Deserialize)]
pub(super) struct DeltaData<'a> {
    #[serde(borrow, default)]
    pub(super) text: std::borrow::Cow<'a, str>,
}

/// How a connection of a run's SSE client ended.
pub(super) enum End {
    /// The run's terminal event: completed or not.
    Finished(bool),
    /// Cut on purpose.
    Cut,
    /// The server closed it (after a pause, or not) or it failed.
    Closed,
}

/// One run: submitted, followed by its SSE client to its end (reconnecting after pauses, cuts
/// and drops with `Last-Event-ID`), answered as a user would.
pub(super) async fn one_run(shared: Arc<Shared>, body: Arc<Vec<u8>>, cut_after: Option<Duration>) {
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
pub(super) fn answer(shared: &Arc<Shared>, id: &str, body: Value) {
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
