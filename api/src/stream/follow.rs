//! Following a run's events for an SSE client: replay from the list, then live through the
//! hub, without gap or duplicate; and rebuilding what Redis lost from Postgres.
//!
//! Gap-freedom: the client registers with the hub *before* reading the list, so every event
//! appended after the read arrives live. Live events at or below the last id sent are
//! duplicates of the replay and are skipped; one above the next expected id means something
//! was missed (a resync, a dropped message), and the hole is filled from the list.
//!
//! When Redis lost events (see docs/events.md, "When Redis forgot"): a run of placeholder
//! entries in the list (left by a worker that re-created the list up to the ids clients may
//! have seen), or a list that is gone altogether, is replaced by one `stream_rebuilt` event
//! carrying the run's state from Postgres, at the id of the last event it stands for, so ids
//! stay consistent for every client that reconnects.

use std::borrow::Cow;
use std::time::Duration;

use axum::response::sse::Event;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use uuid::Uuid;

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::event_compaction::{self, Header};
use agentfleet_shared::events::{
    EventType, FINAL_FENCE, Floor, NewEvent, peek, pending_event, timestamp,
};
use agentfleet_shared::store::{messages, runs, tool_calls};

use crate::state::AppState;
use crate::stream::hub::{HubMessage, Subscription};

/// Why a stream stopped early.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("client went away")]
    ClientGone,
    #[error("client too slow; dropped so it can resume with Last-Event-ID")]
    Dropped,
    #[error("server shutting down")]
    Shutdown,
    #[error("redis: {0}")]
    Redis(#[from] agentfleet_shared::events::AppendError),
    #[error("postgres: {0}")]
    Store(#[from] agentfleet_shared::store::StoreError),
}

/// How a stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A run stream ends after a pausing or terminal event.
    Run,
    /// A thread stream goes on through pauses and ends a run at its terminal event.
    Thread,
}

pub struct Follower<'a> {
    pub state: &'a AppState,
    pub tx: &'a mpsc::Sender<Event>,
    pub run_id: Uuid,
    pub last: u64,
    pub ended: bool,
    pub mode: Mode,
    /// Prefix of SSE ids (`<run_id>:` on thread streams).
    pub id_prefix: String,
    /// Placeholder ids waiting to be replaced by one `stream_rebuilt`.
    lost_until: Option<u64>,
    /// The compacted delta range being replayed, with its raw `message_completed`.
    compacted: Option<(Header, String)>,
    /// The run's thread, once looked up (for deltas that could not be rebuilt).
    thread_id: Option<Uuid>,
    /// Since when Postgres has known of events the list does not hold: they may still be on
    /// their way (see [`Follower::rebuild_if_gone`]).
    short_since: Option<tokio::time::Instant>,
    /// The run's status as the last replay that found nothing new read it from Postgres.
    seen_status: Option<RunStatus>,
}

impl<'a> Follower<'a> {
    pub fn new(
        state: &'a AppState,
        tx: &'a mpsc::Sender<Event>,
        run_id: Uuid,
        after: u64,
        mode: Mode,
    ) -> Self {
        let id_prefix = if mode == Mode::Thread {
            format!("{run_id}:")
        } else {
            String::new()
        };
        Follower {
            state,
            tx,
            run_id,
            last: after,
            ended: false,
            mode,
            id_prefix,
            lost_until: None,
            compacted: None,
            thread_id: None,
            short_since: None,
            seen_status: None,
        }
    }

    async fn send(&mut self, id: u64, kind: &str, raw: &str) -> Result<(), FollowError> {
        let event = Event::default()
            .id(format!("{}{id}", self.id_prefix))
            .event(kind)
            .data(raw);
        self.tx
            .send(event)
            .await
            .map_err(|_| FollowError::ClientGone)?;
        self.last = id;
        // A shortfall seen before is measured again from the next one: events came.
        self.short_since = None;
        let kind = serde_json::from_value::<EventType>(Value::String(kind.to_owned())).ok();
        self.ended =
            kind.is_some_and(|k| k.is_terminal() || (self.mode == Mode::Run && k.ends_stream()));
        Ok(())
    }

