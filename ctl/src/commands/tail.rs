//! `tail RUN`: follows a run's Server-Sent Events. `message_delta` text is printed inline as
//! it streams; every other event is one line, `[type] summary` (`plan_created`: one line per
//! task, so a planner's tasks can be followed by their run ids). A dropped connection is
//! resumed with `Last-Event-ID` (so nothing is printed twice or skipped), at most
//! `--reconnects` times in a row with backoff. Ends with the run: exit 0 when it completed,
//! 1 when it failed or was cancelled. At a pause (`input_required`, `confirmation_required`)
//! it keeps waiting for the answer, or, with `--until-pause`, exits 4.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use reqwest::Method;
use serde_json::Value;

use crate::Ctx;
use crate::client::{Retry, clip};
use crate::commands::{s, uuid_arg};
use crate::error::{CtlError, Result};

/// One event (all its lines) larger than this is not one the API sends; a stream that tries is
/// cut rather than buffered without end.
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run.
    pub run: String,
    /// Start after this event id (0: the whole history, replayed first).
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Exit (code 4) when the run pauses for an answer or a decision, instead of waiting.
    #[arg(long)]
    pub until_pause: bool,
    /// Reconnects in a row (no event in between) before giving up (exit 3).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub reconnects: u32,
    /// Seconds without a byte (the API sends a keep-alive every 15 s by default) after which
    /// the connection counts as dropped.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub idle_timeout: u64,
}

/// How one connection ended.
enum End {
    /// The run ended with this terminal event.
    Terminal(Value),
    /// The server closed the stream after a pausing event (the run's newest).
    Paused(Value),
    /// Closed or broken without a terminal event: reconnect.
    Dropped(String),
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let id = uuid_arg("run id", &a.run)?;
    let mut printer = Printer {
        json: ctx.json,
        mid_line: false,
        run_id: id.clone(),
    };
    let mut last_id = a.after;
    let mut failures = 0u32;
    let path = format!("/v1/runs/{id}/events");
    loop {
        let c = &ctx.client;
        let resp = c
            .send(Retry::Idempotent, || {
                c.request(Method::GET, &path, None)
                    .header("Last-Event-ID", last_id.to_string())
                    .header("Accept", "text/event-stream")
            })
            .await?;
        let before = last_id;
        let end = follow(
            resp,
            Duration::from_secs(a.idle_timeout),
            &mut last_id,
            &mut printer,
        )
        .await?;
        if last_id > before {
            failures = 0;
        }
        match end {
            End::Terminal(ev) => {
                printer.end_line();
                return outcome(&id, &ev);
            }
            End::Paused(ev) => {
                if a.until_pause {
                    printer.end_line();
                    return Err(CtlError::Paused(format!(
                        "run {id} is waiting ({})",
                        s(&ev, "type")
                    )));
                }
                // The API holds the reconnected stream open until the run is resumed.
            }
            End::Dropped(why) => {
                failures += 1;
                if failures > a.reconnects {
                    printer.end_line();
                    return Err(CtlError::Unavailable(format!(
                        "the event stream of run {id} dropped {failures} times in a row: {why}"
                    )));
                }
                let wait = ctx.client.backoff.saturating_mul(1 << failures.min(6));
                tokio::time::sleep(wait.min(ctx.client.max_backoff)).await;
            }
        }
    }
}

async fn follow(
    resp: reqwest::Response,
    idle: Duration,
    last_id: &mut u64,
    printer: &mut Printer,
) -> Result<End> {
    let mut events = Box::pin(guarded(resp, idle).eventsource());
    let mut paused: Option<Value> = None;
    loop {
        let ev = match events.next().await {
            None => {
                return Ok(match paused {
                    Some(p) => End::Paused(p),
                    None => End::Dropped("the stream closed before the run ended".into()),
                });
            }
            Some(Err(e)) => return Ok(End::Dropped(e.to_string())),
            Some(Ok(ev)) => ev,
        };
        if ev.data.is_empty() {
            continue;
        }
        let env: Value = serde_json::from_str(&ev.data)
            .map_err(|e| CtlError::Protocol(format!("an event is not JSON: {e}")))?;
        let Some(eid) = env["id"].as_u64() else {
            return Err(CtlError::Protocol("an event has no numeric id".into()));
        };
        // Ids only grow; an old one (a replay overlapping what was printed) is skipped.
        if eid <= *last_id {
            continue;
        }
        *last_id = eid;
        printer.print(&env);
        match env["type"].as_str().unwrap_or_default() {
            "run_completed" | "run_failed" | "run_cancelled" => return Ok(End::Terminal(env)),
            "input_required" | "confirmation_required" => paused = Some(env),
            _ => paused = None,
        }
    }
}

