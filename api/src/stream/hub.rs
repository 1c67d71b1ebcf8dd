//! One Redis subscription per API process, fanned out in-process to SSE clients.
//!
//! The hub pattern-subscribes once to every run's live channel, so a client never waits for a
//! SUBSCRIBE round trip and cannot race it. Each client has a bounded buffer; a client that
//! falls behind is dropped (its stream ends) rather than silently skipped, and it resumes with
//! `Last-Event-ID`. When the Redis connection drops, every client is told to resync from the
//! list, which closes any hole the outage made.
//!
//! The subscription is held only while this process serves a stream (a run's or a thread's),
//! and `events.hub_linger_ms` after the last one closed: every run's every event reaches a
//! subscribed process, and one serving none (an API taking batches, say) would parse them all
//! for nothing. A stream that arrives while it is not held registers, the subscription is
//! made, and the client is told to resync from the list, as after a reconnect: nothing
//! published in between is missed.
//!
//! A subscriber only listens, so a connection that died without a reset (a NAT's timeout, a
//! failover behind a proxy) would look open for ever while every stream waits: the hub sends
//! a PING every `events.hub_ping_ms` and, without an answer before the next one is due,
//! reconnects (and every client resyncs).
//!
//! Thread streams also watch a thread: the hub tells them when one of its runs is queued or
//! started (the first events of a new run), so an idle thread stream learns of the next run
//! without asking Postgres on a timer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::events::{EventType, Keys};
use agentfleet_shared::infra::{self, Server};

#[derive(Debug, Clone)]
pub enum HubMessage {
    /// An appended event, as stored.
    Event(Arc<str>),
    /// Live delivery may have missed events: re-read the list from the last id seen.
    Resync,
}

type Clients = HashMap<Uuid, Vec<(u64, mpsc::Sender<HubMessage>)>>;
/// Per thread, its watchers' wake-up channels (capacity 1: wake-ups coalesce).
type Watchers = HashMap<Uuid, Vec<(u64, mpsc::Sender<()>)>>;

#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    clients: Mutex<Clients>,
    threads: Mutex<Watchers>,
    /// Whether any thread is watched: without watchers no event is parsed for its thread.
    watched: std::sync::atomic::AtomicBool,
    next_id: std::sync::atomic::AtomicU64,
    connected: std::sync::atomic::AtomicBool,
    /// Told when a stream registers, so an idle hub subscribes.
    wanted: tokio::sync::Notify,
    /// Registrations so far: a stream that came and went between two idle checks still
    /// counts as use.
    registrations: std::sync::atomic::AtomicU64,
    buffer: usize,
}

/// A client's registration; dropping it unregisters.
pub struct Subscription {
    pub rx: mpsc::Receiver<HubMessage>,
    hub: Hub,
    run: Uuid,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut clients = self.hub.inner.clients.lock().expect("hub lock");
        unregister(&mut clients, self.run, self.id);
    }
}

/// Sends `msg` to a client; `false` if it is gone or too slow to take it. A full buffer means
/// a slow client: the caller drops its sender, so its stream ends (and it resumes from its
/// `Last-Event-ID`).
fn delivered(tx: &mpsc::Sender<HubMessage>, msg: HubMessage) -> bool {
    match tx.try_send(msg) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            metrics::counter!("agentfleet_sse_slow_clients_dropped_total").increment(1);
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

/// `call`, failed as an I/O error (the connection counts as dead) if it takes longer than
/// `limit`.
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no answer in time from the subscription's connection",
        )))
    })
}

/// Removes registration `id` under `key`, and the key with its last registration.
fn unregister<T>(map: &mut HashMap<Uuid, Vec<(u64, T)>>, key: Uuid, id: u64) {
    if let Some(list) = map.get_mut(&key) {
        list.retain(|(each, _)| *each != id);
        if list.is_empty() {
            map.remove(&key);
        }
    }
}