    /// Offers one stored event; returns false if it is not the next one (a hole).
    async fn offer(&mut self, raw: &str, is_last: bool) -> Result<bool, FollowError> {
        let Some((id, kind)) = peek(raw) else {
            return Ok(true);
        };
        if id <= self.last {
            return Ok(true);
        }
        // A placeholder stands for every id up to its own that Redis lost (one per id after a
        // small gap, or one for a whole range after the list was lost): they become one
        // `stream_rebuilt`, which may skip ids.
        if kind == "lost" {
            self.lost_until = Some(id);
            if is_last {
                self.flush_lost().await?;
            }
            return Ok(true);
        }
        if id != self.last + 1 && self.lost_until.is_none_or(|l| id != l + 1) {
            return Ok(false);
        }
        self.flush_lost().await?;
        self.send(id, &kind, raw).await?;
        // In a replay, a pause the run was since resumed from is history, not an end.
        if self.ended && !is_last && self.mode == Mode::Run {
            let terminal = serde_json::from_value::<EventType>(Value::String(kind))
                .is_ok_and(|k| k.is_terminal());
            self.ended = terminal;
        }
        Ok(true)
    }

    async fn flush_lost(&mut self) -> Result<(), FollowError> {
        if let Some(id) = self.lost_until.take() {
            let raw = rebuilt_event(self.state, self.run_id, id, "redis_lost_events").await?;
            self.send(id, EventType::StreamRebuilt.as_str(), &raw)
                .await?;
            self.ended = false;
        }
        Ok(())
    }

    pub async fn replay(&mut self) -> Result<(), FollowError> {
        self.seen_status = None;
        let items = self.state.bus.read_after(self.run_id, self.last).await?;
        if items.is_empty() {
            return self.rebuild_if_gone().await;
        }
        let n = items.len();
        // An element's id is the one it carries; an emptied (compacted) element has none and
        // follows the one before. A `lost` placeholder may skip ids (a list lost whole).
        let mut next = self.last + 1;
        for (i, raw) in items.iter().enumerate() {
            if let Some((id, _)) = peek(raw) {
                next = id;
            }
            let raw = self.expand(next, raw).await?;
            next += 1;
            if !self.offer(&raw, i + 1 == n).await? {
                break;
            }
            if self.ended {
                break;
            }
        }
        Ok(())
    }