fn outcome(id: &str, ev: &Value) -> Result<()> {
    let d = &ev["data"];
    match ev["type"].as_str().unwrap_or_default() {
        "run_completed" => Ok(()),
        "run_failed" => Err(CtlError::Outcome(format!(
            "run {id} failed: {}: {}",
            s(d, "code"),
            clean(&clip(s(d, "message"), 500))
        ))),
        _ => Err(CtlError::Outcome(format!("run {id} was cancelled"))),
    }
}

/// The response's bytes, with an idle timeout and a bound on one event's size.
fn guarded(
    resp: reqwest::Response,
    idle: Duration,
) -> impl Stream<Item = std::result::Result<Bytes, String>> {
    struct State<S> {
        inner: S,
        event_len: usize,
        prev_newline: bool,
        done: bool,
    }
    let state = State {
        inner: Box::pin(resp.bytes_stream()),
        event_len: 0,
        prev_newline: false,
        done: false,
    };
    futures_util::stream::unfold(state, move |mut st| async move {
        if st.done {
            return None;
        }
        let item = match tokio::time::timeout(idle, st.inner.next()).await {
            Err(_) => Err(format!("nothing received for {}s", idle.as_secs())),
            Ok(None) => return None,
            Ok(Some(Err(e))) => Err(format!("connection broke: {e}")),
            Ok(Some(Ok(chunk))) => {
                for &b in chunk.iter() {
                    match b {
                        b'\n' => {
                            if st.prev_newline {
                                st.event_len = 0;
                            }
                            st.prev_newline = true;
                        }
                        b'\r' => {}
                        _ => {
                            st.prev_newline = false;
                            st.event_len += 1;
                        }
                    }
                }
                if st.event_len > MAX_EVENT_BYTES {
                    Err(format!("an event is larger than {MAX_EVENT_BYTES} bytes"))
                } else {
                    Ok(chunk)
                }
            }
        };
        st.done = item.is_err();
        Some((item, st))
    })
}

/// Text from the server goes to a terminal: control characters (escape sequences) are
/// replaced, newlines and tabs kept.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

struct Printer {
    json: bool,
    /// Delta text was printed without a closing newline.
    mid_line: bool,
    run_id: String,
}

impl Printer {
    fn end_line(&mut self) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
    }

    fn print(&mut self, env: &Value) {
        if self.json {
            println!("{env}");
            return;
        }
        let ty = env["type"].as_str().unwrap_or("unknown");
        let d = &env["data"];
        if ty == "message_delta" {
            let text = clean(d["text"].as_str().unwrap_or_default());
            if !text.is_empty() {
                print!("{text}");
                let _ = std::io::stdout().flush();
                self.mid_line = !text.ends_with('\n');
            }
            return;
        }
        self.end_line();
        for line in lines(ty, d, &self.run_id) {
            let line = clean(&line);
            if line.is_empty() {
                println!("[{ty}]");
            } else {
                println!("[{ty}] {line}");
            }
        }
    }
}

fn compact(v: &Value, max: usize) -> String {
    match v {
        Value::String(s) => clip(s, max),
        other => clip(&other.to_string(), max),
    }
}

