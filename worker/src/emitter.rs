//! Appends a run's events under the holder's fencing token.
//!
//! An event may also be deferred: it goes out, in order, in the same round trip as the
//! holder's next event (an event announced right before another costs one wake-up of Redis
//! and of the worker, not two). Only an event followed at once by another is deferred, and
//! only one whose loss in a crash in between the next holder makes good (`run_started`: the
//! next holder announces `run_recovered`). An event announcing committed data is not: the
//! crash suite kills a worker between a `message_completed` and the `tool_started` after it,
//! and the message must be in the stream. The one exception is a final answer's
//! `message_completed`: its commit also ended the run, so nothing but the `run_completed` right
//! after it is left to announce, and the two go out together (a crash between them loses the
//! pair from the live stream, as a crash after a separate end would lose `run_completed`; the
//! message stays readable from the thread). `run::finish` flushes what is left before any end
//! without an event of its own.
//!
//! Redis carries the live stream but is not the truth: if it is unreachable the event is
//! logged and dropped (the stream can be rebuilt from Postgres), and the run goes on. Only a
//! fencing refusal matters to the run: it means another attempt owns the stream now.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use uuid::Uuid;

use agentfleet_shared::compaction::{DeltaRecord, Header};
use agentfleet_shared::events::{
    AppendError, Appended, EventBus, EventType, Expiry, Floor, NewEvent,
};

#[derive(Clone)]
pub struct Emitter {
    bus: EventBus,
    run_id: Uuid,
    thread_id: Uuid,
    fence: i64,
    /// Highest id appended by this holder (or known durable at claim).
    last: Arc<AtomicU64>,
    /// `last` is this holder's own append, not the figure read at claim (see `Floor`).
    exact: Arc<AtomicBool>,
    /// Whether finished messages' deltas are compacted (`events.compact_deltas`).
    compact: bool,
    /// The current message's deltas, compacted once its `message_completed` is appended.
    deltas: Arc<Mutex<Vec<DeltaRecord>>>,
    /// Deferred events, appended before the next one.
    pending: Arc<Mutex<Vec<(EventType, Value, Expiry)>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("the run's stream is fenced off: a newer holder owns it")]
pub struct Fenced;

impl Emitter {
    pub fn new(
        bus: EventBus,
        run_id: Uuid,
        thread_id: Uuid,
        attempt: i32,
        last_event_id: u64,
        compact: bool,
    ) -> Emitter {
        Emitter {
            bus,
            run_id,
            thread_id,
            fence: agentfleet_shared::events::worker_fence(attempt),
            last: Arc::new(AtomicU64::new(last_event_id)),
            exact: Arc::new(AtomicBool::new(false)),
            compact,
            deltas: Default::default(),
            pending: Default::default(),
        }
    }

    /// The highest id this holder appended: what a client may have seen.
    pub fn last_id(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// The id the next event emitted will get, deferred events going first (what an end or
    /// a pause records as the run's durable floor before announcing itself).
    pub fn next_id(&self) -> u64 {
        self.last_id() + self.pending.lock().expect("pending lock").len() as u64 + 1
    }

    /// Defers `kind` to the round trip of the next event (see the module's note).
    pub fn defer(&self, kind: EventType, data: Value, expiry: Expiry) {
        self.pending
            .lock()
            .expect("pending lock")
            .push((kind, data, expiry));
    }

    /// Appends the deferred events now, if any.
    pub async fn flush(&self) -> Result<(), Fenced> {
        let pending = std::mem::take(&mut *self.pending.lock().expect("pending lock"));
        if pending.is_empty() {
            return Ok(());
        }
        self.append_all(pending).await
    }

    pub async fn emit(&self, kind: EventType, data: Value) -> Result<(), Fenced> {
        self.emit_with(kind, data, Expiry::Keep).await
    }

    pub async fn emit_with(
        &self,
        kind: EventType,
        data: Value,
        expiry: Expiry,
    ) -> Result<(), Fenced> {
        let mut pending = std::mem::take(&mut *self.pending.lock().expect("pending lock"));
        if !pending.is_empty() {
            pending.push((kind, data, expiry));
            return self.append_all(pending).await;
        }
        let event = NewEvent {
            run_id: self.run_id,
            thread_id: self.thread_id,
            kind,
            data: &data,
        };
        match self
            .bus
            .append(event, self.fence, self.floor(), expiry)
            .await
        {
            Ok(appended) => {
                self.appended(kind, &data, &appended);
                Ok(())
            }
            Err(AppendError::Fenced { .. }) => Err(Fenced),
            Err(e) => {
                tracing::warn!(run_id = %self.run_id, event = kind.as_str(), error = %e,
                    "event not appended; Redis unavailable");
                Ok(())
            }
        }
    }

    /// Appends `events` in order in one round trip.
    async fn append_all(&self, events: Vec<(EventType, Value, Expiry)>) -> Result<(), Fenced> {
        let batch: Vec<(NewEvent<'_>, Expiry)> = events
            .iter()
            .map(|(kind, data, expiry)| {
                let event = NewEvent {
                    run_id: self.run_id,
                    thread_id: self.thread_id,
                    kind: *kind,
                    data,
                };
                (event, *expiry)
            })
            .collect();
        match self.bus.append_run(&batch, self.fence, self.floor()).await {
            Ok(outcomes) => {
                let mut fenced = false;
                for ((kind, data, _), outcome) in events.iter().zip(outcomes) {
                    match outcome {
                        Ok(appended) => self.appended(*kind, data, &appended),
                        Err(AppendError::Fenced { .. }) => fenced = true,
                        Err(e) => tracing::warn!(run_id = %self.run_id, event = kind.as_str(),
                            error = %e, "event not appended; Redis unavailable"),
                    }
                }
                if fenced { Err(Fenced) } else { Ok(()) }
            }
            Err(AppendError::Fenced { .. }) => Err(Fenced),
            Err(e) => {
                tracing::warn!(run_id = %self.run_id, events = events.len(), error = %e,
                    "events not appended; Redis unavailable");
                Ok(())
            }
        }
    }

    fn floor(&self) -> Floor {
        if self.exact.load(Ordering::SeqCst) {
            Floor::Exact(self.last_id())
        } else {
            Floor::Recorded(self.last_id())
        }
    }

    fn appended(&self, kind: EventType, data: &Value, appended: &Appended) {
        self.last.fetch_max(appended.id, Ordering::SeqCst);
        self.exact.store(true, Ordering::SeqCst);
        if self.compact {
            self.track(kind, data, appended);
        }
    }

    /// Follows the deltas of the message being streamed; once it is complete, compacts them
    /// in the background (an optimisation of Redis memory: a failure only costs bytes).
    fn track(&self, kind: EventType, data: &Value, appended: &Appended) {
        let mut deltas = self.deltas.lock().expect("deltas lock");
        match kind {
            EventType::MessageDelta => deltas.push(DeltaRecord {
                id: appended.id,
                len: data["text"].as_str().map_or(0, str::len),
                at_ms: appended.at_ms,
            }),
            EventType::MessageCompleted => {
                let content_len = data["content"].as_str().map_or(0, str::len);
                let Some(header) = Header::build(&deltas, appended.id, appended.at_ms, content_len)
                else {
                    deltas.clear();
                    return;
                };
                deltas.clear();
                let (bus, run_id, fence) = (self.bus.clone(), self.run_id, self.fence);
                tokio::spawn(async move {
                    if let Err(e) = bus.compact_deltas(run_id, fence, &header).await {
                        tracing::debug!(%run_id, error = %e, "deltas not compacted");
                    }
                });
            }
            _ => deltas.clear(),
        }
    }
}
