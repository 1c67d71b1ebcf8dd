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
//! message stays readable from the thread). The last `message_delta` of a model call is
//! deferred too, to the `message_completed` after the turn's commit: losing a delta costs
//! nothing (clients drop an interrupted iteration's deltas, and `message_completed` holds the
//! whole text). `run::finish` flushes what is left before any end
//! without an event of its own.
//!
//! An event may also go out ahead ([`Emitter::emit_ahead`]): its append starts at once and the
//! holder goes on, waiting for it later; any event emitted meanwhile goes out after it (an
//! order lock, taken in the order the events were emitted). `iteration_started` goes out so,
//! alongside the model call it announces, and `tool_started` alongside its tool call: a Redis
//! round trip less on each iteration's path and on each call's. Both are announcements the
//! next holder makes good after a crash: a retried iteration, a retried call (its `dispatch`
//! one higher), announce themselves again.
//!
//! And an event may go out behind the holder ([`Emitter::emit_behind`]): its append starts at
//! once, in a task of its own, and the holder goes on without waiting for the answer; the next
//! event waits for it. It is not deferred: a crash loses it in the same moments it would lose
//! an awaited append, but the holder's next step is not held up by the round trip.
//! `tool_completed` goes out so (its result committed just before): the next model call
//! starts while it is appended, and the next turn's `iteration_started` follows it; when the
//! model is called next, it even waits in its place for its result's commit, which the holder
//! does not await ([`Emitter::emit_behind_when`]), and the `iteration_started` emitted right
//! after it joins its round trip. So do
//! `message_delta`s: the model's stream is read on while a delta is appended (a lost delta
//! costs nothing: clients drop an interrupted iteration's deltas, and `message_completed`
//! holds the whole text).
//!
//! Redis carries the live stream but is not the truth: if it is unreachable the event is
//! logged and dropped (the stream can be rebuilt from Postgres), and the run goes on. Only a
//! fencing refusal matters to the run: it means another attempt owns the stream now.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use uuid::Uuid;

use agentfleet_shared::event_compaction::{DeltaRecord, Header};
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
    /// The last compaction started: a finished list is packed after it.
    compacting: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    /// Deferred events, appended before the next one.
    pending: Arc<Mutex<Vec<Deferred>>>,
    /// Numbers the deferred events: an emission takes those deferred before it (a number up
    /// to what it saw when it took its place), never one deferred while it waited.
    deferred_seq: Arc<AtomicU64>,
    /// Held from an event's emission to the end of its append, so appends leave in the order
    /// of emission also when one goes out ahead (FIFO: tokio's mutex is fair).
    order: Arc<tokio::sync::Mutex<()>>,
    /// An append made behind the holder ([`Emitter::emit_behind`]) was refused by the fence:
    /// reported by the holder's next emission or flush.
    fenced: Arc<AtomicBool>,
    /// The append behind a write ([`Emitter::emit_behind_when`]) that took the last place in
    /// the stream, while its round trip has not left: an event emitted ahead next joins it.
    joinable: Arc<Mutex<Option<Joinable>>>,
}

/// What became of the write an event behind a write announces ([`Emitter::emit_behind_when`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Committed: the event goes out.
    Held,
    /// Its fence did not hold: the holder is stale, and nothing of the round trip goes out.
    Refused,
    /// It failed (the database): the event does not go out, the events with it do (the holder
    /// still holds the run, and learns of the failure from the write).
    Failed,
}

/// A deferred event and its number (`deferred_seq`).
type Deferred = (u64, EventType, Value, Expiry);