fn num(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// `v` clipped and on one line: a task's title or output cannot start a line of its own that
/// would read as another event.
fn one_line(v: &Value, max: usize) -> String {
    if v.is_null() {
        return String::new();
    }
    compact(v, max).replace(['\n', '\r', '\t'], " ")
}

/// The lines an event prints: one, except `plan_created`, one per task.
fn lines(ty: &str, d: &Value, run_id: &str) -> Vec<String> {
    if ty != "plan_created" {
        return vec![summary(ty, d, run_id)];
    }
    let tasks = d["tasks"].as_array().map(Vec::as_slice).unwrap_or_default();
    if tasks.is_empty() {
        return vec![format!("round {}: no tasks", num(&d["round"]))];
    }
    tasks
        .iter()
        .map(|t| {
            format!(
                "round {} task {}/{} run {} {}: {}",
                num(&d["round"]),
                num(&t["task_index"]) + 1,
                tasks.len(),
                s(t, "run_id"),
                s(t, "status"),
                one_line(&t["title"], 200)
            )
        })
        .collect()
}

/// A task's outcome: its output's start, or its error.
fn task_outcome(d: &Value) -> String {
    if d["status"] == "completed" {
        one_line(&d["output"], 200)
    } else if d["error"].is_object() {
        format!(
            "{}: {}",
            s(&d["error"], "code"),
            one_line(&d["error"]["message"], 200)
        )
    } else {
        one_line(&d["error"], 200)
    }
}

/// One line per event type (docs/events.md lists them); unknown types show their data.
fn summary(ty: &str, d: &Value, run_id: &str) -> String {
    match ty {
        "run_queued" => String::new(),
        "run_started" => format!("attempt {} on {}", num(&d["attempt"]), s(d, "worker")),
        "run_recovered" => format!(
            "attempt {} on {}, redoing iteration {}",
            num(&d["attempt"]),
            s(d, "worker"),
            num(&d["iteration"])
        ),
        "iteration_started" => num(&d["iteration"]).to_string(),
        "message_completed" => {
            let calls: Vec<&str> = d["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| s(c, "name"))
                .collect();
            let mut out = format!(
                "finish_reason={} tokens={}+{}",
                s(d, "finish_reason"),
                num(&d["usage"]["prompt_tokens"]),
                num(&d["usage"]["completion_tokens"])
            );
            if !calls.is_empty() {
                out.push_str(&format!(" calls: {}", calls.join(", ")));
            }
            out
        }
        "tool_started" => format!(
            "{} {} ({})",
            s(d, "name"),
            compact(&d["arguments"], 200),
            s(d, "tool_call_id")
        ),
        "tool_completed" => {
            let ok = d["ok"].as_bool().unwrap_or(false);
            // A failure carries `error` (bad arguments, unknown tool) or the tool's `result`.
            let detail = if ok || d["error"].is_null() {
                &d["result"]
            } else {
                &d["error"]
            };
            format!(
                "{} {} {}",
                s(d, "name"),
                if ok { "ok" } else { "failed" },
                compact(detail, 200)
            )
        }
        "input_required" => {
            let budget = if d["kind"] == "budget" {
                " (token budget)"
            } else {
                ""
            };
            format!(
                "{}{budget} -- answer: agentfleetctl answer {run_id} \"…\"",
                compact(&d["question"], 500)
            )
        }
        "confirmation_required" => {
            let calls: Vec<String> = d["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    format!(
                        "{} {} risk={} ({})",
                        s(c, "name"),
                        compact(&c["arguments"], 200),
                        s(c, "risk"),
                        s(c, "tool_call_id")
                    )
                })
                .collect();
            format!(
                "{} -- decide: agentfleetctl approve {run_id} --all [--reject]",
                calls.join("; ")
            )
        }
        "run_resumed" => s(d, "kind").to_owned(),
        "run_completed" => format!("after iteration {}", num(&d["iteration"])),
        "run_failed" => format!("{}: {}", s(d, "code"), compact(&d["message"], 500)),
        "run_cancelled" => format!("was {}", s(d, "previous_status")),
        "task_completed" => format!(
            "round {} task {} run {} {}: {} -- {}",
            num(&d["round"]),
            num(&d["task_index"]) + 1,
            s(d, "run_id"),
            s(d, "status"),
            one_line(&d["title"], 200),
            task_outcome(d)
        ),
        "round_completed" => {
            let counts: Vec<String> = d["statuses"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(status, n)| format!("{} {status}", num(n)))
                .collect();
            format!(
                "round {}: {} tasks ({})",
                num(&d["round"]),
                num(&d["tasks"]),
                counts.join(", ")
            )
        }
        "stream_rebuilt" => format!(
            "status={} (events were lost; this is the run's state from the database)",
            s(d, "status")
        ),
        _ => compact(d, 300),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summaries_are_one_line_and_escape_codes_are_defused() {
        let s = summary(
            "tool_started",
            &json!({"name": "lookup", "arguments": {"q": 1}, "tool_call_id": "c1"}),
            "r",
        );
        assert_eq!(s, "lookup {\"q\":1} (c1)");
        assert_eq!(clean("a\x1b[2Jb\nc"), "a\u{FFFD}[2Jb\nc");
        let f = summary("run_failed", &json!({"code": "x", "message": "boom"}), "r");
        assert_eq!(f, "x: boom");
        assert!(summary("whatever", &json!({"a": 1}), "r").contains("\"a\":1"));
    }

    #[test]
    fn a_plan_prints_a_line_per_task_and_titles_stay_on_their_line() {
        let created = json!({"round": 1, "tasks": [
            {"task_index": 0, "title": "Find Q3", "run_id": "r1", "status": "queued"},
            {"task_index": 1, "title": "evil\n[run_completed] x", "run_id": "r2", "status": "waiting_for_slot"}
        ]});
        assert_eq!(
            lines("plan_created", &created, "p"),
            [
                "round 1 task 1/2 run r1 queued: Find Q3",
                "round 1 task 2/2 run r2 waiting_for_slot: evil [run_completed] x"
            ]
        );
        let done = json!({"round": 1, "task_index": 1, "title": "Find Q2", "run_id": "r2",
                          "status": "failed", "error": {"code": "model_error", "message": "no\nledger"}});
        assert_eq!(
            summary("task_completed", &done, "p"),
            "round 1 task 2 run r2 failed: Find Q2 -- model_error: no ledger"
        );
        let round = json!({"round": 1, "tasks": 2, "statuses": {"completed": 1, "failed": 1}});
        assert_eq!(
            summary("round_completed", &round, "p"),
            "round 1: 2 tasks (1 completed, 1 failed)"
        );
    }
}