    /// The stored element at `id` as it was appended: a compacted delta range (see
    /// `agentfleet_shared::event_compaction`) is expanded back into its original events.
    async fn expand<'r>(&mut self, id: u64, raw: &'r str) -> Result<Cow<'r, str>, FollowError> {
        let header = event_compaction::parse_header(raw);
        if header.is_none() && !raw.is_empty() {
            return Ok(Cow::Borrowed(raw));
        }
        let known = self.compacted.as_ref().is_some_and(|(h, _)| h.covers(id));
        if !known {
            let header = match header {
                Some(h) => Some(h),
                None => self.header_before(id).await?,
            };
            self.compacted = match header {
                Some(h) => {
                    let completed = self
                        .state
                        .bus
                        .read_range(self.run_id, h.to + 1, h.to + 1)
                        .await?
                        .pop()
                        .unwrap_or_default();
                    Some((h, completed))
                }
                None => None,
            };
        }
        let expanded = self
            .compacted
            .as_ref()
            .and_then(|(h, completed)| h.expand(id, completed));
        match expanded {
            Some(event) => Ok(Cow::Owned(event)),
            None => {
                let thread_id = match self.thread_id {
                    Some(t) => t,
                    None => runs::get(&self.state.pool, self.run_id).await?.thread_id,
                };
                self.thread_id = Some(thread_id);
                Ok(Cow::Owned(event_compaction::superseded_delta(
                    id,
                    self.run_id,
                    thread_id,
                )))
            }
        }
    }

    /// The header of the compacted range holding the emptied element `id`: the nearest header
    /// before it, looked for backwards a page at a time (a range is as long as one message's
    /// deltas, so the first page nearly always has it).
    async fn header_before(&self, id: u64) -> Result<Option<Header>, FollowError> {
        const PAGE: u64 = 256;
        let mut to = id;
        while to >= 1 {
            let from = to.saturating_sub(PAGE - 1).max(1);
            let items = self.state.bus.read_range(self.run_id, from, to).await?;
            if let Some(h) = items
                .iter()
                .rev()
                .find_map(|r| event_compaction::parse_header(r))
            {
                return Ok(Some(h).filter(|h| h.covers(id)));
            }
            if items.is_empty() || from == 1 {
                break;
            }
            to = from - 1;
        }
        Ok(None)
    }

    /// Whether the last event the client has (`last`, from this stream or its
    /// `Last-Event-ID`) is a terminal one: then nothing more will come.
    async fn saw_terminal(&self) -> Result<bool, FollowError> {
        if self.last == 0 {
            return Ok(false);
        }
        let items = self
            .state
            .bus
            .read_range(self.run_id, self.last, self.last)
            .await?;
        Ok(items
            .first()
            .and_then(|raw| peek(raw))
            .is_some_and(|(_, kind)| {
                serde_json::from_value::<EventType>(Value::String(kind))
                    .is_ok_and(|k| k.is_terminal())
            }))
    }

    /// Whether Postgres shows the run ended while this stream has not seen its terminal event
    /// (the worker died between its commit and its append, or the append failed). Asked right
    /// after a replay: the status that replay read, if it read one, is the answer.
    async fn ended_in_postgres(&mut self) -> Result<bool, FollowError> {
        let status = match self.seen_status.take() {
            Some(status) => Some(status),
            None => runs::get(&self.state.pool, self.run_id)
                .await
                .ok()
                .map(|r| r.status),
        };
        Ok(status.is_some_and(RunStatus::is_final) && !self.saw_terminal().await?)
    }

    /// The list is empty past `last`: if Redis lost (or expired) it while Postgres knows of
    /// later events, serve the coarse rebuild and the run's current pausing or final event.
    ///
    /// A worker records the ids its events will get in the commit before it appends them, so
    /// a list shorter than Postgres says may only be waiting for those appends: the shortfall
    /// counts as a loss once it has lasted `events.final_event_grace_ms` (`follow` looks
    /// again then). Rebuilt at once, a client connecting in that moment got `stream_rebuilt`
    /// under the id the worker's next event then took, and never that event.
    async fn rebuild_if_gone(&mut self) -> Result<(), FollowError> {
        let durable = match runs::get(&self.state.pool, self.run_id).await {
            Ok(run) => run,
            Err(_) => {
                // Postgres cannot say now: a shortfall already seen is looked at again a grace
                // later, not at once (`follow` wakes for it).
                if self.short_since.is_some() {
                    self.short_since = Some(tokio::time::Instant::now());
                }
                return Ok(());
            }
        };
        self.seen_status = Some(durable.status);
        let last_durable = durable.last_event_id as u64;
        if last_durable <= self.last || self.state.bus.len(self.run_id).await? >= last_durable {
            self.short_since = None;
            return Ok(());
        }
        let grace = Duration::from_millis(self.state.settings.events.final_event_grace_ms);
        let since = *self
            .short_since
            .get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() < grace {
            return Ok(());
        }
        self.short_since = None;
        if last_durable > self.last + 1 {
            let raw =
                rebuilt_event(self.state, self.run_id, last_durable - 1, "redis_list_gone").await?;
            self.send(last_durable - 1, EventType::StreamRebuilt.as_str(), &raw)
                .await?;
        }
        let status = durable.status;
        let (kind, data) = match status {
            s if s.is_waiting() => pending_event(
                &durable
                    .pending
                    .as_ref()
                    .map(|p| p.0.clone())
                    .unwrap_or(Value::Null),
            ),
            agentfleet_shared::domain::RunStatus::Completed => (
                EventType::RunCompleted,
                json!({"iteration": durable.iteration}),
            ),
            agentfleet_shared::domain::RunStatus::Failed => (
                EventType::RunFailed,
                durable
                    .error
                    .as_ref()
                    .map(|e| e.0.clone())
                    .unwrap_or(Value::Null),
            ),
            agentfleet_shared::domain::RunStatus::Cancelled => (
                EventType::RunCancelled,
                agentfleet_shared::events::cancelled_data(
                    durable.cancelled_from,
                    durable.error.as_ref().map(|e| &e.0),
                ),
            ),
            _ => return Ok(()),
        };
        let raw = envelope(last_durable, durable.id, durable.thread_id, kind, data);
        self.send(last_durable, kind.as_str(), &raw).await
    }

    /// A finished run whose terminal event is in neither the list nor this stream: Redis lost
    /// it, or the worker died between its commit and the append. It is appended now from
    /// Postgres, past every id handed out (and its id recorded), so this client and every
    /// later one see the run end. Two API replicas doing this at the same moment may append it
    /// twice; the second copy carries a higher id and the same content.
    async fn restore_terminal(&mut self) -> Result<(), FollowError> {
        let run = runs::get(&self.state.pool, self.run_id).await?;
        let listed = self.state.bus.len(self.run_id).await?;
        // The client holds the terminal event's id and the list, gone, cannot tell otherwise:
        // it has seen the end. While the list holds that id (not a terminal event: the caller
        // checked), the end's event was never appended: an API whose `run_cancelled` append
        // failed had no id to record, so the recorded id is still the client's.
        if run.last_event_id as u64 == self.last && listed < self.last {
            return Ok(());
        }
        let (kind, data) = match run.status {
            RunStatus::Completed => (EventType::RunCompleted, json!({"iteration": run.iteration})),
            RunStatus::Failed => (
                EventType::RunFailed,
                run.error
                    .as_ref()
                    .map(|e| e.0.clone())
                    .unwrap_or(Value::Null),
            ),
            RunStatus::Cancelled => (
                EventType::RunCancelled,
                agentfleet_shared::events::cancelled_data(
                    run.cancelled_from,
                    run.error.as_ref().map(|e| &e.0),
                ),
            ),
            _ => return Ok(()),
        };
        let floor = Floor::Recorded((run.last_event_id as u64).max(listed).saturating_sub(1));
        let event = NewEvent {
            run_id: self.run_id,
            thread_id: run.thread_id,
            kind,
            data: &data,
        };
        // Atomically declined if the list already ends with a terminal event (another reader
        // restored it a moment ago): then it is read from there.
        let restored = self
            .state
            .bus
            .append_terminal_once(event, FINAL_FENCE, floor)
            .await?;
        let id = match restored {
            Some(appended) => {
                runs::record_last_event_id(&self.state.pool, self.run_id, appended.id).await?;
                tracing::info!(run_id = %self.run_id, id = appended.id, "restored a finished run's terminal event");
                appended.id
            }
            None => self.state.bus.len(self.run_id).await?,
        };
        self.replay().await?;
        if !self.ended {
            // The client claims ids beyond any handed out: it still learns how the run ended.
            let raw = envelope(id, self.run_id, run.thread_id, kind, data);
            self.send(id, kind.as_str(), &raw).await?;
        }
        Ok(())
    }

    /// Replays, then follows live events until the stream ends. `status` is the run's status
    /// read after `sub` was taken (the caller usually has it from its authorization lookup; a
    /// connect then costs one Postgres query, which matters when a thousand clients reconnect
    /// at once); `None` reads it here.
    pub async fn follow(
        &mut self,
        mut sub: Subscription,
        status: Option<RunStatus>,
    ) -> Result<(), FollowError> {
        let status = match status {
            Some(s) => Some(s),
            None => runs::get(&self.state.pool, self.run_id)
                .await
                .ok()
                .map(|r| r.status),
        };
        // A client claiming ids beyond any handed out (a stale or forged `Last-Event-ID`)
        // would wait past every live event, the terminal one included, for ever: it follows
        // from the last id handed out instead. A finished run is served its end by
        // `restore_terminal`; a list that is gone (0) says nothing of the ids.
        if !status.is_some_and(RunStatus::is_final) {
            let head = self.state.bus.len(self.run_id).await?;
            if head > 0 && self.last > head {
                self.last = head;
            }
        }
        self.replay().await?;
        if self.ended {
            return Ok(());
        }
        // A run that has stopped in Postgres while its last event is not in the list yet: the
        // worker appends it right after its commit, so wait for it live, briefly. If it never
        // comes (the worker died in between, or Redis lost it), Postgres has it: the replay
        // then serves it from there (`rebuild_if_gone`). A run that stops after `status` was
        // read announces its end on `sub`, which was taken before.
        let grace = Duration::from_millis(self.state.settings.events.final_event_grace_ms);
        // Up to a tenth more, by run: streams that (re)connected together look apart.
        let idle_ms = self.state.settings.events.idle_recheck_ms;
        let idle =
            Duration::from_millis(idle_ms + idle_ms * (self.run_id.as_u128() % 100) as u64 / 1000);
        let mut final_deadline = None;
        if status.is_some_and(RunStatus::is_final) {
            self.replay().await?;
            if self.ended || self.saw_terminal().await? {
                return Ok(());
            }
            final_deadline = Some(tokio::time::Instant::now() + grace);
        }
        loop {
            // Without a message, look again: at the final event's deadline, when a shortfall's
            // grace ends, or after `events.idle_recheck_ms` of silence (an end whose event
            // never reached Redis announces itself nowhere else).
            let now = tokio::time::Instant::now();
            let wake = [
                Some(now + idle),
                self.short_since.map(|s| s + grace),
                final_deadline,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + idle);
            let msg = tokio::select! {
                m = sub.rx.recv() => m,
                _ = tokio::time::sleep_until(wake) => {
                    if final_deadline.is_some_and(|d| d <= tokio::time::Instant::now()) {
                        self.replay().await?;
                        if !self.ended && !self.saw_terminal().await? {
                            self.restore_terminal().await?;
                        }
                        return Ok(());
                    }
                    self.replay().await?;
                    if self.ended {
                        return Ok(());
                    }
                    if final_deadline.is_none() && self.ended_in_postgres().await? {
                        final_deadline = Some(tokio::time::Instant::now() + grace);
                    }
                    continue;
                }
                _ = self.tx.closed() => return Err(FollowError::ClientGone),
                _ = self.state.shutdown.cancelled() => return Err(FollowError::Shutdown),
            };
            match msg {
                None => return Err(FollowError::Dropped),
                Some(HubMessage::Resync) => self.replay().await?,
                Some(HubMessage::Event(raw)) => {
                    if !self.offer(&raw, true).await? {
                        self.replay().await?;
                    }
                }
            }
            if self.ended {
                return Ok(());
            }
        }
    }
}