/// How the hub holds its subscription (`events.*`, `redis.*`).
#[derive(Debug, Clone)]
pub struct HubSettings {
    pub redis_url: String,
    /// Messages buffered per client before it is dropped as too slow.
    pub buffer: usize,
    /// How long the subscription outlives the last stream.
    pub linger: Duration,
    /// How often the connection is checked with a PING; an answer not in by the next one
    /// counts the connection as dead (a slow answer, a fork's pause, is not one).
    pub ping_every: Duration,
    /// How long the connect and the PSUBSCRIBE may take.
    pub connect_within: Duration,
}

impl Hub {
    /// Starts the subscription task: subscribed while streams need it (see the module note),
    /// reconnecting after a failure, until `shutdown`.
    pub fn start(settings: HubSettings, keys: Keys, shutdown: CancellationToken) -> Hub {
        let hub = Hub::new(settings.buffer);
        let task_hub = hub.clone();
        tokio::spawn(async move {
            let url = settings.redis_url.clone();
            while task_hub.until_wanted(&shutdown).await {
                infra::reconnecting(
                    "the event hub's subscription",
                    Server::Redis,
                    &url,
                    &shutdown,
                    || async {
                        // After a failure, no retry for streams that have all gone.
                        if !task_hub.is_wanted() {
                            return Ok(());
                        }
                        let result = tokio::select! {
                            r = task_hub.pump(&settings, &keys) => r,
                            _ = shutdown.cancelled() => return Ok(()),
                        };
                        task_hub
                            .inner
                            .connected
                            .store(false, std::sync::atomic::Ordering::SeqCst);
                        // `Ok`: no stream for a while, unsubscribed on purpose.
                        if result.is_err() {
                            task_hub.broadcast_resync();
                        }
                        Ok(result?)
                    },
                )
                .await;
            }
        });
        hub
    }

    /// A hub with no subscription task (`start` adds it).
    fn new(buffer: usize) -> Hub {
        Hub {
            inner: Arc::new(Inner {
                clients: Mutex::new(HashMap::new()),
                threads: Mutex::new(HashMap::new()),
                watched: false.into(),
                next_id: 0.into(),
                connected: false.into(),
                wanted: tokio::sync::Notify::new(),
                registrations: 0.into(),
                buffer,
            }),
        }
    }

    /// Whether a stream needs the subscription: a run's client or a thread's watcher.
    fn is_wanted(&self) -> bool {
        !self.inner.clients.lock().expect("hub lock").is_empty()
            || !self.inner.threads.lock().expect("hub lock").is_empty()
    }

    /// Waits until a stream needs the subscription; `false` on shutdown.
    async fn until_wanted(&self, shutdown: &CancellationToken) -> bool {
        loop {
            // Streams still registered at shutdown must not make this loop spin.
            if shutdown.is_cancelled() {
                return false;
            }
            // Registered before the check: a stream registering after it still wakes us.
            let notified = self.inner.wanted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_wanted() {
                return true;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = shutdown.cancelled() => return false,
            }
        }
    }