/// Events joining an append behind a write, each with where to report its outcome; `None`
/// once that append has left.
type Joinable = Arc<Mutex<Option<Vec<Joiner>>>>;
type Joiner = (
    EventType,
    Value,
    tokio::sync::oneshot::Sender<Result<(), Fenced>>,
);

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
            compacting: Default::default(),
            pending: Default::default(),
            deferred_seq: Default::default(),
            order: Default::default(),
            fenced: Default::default(),
            joinable: Default::default(),
        }
    }

    /// The highest id this holder appended: what a client may have seen. Waits for the
    /// appends in flight (ahead or behind) so that it counts them.
    pub async fn last_id(&self) -> u64 {
        let _order = self.order.lock().await;
        self.last_appended()
    }

    /// The id the next event emitted will get, deferred events going first (what an end or
    /// a pause records as the run's durable floor before announcing itself). Waits for the
    /// appends in flight, as [`Emitter::last_id`].
    pub async fn next_id(&self) -> u64 {
        let _order = self.order.lock().await;
        self.last_appended() + self.pending.lock().expect("pending lock").len() as u64 + 1
    }

    fn last_appended(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// Defers `kind` to the round trip of the next event (see the module's note).
    pub fn defer(&self, kind: EventType, data: Value, expiry: Expiry) {
        self.took_place();
        let mut pending = self.pending.lock().expect("pending lock");
        let seq = self.deferred_seq.fetch_add(1, Ordering::SeqCst) + 1;
        pending.push((seq, kind, data, expiry));
    }

    /// Appends the deferred events now, if any.
    pub async fn flush(&self) -> Result<(), Fenced> {
        let upto = self.took_place();
        let _order = self.order.lock().await;
        self.not_fenced()?;
        let pending = self.take_pending(upto);
        if pending.is_empty() {
            return Ok(());
        }
        self.append_all(pending).await
    }

    /// Emits `kind` ahead of the work it announces: its place in the stream is taken when
    /// this future is first polled (the order lock is fair: waiters are served in the order
    /// they first asked), so it is joined with the work, polled first: `join!(biased;
    /// emit_ahead(..), work)`. Events the work emits wait for it, also when an append made
    /// behind the holder is still in flight and the work starts before it is done. Only for
    /// an event whose loss in a crash the next holder makes good (`iteration_started`,
    /// `tool_started`: a retried iteration or call announces itself again), since the work
    /// goes on before the event is known to be in the stream.
    ///
    /// Right behind an append that waits for a write ([`Emitter::emit_behind_when`]), it
    /// joins that append's round trip instead of making one of its own after it.
    pub async fn emit_ahead(&self, kind: EventType, data: Value) -> Result<(), Fenced> {
        let (kind, data) = match self.join(kind, data) {
            Ok(joined) => return joined.await.unwrap_or(Ok(())),
            Err(event) => event,
        };
        // An ordinary emission: what makes it "ahead" is how the caller polls it.
        self.emit(kind, data).await
    }

    /// Adds the event to the append behind a write that took the last place, if its round
    /// trip has not left; else gives it back.
    fn join(
        &self,
        kind: EventType,
        data: Value,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<(), Fenced>>, (EventType, Value)> {
        let Some(joinable) = self.joinable.lock().expect("joinable lock").take() else {
            return Err((kind, data));
        };
        let mut joiners = joinable.lock().expect("joiners lock");
        match joiners.as_mut() {
            Some(joiners) => {
                let (report, outcome) = tokio::sync::oneshot::channel();
                joiners.push((kind, data, report));
                Ok(outcome)
            }
            None => Err((kind, data)),
        }
    }

    /// An event takes its place in the stream: none emitted later may join an earlier append.
    /// Returns the number of the last event deferred so far: the emission takes those.
    fn took_place(&self) -> u64 {
        self.joinable.lock().expect("joinable lock").take();
        self.deferred_seq.load(Ordering::SeqCst)
    }

    /// Emits `kind` behind the holder: its place in the stream is taken now, its append starts
    /// at once in a task of its own, and the holder goes on without waiting for it; events
    /// emitted later wait for it. A crash loses it exactly when it would lose an awaited
    /// append (between the commit it announces and the append's answer), but the holder's
    /// next step no longer waits for that answer. A fencing refusal is reported by the
    /// holder's next emission or flush (this one's `Err` is an earlier refusal).
    pub async fn emit_behind(&self, kind: EventType, data: Value) -> Result<(), Fenced> {
        let upto = self.took_place();
        let order = self.order.clone().lock_owned().await;
        self.not_fenced()?;
        let this = self.clone();
        tokio::spawn(async move {
            let _order = order;
            if this
                .append_now(upto, kind, data, Expiry::Keep)
                .await
                .is_err()
            {
                this.fenced.store(true, Ordering::SeqCst);
            }
        });
        Ok(())
    }

    /// As [`Emitter::emit_behind`], for an event that announces a write still in flight: its
    /// place in the stream is taken now, and the task appends it once `written` answers
    /// that the write held. Events emitted meanwhile wait behind it, except an event emitted
    /// ahead right after it, which joins its round trip ([`Emitter::emit_ahead`]); the events
    /// deferred before it go out with it. What goes out if the write did not hold, see
    /// [`Written`]. Takes its place and hands itself to its task without waiting: dropping this
    /// future never loses the event's place or an event joined to it.
    pub async fn emit_behind_when(
        &self,
        written: impl Future<Output = Written> + Send + 'static,
        kind: EventType,
        data: Value,
    ) -> Result<(), Fenced> {
        self.not_fenced()?;
        // All at once, before anything else can be emitted: the place in the stream (asked
        // for by one poll of the order lock here, kept by the task), the deferred events it
        // takes, and the slot an event emitted right after it may join.
        let upto = self.took_place();
        let mut order = Box::pin(self.order.clone().lock_owned());
        let place = futures_util::poll!(order.as_mut());
        let joinable: Joinable = Arc::new(Mutex::new(Some(Vec::new())));
        *self.joinable.lock().expect("joinable lock") = Some(joinable.clone());
        let this = self.clone();
        tokio::spawn(async move {
            let _order = match place {
                std::task::Poll::Ready(order) => order,
                std::task::Poll::Pending => order.await,
            };
            let written = written.await;
            let joiners = joinable
                .lock()
                .expect("joiners lock")
                .take()
                .unwrap_or_default();
            let mut events = this.take_pending(upto);
            if written == Written::Held {
                events.push((kind, data, Expiry::Keep));
            }
            let mut reports = Vec::with_capacity(joiners.len());
            for (kind, data, report) in joiners {
                events.push((kind, data, Expiry::Keep));
                reports.push(report);
            }
            let appended = match (written, this.not_fenced()) {
                (Written::Refused, _) => Ok(()),
                (_, Err(fenced)) => Err(fenced),
                (_, Ok(())) if events.is_empty() => Ok(()),
                (_, Ok(())) => this.append_all(events).await,
            };
            if appended.is_err() {
                this.fenced.store(true, Ordering::SeqCst);
            }
            for report in reports {
                let _ = report.send(appended.as_ref().map(|_| ()).map_err(|_| Fenced));
            }
        });
        Ok(())
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
        let upto = self.took_place();
        let _order = self.order.lock().await;
        self.append_now(upto, kind, data, expiry).await
    }

    fn not_fenced(&self) -> Result<(), Fenced> {
        match self.fenced.load(Ordering::SeqCst) {
            true => Err(Fenced),
            false => Ok(()),
        }
    }

    /// Takes the deferred events numbered up to `upto`, in order.
    fn take_pending(&self, upto: u64) -> Vec<(EventType, Value, Expiry)> {
        let mut pending = self.pending.lock().expect("pending lock");
        let taken = pending.iter().take_while(|(seq, ..)| *seq <= upto).count();
        pending
            .drain(..taken)
            .map(|(_, kind, data, expiry)| (kind, data, expiry))
            .collect()
    }

    /// Appends the deferred events and `kind`; the caller holds the order lock. Nothing is
    /// appended once an append behind the holder was refused.
    async fn append_now(
        &self,
        upto: u64,
        kind: EventType,
        data: Value,
        expiry: Expiry,
    ) -> Result<(), Fenced> {
        self.not_fenced()?;
        let mut pending = self.take_pending(upto);
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
            Floor::Exact(self.last_appended())
        } else {
            Floor::Recorded(self.last_appended())
        }
    }

    fn appended(&self, kind: EventType, data: &Value, appended: &Appended) {
        self.last.fetch_max(appended.id, Ordering::SeqCst);
        self.exact.store(true, Ordering::SeqCst);
        if self.compact {
            self.track(kind, data, appended);
        }
        if kind.is_terminal() {
            self.pack();
        }
    }

    /// Packs the finished list in the background, once the last compaction is done (an
    /// optimisation of Redis memory, as compaction: a failure only costs bytes).
    fn pack(&self) {
        let compacting = self.compacting.lock().expect("compacting lock").take();
        let (bus, run_id, fence) = (self.bus.clone(), self.run_id, self.fence);
        tokio::spawn(async move {
            if let Some(compacting) = compacting {
                let _ = compacting.await;
            }
            match bus.pack_finished(run_id, fence).await {
                Ok(agentfleet_shared::events::Packed::Packed { from, into }) => {
                    tracing::trace!(%run_id, from, into, "finished event list packed");
                }
                Ok(agentfleet_shared::events::Packed::Left) => {}
                Err(e) => tracing::debug!(%run_id, error = %e, "finished event list not packed"),
            }
        });
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
                let task = tokio::spawn(async move {
                    if let Err(e) = bus.compact_deltas(run_id, fence, &header).await {
                        tracing::debug!(%run_id, error = %e, "deltas not compacted");
                    }
                });
                *self.compacting.lock().expect("compacting lock") = Some(task);
            }
            _ => deltas.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use agentfleet_shared::config::Settings;
    use agentfleet_shared::events::{peek, redis_connection};
    use serde_json::json;

    use super::*;

    /// A bus on the local Redis under a prefix of its own, and a connection to clean up with.
    fn test_bus() -> (EventBus, agentfleet_shared::events::RedisConnection) {
        let settings = Settings::load_with(None, [], true).expect("settings");
        let prefix = format!("emitter-test-{}", Uuid::new_v4().simple());
        let conn = redis_connection(&settings.redis).expect("redis");
        (EventBus::new(conn.clone(), &prefix, 60), conn)
    }

    /// A first holder's emitter for a new run, on a bus of its own (see [`test_bus`]).
    fn fresh_emitter() -> (
        EventBus,
        agentfleet_shared::events::RedisConnection,
        Uuid,
        Emitter,
    ) {
        let (bus, conn) = test_bus();
        let run = Uuid::new_v4();
        let emitter = Emitter::new(bus.clone(), run, Uuid::new_v4(), 1, 0, false);
        (bus, conn, run, emitter)
    }

    /// The kinds of the stored events, placeholders left out.
    fn kinds(stored: Vec<String>) -> Vec<String> {
        stored
            .iter()
            .map(|raw| peek(raw).expect("an event").1)
            .filter(|kind| kind != "lost")
            .collect()
    }

    /// Emits a `tool_completed` behind a write that holds once the returned sender says so.
    async fn behind_a_gate(emitter: &Emitter) -> tokio::sync::oneshot::Sender<Written> {
        let (held, answer) = tokio::sync::oneshot::channel::<Written>();
        emitter
            .emit_behind_when(
                async move { answer.await.unwrap_or(Written::Failed) },
                EventType::ToolCompleted,
                json!({"n": 1}),
            )
            .await
            .expect("not fenced");
        held
    }

    async fn clean_up(
        bus: &EventBus,
        mut conn: agentfleet_shared::events::RedisConnection,
        run: Uuid,
    ) {
        let keys = bus.keys();
        let _: () = redis::cmd("DEL")
            .arg(keys.events(run))
            .arg(keys.fence(run))
            .arg(keys.base(run))
            .query_async(&mut conn)
            .await
            .expect("clean up");
    }

    /// An event emitted ahead keeps its place in the stream: an event emitted after it waits
    /// for its append, also when both wait for an append made behind; a deferred event goes
    /// out before all.
    #[tokio::test]
    async fn an_event_emitted_ahead_keeps_its_place() {
        let (bus, conn, run, emitter) = fresh_emitter();
        emitter.defer(EventType::RunStarted, json!({}), Expiry::Persist);
        // A behind append holds the order lock when the announcement is polled: the work's
        // event, polled after it, still comes after it.
        emitter
            .emit_behind(EventType::ToolCompleted, json!({}))
            .await
            .expect("not fenced");
        let ahead = emitter.emit_ahead(EventType::IterationStarted, json!({"iteration": 1}));
        let after = emitter.emit(EventType::MessageDelta, json!({"text": "x"}));
        let (ahead, after) = tokio::join!(biased; ahead, after);
        ahead.expect("ahead appended");
        after.expect("after appended");
        let stored = bus.read_after(run, 0).await.expect("read");
        let last = stored.last().and_then(|raw| peek(raw)).expect("events").0;
        assert_eq!(emitter.last_id().await, last);
        // A holder that knows only the recorded floor leaves a placeholder first (a margin
        // for ids an earlier holder may have used): `kinds` leaves it out.
        assert_eq!(
            kinds(stored),
            [
                "run_started",
                "tool_completed",
                "iteration_started",
                "message_delta"
            ]
        );
        clean_up(&bus, conn, run).await;
    }

    /// An event emitted behind is in the stream before the next one, though the holder did
    /// not wait for it; the ids recorded at an end count it; and a fencing refusal of it
    /// reaches the holder at its next emission.
    #[tokio::test]
    async fn an_event_emitted_behind_keeps_its_place_and_reports_its_fence() {
        let (bus, conn) = test_bus();
        let run = Uuid::new_v4();
        let thread = Uuid::new_v4();
        let emitter = Emitter::new(bus.clone(), run, thread, 1, 0, false);
        emitter
            .emit(EventType::RunStarted, json!({}))
            .await
            .expect("started");
        for n in 0..20 {
            emitter
                .emit_behind(EventType::ToolCompleted, json!({"n": n}))
                .await
                .expect("not fenced");
        }
        let next = emitter.next_id().await;
        emitter
            .emit(EventType::RunCompleted, json!({}))
            .await
            .expect("completed");
        let stored = bus.read_after(run, 0).await.expect("read");
        let events: Vec<(u64, String)> = stored
            .iter()
            .map(|raw| peek(raw).expect("an event"))
            .filter(|(_, kind)| kind != "lost")
            .collect();
        let kinds: Vec<&str> = events.iter().map(|(_, k)| k.as_str()).collect();
        let mut expected = vec!["run_started"];
        expected.extend(std::iter::repeat_n("tool_completed", 20));
        expected.push("run_completed");
        assert_eq!(kinds, expected);
        assert_eq!(
            events.last().expect("events").0,
            next,
            "next_id counted them"
        );
        let ns: Vec<i64> = stored
            .iter()
            .filter_map(|raw| serde_json::from_str::<Value>(raw).ok())
            .filter(|e| e["type"] == "tool_completed")
            .map(|e| e["data"]["n"].as_i64().expect("n"))
            .collect();
        assert_eq!(ns, (0..20).collect::<Vec<_>>(), "in the order emitted");

        // A newer holder takes the stream: this holder's next append behind is refused, and
        // its next emission says so.
        let newer = Emitter::new(bus.clone(), run, thread, 2, next, false);
        newer
            .emit(EventType::RunRecovered, json!({}))
            .await
            .expect("newer holder appends");
        emitter
            .emit_behind(EventType::ToolCompleted, json!({"n": 20}))
            .await
            .expect("refused later, in its task");
        assert!(
            emitter
                .emit(EventType::RunCompleted, json!({}))
                .await
                .is_err()
        );
        assert!(emitter.flush().await.is_err(), "and stays refused");
        assert!(
            emitter
                .emit_behind(EventType::ToolCompleted, json!({"n": 21}))
                .await
                .is_err(),
            "an append behind reports the earlier refusal too"
        );

        clean_up(&bus, conn, run).await;
    }

    /// An event emitted behind a write goes out once the write has held, in the place it was
    /// emitted (an event emitted meanwhile waits for it), and not at all if the write did not
    /// hold.
    #[tokio::test]
    async fn an_event_behind_a_write_waits_for_it_and_drops_if_it_did_not_hold() {
        let (bus, conn, run, emitter) = fresh_emitter();
        emitter
            .emit(EventType::RunStarted, json!({}))
            .await
            .expect("started");
        let held = behind_a_gate(&emitter).await;
        let mut next = tokio::spawn({
            let emitter = emitter.clone();
            async move {
                emitter
                    .emit(EventType::IterationStarted, json!({"iteration": 2}))
                    .await
            }
        });
        // An append takes a millisecond: the emission after it is still waiting long after.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut next).await;
        assert!(
            waited.is_err(),
            "the next event waits for the write's answer"
        );
        assert_eq!(
            kinds(bus.read_after(run, 0).await.expect("read")),
            ["run_started"]
        );
        held.send(Written::Held).expect("the task waits");
        next.await.expect("task").expect("appended");
        assert_eq!(
            kinds(bus.read_after(run, 0).await.expect("read")),
            ["run_started", "tool_completed", "iteration_started"]
        );

        // A write whose fence did not hold (the holder is stale): nothing of its round trip is
        // appended, neither the events deferred before it nor the one that joined it, and the
        // stream goes on.
        emitter.defer(EventType::RunRecovered, json!({}), Expiry::Persist);
        emitter
            .emit_behind_when(
                async { Written::Refused },
                EventType::ToolCompleted,
                json!({"n": 2}),
            )
            .await
            .expect("not fenced");
        emitter
            .emit_ahead(EventType::IterationStarted, json!({"iteration": 3}))
            .await
            .expect("joined, and dropped with it");
        // A write that failed: the holder still holds the run, so the events with it go out,
        // not the announcement of what was not written.
        emitter.defer(EventType::MessageDelta, json!({"text": "d"}), Expiry::Keep);
        emitter
            .emit_behind_when(
                async { Written::Failed },
                EventType::ToolCompleted,
                json!({"n": 3}),
            )
            .await
            .expect("not fenced");
        emitter
            .emit_ahead(EventType::ToolStarted, json!({"n": 4}))
            .await
            .expect("joined");
        emitter
            .emit(EventType::RunCompleted, json!({}))
            .await
            .expect("the holder learns of the write from the write");
        assert_eq!(
            kinds(bus.read_after(run, 0).await.expect("read")),
            [
                "run_started",
                "tool_completed",
                "iteration_started",
                "message_delta",
                "tool_started",
                "run_completed"
            ]
        );
        clean_up(&bus, conn, run).await;
    }

    /// An event emitted ahead right after an append behind a write joins it and keeps its
    /// place; one emitted after another event does not jump it; an event deferred while the
    /// write is in flight goes out with the next event, not ahead of those before it.
    #[tokio::test]
    async fn an_event_emitted_ahead_behind_a_write_keeps_its_place() {
        let (bus, conn, run, emitter) = fresh_emitter();
        emitter.defer(EventType::RunStarted, json!({}), Expiry::Persist);
        let held = behind_a_gate(&emitter).await;
        // Joins the append above; the model call's events follow it.
        let ahead = tokio::spawn({
            let emitter = emitter.clone();
            async move {
                let ahead = emitter.emit_ahead(EventType::IterationStarted, json!({}));
                let late = async {
                    emitter.defer(EventType::MessageDelta, json!({"text": "d"}), Expiry::Keep);
                    emitter.emit(EventType::MessageCompleted, json!({})).await
                };
                let (ahead, late) = tokio::join!(biased; ahead, late);
                ahead.and(late)
            }
        });
        let waited = tokio::time::timeout(std::time::Duration::from_millis(300), async {
            // Still waiting for the write: nothing after `run_started`'s place went out.
            while bus.read_after(run, 0).await.expect("read").is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(waited.is_err(), "every event waits for the write's answer");
        held.send(Written::Held).expect("the task waits");
        ahead.await.expect("task").expect("appended");
        assert_eq!(
            kinds(bus.read_after(run, 0).await.expect("read")),
            [
                "run_started",
                "tool_completed",
                "iteration_started",
                "message_delta",
                "message_completed"
            ]
        );
        assert_eq!(emitter.next_id().await, emitter.last_id().await + 1);

        // Another event took a place after the append behind the write: the one emitted
        // ahead comes after it.
        emitter
            .emit_behind_when(
                async { Written::Held },
                EventType::ToolCompleted,
                json!({"n": 2}),
            )
            .await
            .expect("not fenced");
        emitter
            .emit_behind(EventType::MessageDelta, json!({"text": "e"}))
            .await
            .expect("not fenced");
        emitter
            .emit_ahead(EventType::IterationStarted, json!({}))
            .await
            .expect("appended");
        let stored = kinds(bus.read_after(run, 0).await.expect("read"));
        assert_eq!(
            stored[5..],
            ["tool_completed", "message_delta", "iteration_started"]
        );
        clean_up(&bus, conn, run).await;
    }

    /// A deferred event goes out with the first event emitted after it, whichever kind of
    /// emission that is and whenever its append runs.
    #[tokio::test]
    async fn a_deferred_event_goes_out_with_the_first_event_emitted_after_it() {
        let (bus, conn, run, emitter) = fresh_emitter();
        // Holds the stream's order until released.
        let held = behind_a_gate(&emitter).await;
        emitter.defer(EventType::MessageDelta, json!({"text": "d"}), Expiry::Keep);
        let first = emitter.emit(EventType::MessageCompleted, json!({}));
        let second = async {
            let written = std::future::ready(Written::Held);
            let placed = emitter
                .emit_behind_when(written, EventType::ToolCompleted, json!({"n": 2}))
                .await;
            held.send(Written::Held).expect("the gate waits");
            placed
        };
        let (first, second) = tokio::join!(biased; first, second);
        first.expect("appended");
        second.expect("placed");
        emitter.flush().await.expect("nothing left");
        assert_eq!(
            kinds(bus.read_after(run, 0).await.expect("read")),
            [
                "tool_completed",
                "message_delta",
                "message_completed",
                "tool_completed"
            ]
        );
        clean_up(&bus, conn, run).await;
    }
}