fn envelope(id: u64, run_id: Uuid, thread_id: Uuid, kind: EventType, data: Value) -> String {
    json!({"id": id, "run_id": run_id, "thread_id": thread_id, "type": kind.as_str(),
           "at": timestamp(chrono::Utc::now()), "data": data})
    .to_string()
}

/// A coarse `stream_rebuilt` event: the run's state and messages from Postgres.
async fn rebuilt_event(
    state: &AppState,
    run_id: Uuid,
    id: u64,
    reason: &str,
) -> Result<String, FollowError> {
    let run = runs::get(&state.pool, run_id).await?;
    let messages: Vec<Value> = messages::of_run(&state.pool, run_id)
        .await?
        .into_iter()
        .map(|(id, role, body)| json!({"id": id, "role": role, "body": body}))
        .collect();
    let calls: Vec<Value> = tool_calls::of_run(&state.pool, run_id)
        .await?
        .into_iter()
        .map(|c| {
            json!({"tool_call_id": c.tool_call_id, "name": c.name, "iteration": c.iteration, "status": c.status,
                   "arguments": c.arguments.map(|a| a.0), "result": c.result.map(|r| r.0), "error": c.error})
        })
        .collect();
    let data = json!({
        "coarse": true,
        "reason": reason,
        "status": run.status,
        "iteration": run.iteration,
        "pending": run.pending.as_ref().map(|p| &p.0),
        "error": run.error.as_ref().map(|e| &e.0),
        "messages": messages,
        "tool_calls": calls,
    });
    Ok(envelope(
        id,
        run_id,
        run.thread_id,
        EventType::StreamRebuilt,
        data,
    ))
}