    /// Holds the subscription and fans its messages out; `Ok` once no stream has needed it
    /// for about `linger` (between one and two).
    async fn pump(&self, settings: &HubSettings, keys: &Keys) -> redis::RedisResult<()> {
        let linger = settings.linger;
        let client = redis::Client::open(settings.redis_url.as_str())?;
        let mut pubsub = within(settings.connect_within, client.get_async_pubsub()).await?;
        within(
            settings.connect_within,
            pubsub.psubscribe(keys.live_pattern()),
        )
        .await?;
        let (mut sink, mut messages) = pubsub.split();
        self.inner
            .connected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Events published while we were away (or before a stream's subscription was made)
        // are in the lists: make every client look.
        self.broadcast_resync();
        // The PINGs go out from a task of their own, so that waiting for an answer never holds
        // up the messages; it says when one went unanswered, and goes with this call.
        let every = settings.ping_every;
        let (dead_tx, mut dead) = tokio::sync::oneshot::channel::<()>();
        let _pinger = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if within(every, sink.ping::<redis::Value>()).await.is_err() {
                    let _ = dead_tx.send(());
                    return;
                }
            }
        }));
        let mut check = tokio::time::interval_at(tokio::time::Instant::now() + linger, linger);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut idle = false;
        let mut seen = self.registrations();
        loop {
            let msg = tokio::select! {
                msg = messages.next() => msg,
                _ = &mut dead => {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "the subscription's connection did not answer a PING in time",
                    )));
                }
                _ = check.tick() => {
                    let now = self.registrations();
                    let unused = !self.is_wanted() && now == seen;
                    if unused && idle {
                        return Ok(());
                    }
                    (idle, seen) = (unused, now);
                    continue;
                }
            };
            let Some(msg) = msg else { break };
            let Some(run) = keys.run_of_channel(msg.get_channel_name()) else {
                continue;
            };
            let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) else {
                continue;
            };
            if self
                .inner
                .watched
                .load(std::sync::atomic::Ordering::Acquire)
            {
                self.wake_thread_of(payload);
            }
            self.dispatch(run, HubMessage::Event(Arc::from(payload)));
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "subscription stream ended",
        )))
    }

    /// A stream registered: counted as use, and an idle hub subscribes.
    fn registered(&self) {
        self.inner
            .registrations
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.wanted.notify_one();
    }

    fn registrations(&self) -> u64 {
        self.inner
            .registrations
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the subscription is held now (it is not while no stream needs it).
    pub fn is_connected(&self) -> bool {
        self.inner
            .connected
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn subscribe(&self, run: Uuid) -> Subscription {
        let (tx, rx) = mpsc::channel(self.inner.buffer);
        let id = self
            .inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .clients
            .lock()
            .expect("hub lock")
            .entry(run)
            .or_default()
            .push((id, tx));
        self.registered();
        Subscription {
            rx,
            hub: self.clone(),
            run,
            id,
        }
    }

    fn dispatch(&self, run: Uuid, msg: HubMessage) {
        let mut clients = self.inner.clients.lock().expect("hub lock");
        if let Some(list) = clients.get_mut(&run) {
            list.retain(|(_, tx)| delivered(tx, msg.clone()));
            if list.is_empty() {
                clients.remove(&run);
            }
        }
    }

    fn broadcast_resync(&self) {
        let mut clients = self.inner.clients.lock().expect("hub lock");
        // A client that cannot take the resync is dropped like one that cannot take an event:
        // kept, it would never learn that live delivery missed events (its run's last ones,
        // say), and wait for them for ever; dropped, its stream ends and the client resumes.
        clients.retain(|_, list| {
            list.retain(|(_, tx)| delivered(tx, HubMessage::Resync));
            !list.is_empty()
        });
        drop(clients);
        // A new run's first events may have been missed too.
        let threads = self.inner.threads.lock().expect("hub lock");
        for list in threads.values() {
            for (_, tx) in list {
                let _ = tx.try_send(());
            }
        }
    }

    /// Registers interest in `thread`'s new runs until the returned watch is dropped.
    pub fn watch_thread(&self, thread: Uuid) -> ThreadWatch {
        let (tx, rx) = mpsc::channel(1);
        let id = self
            .inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut threads = self.inner.threads.lock().expect("hub lock");
        threads.entry(thread).or_default().push((id, tx));
        self.inner
            .watched
            .store(true, std::sync::atomic::Ordering::Release);
        drop(threads);
        self.registered();
        ThreadWatch {
            rx,
            hub: self.clone(),
            thread,
            id,
        }
    }

    /// Wakes the watchers of the event's thread when the event begins a run.
    fn wake_thread_of(&self, payload: &str) {
        #[derive(serde::Deserialize)]
        struct Head {
            thread_id: Uuid,
            #[serde(rename = "type")]
            kind: EventType,
        }
        // Most events begin no run: told apart by their head, without parsing their data.
        if !may_begin_a_run(payload) {
            return;
        }
        let Ok(head) = serde_json::from_str::<Head>(payload) else {
            return;
        };
        if !matches!(head.kind, EventType::RunQueued | EventType::RunStarted) {
            return;
        }
        let threads = self.inner.threads.lock().expect("hub lock");
        for (_, tx) in threads.get(&head.thread_id).into_iter().flatten() {
            // Full: a wake-up is already pending, which is all a watcher needs.
            let _ = tx.try_send(());
        }
    }
}

/// Whether a stored event may be a run's `run_queued` or `run_started`: its type is in its
/// head (`{"id":…,"run_id":"…","thread_id":"…","type":"…"`, about 140 bytes), before `data`.
fn may_begin_a_run(payload: &str) -> bool {
    const HEAD: usize = 256;
    const TYPES: [&[u8]; 2] = [b"\"type\":\"run_queued\"", b"\"type\":\"run_started\""];
    let head = &payload.as_bytes()[..payload.len().min(HEAD)];
    TYPES.iter().any(|t| head.windows(t.len()).any(|w| w == *t))
}

/// A thread stream's interest in its thread's new runs; dropping it unregisters.
pub struct ThreadWatch {
    rx: mpsc::Receiver<()>,
    hub: Hub,
    thread: Uuid,
    id: u64,
}

impl ThreadWatch {
    /// Forgets wake-ups received so far: call it before looking at the thread's runs, so that
    /// any wake-up left afterwards announces a run that look may not have seen.
    pub fn clear(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// Waits for a run of the thread to be queued or started (or for the hub to reconnect).
    pub async fn woken(&mut self) {
        if self.rx.recv().await.is_none() {
            // The hub never drops a watcher's sender while the watch lives.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for ThreadWatch {
    fn drop(&mut self) {
        let mut threads = self.hub.inner.threads.lock().expect("hub lock");
        unregister(&mut threads, self.thread, self.id);
        self.hub
            .inner
            .watched
            .store(!threads.is_empty(), std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use agentfleet_shared::events::{Envelope, EventType};
    use serde_json::json;
    use uuid::Uuid;

    fn stored(kind: EventType, data: serde_json::Value) -> String {
        // Field order as stored: the append script puts `id` first, then the envelope.
        let e = Envelope {
            id: 12_345_678_901,
            run_id: Uuid::new_v4(),
            thread_id: Uuid::new_v4(),
            kind,
            at: "2026-11-27T00:00:00.000Z".into(),
            data,
        };
        serde_json::to_string(&e).unwrap()
    }

    /// A client whose buffer is full when a resync comes is dropped (its stream ends and it
    /// resumes), as for an event: kept, it never learnt that live delivery had missed events.
    #[tokio::test]
    async fn a_client_too_slow_for_a_resync_is_dropped_and_the_others_resync() {
        // No subscription task: the only resync is the one sent here.
        let hub = super::Hub::new(1);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut slow = hub.subscribe(a);
        let mut fine = hub.subscribe(b);
        hub.dispatch(a, super::HubMessage::Event("e".into()));
        hub.broadcast_resync();
        assert!(matches!(
            slow.rx.recv().await,
            Some(super::HubMessage::Event(_))
        ));
        assert!(
            slow.rx.recv().await.is_none(),
            "the slow client's stream ends"
        );
        assert!(matches!(
            fine.rx.recv().await,
            Some(super::HubMessage::Resync)
        ));
    }

    #[test]
    fn only_the_first_events_of_a_run_are_taken_for_a_new_run() {
        assert!(super::may_begin_a_run(&stored(
            EventType::RunQueued,
            json!({"status": "queued"})
        )));
        assert!(super::may_begin_a_run(&stored(
            EventType::RunStarted,
            json!({"attempt": 1, "worker": "w"})
        )));
        // The words in a later event's data past the head are not looked at (nearer, they
        // pass this filter, and the parse of the whole envelope tells).
        let long = "x".repeat(300);
        assert!(!super::may_begin_a_run(&stored(
            EventType::ToolCompleted,
            json!({"a": long, "echo": {"type": "run_queued"}})
        )));
        assert!(!super::may_begin_a_run(&stored(
            EventType::MessageDelta,
            json!({"text": "hi"})
        )));
    }
}
