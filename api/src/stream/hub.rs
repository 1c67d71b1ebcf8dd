//! Live events for the streams this process serves, by one Redis subscription per run.
//!
//! The hub subscribes to the live channel of each run a stream here follows, and to nothing
//! else: `SUBSCRIBE` on one server, sharded `SSUBSCRIBE` (on the node owning the run's slot) on
//! a Redis Cluster. Redis then sends each replica only the events of its own streams, whatever
//! the number of replicas. A run's channel is subscribed when its first stream registers and
//! kept `events.hub_linger_ms` after its last one left (a client reconnecting at a pause finds
//! it still there).
//!
//! Gap-freedom: a stream registers *before* it reads the list. Once the subscription is
//! confirmed, the hub tells the run's streams to resync (re-read the list after the last id
//! they saw): what was published before the confirmation is in the list, what comes after is
//! delivered live. A stream registering on a channel already confirmed needs no resync: what
//! precedes its registration is in the list it is about to read.
//!
//! Each client has a bounded buffer; a client that falls behind is dropped (its stream ends)
//! rather than silently skipped, and it resumes with `Last-Event-ID`. When the connection
//! drops, each run's clients resync once its subscription is made anew (reading the list from
//! a Redis out of reach before that would only fail their streams).
//!
//! A subscriber only listens, so a connection that died without a reset (a NAT's timeout, a
//! failover behind a proxy) would look open for ever while every stream waits: while it holds
//! any subscription, the hub sends a PING every `events.hub_ping_ms` and, without an answer
//! before the next one is due, makes a new connection (and every client resyncs on it).
//!
//! Thread streams also watch a thread: a run's `run_queued` and `run_started` publish its id on
//! the thread's channel, which the hub subscribes to while a stream watches that thread, so an
//! idle thread stream learns of the next run without asking Postgres on a timer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::config::RedisSettings;
use agentfleet_shared::events::{Keys, RedisConnection, subscriber_connection};
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

/// A channel the hub may subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Channel {
    /// A run's live events.
    Run(Uuid),
    /// A thread's new runs.
    Thread(Uuid),
}

/// What the hub knows of a channel it wants.
#[derive(Debug)]
struct Wanted {
    /// Redis confirmed the subscription on the current connection.
    confirmed: bool,
    /// Since when no stream has needed it (`None`: one does).
    unused_since: Option<Instant>,
}

#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    clients: Mutex<Clients>,
    threads: Mutex<Watchers>,
    /// The channels subscribed or to subscribe. Lock order: `channels`, then `clients` or
    /// `threads`.
    channels: Mutex<HashMap<Channel, Wanted>>,
    /// Channels to subscribe, for the subscription task.
    commands: mpsc::UnboundedSender<Channel>,
    next_id: AtomicU64,
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
        let last = unregister(&mut clients, self.run, self.id);
        drop(clients);
        if last {
            self.hub.unused(Channel::Run(self.run));
        }
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

/// Removes registration `id` under `key`, and the key with its last registration; `true`
/// when that was the last.
fn unregister<T>(map: &mut HashMap<Uuid, Vec<(u64, T)>>, key: Uuid, id: u64) -> bool {
    if let Some(list) = map.get_mut(&key) {
        list.retain(|(each, _)| *each != id);
        if list.is_empty() {
            map.remove(&key);
            return true;
        }
    }
    false
}

/// How the hub holds its subscriptions (`events.*`, `redis.*`).
#[derive(Debug, Clone)]
pub struct HubSettings {
    pub redis: RedisSettings,
    /// Messages buffered per client before it is dropped as too slow.
    pub buffer: usize,
    /// How long a channel stays subscribed after its last stream left.
    pub linger: Duration,
    /// How often the connection is checked with a PING; an answer not in by the next one
    /// counts the connection as dead (a slow answer, a fork's pause, is not one).
    pub ping_every: Duration,
    /// How long the connect and a SUBSCRIBE may take.
    pub connect_within: Duration,
}

/// Why a subscription session ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("the subscription's connection did not answer a PING in time")]
    Silent,
    #[error("the subscription's connection closed")]
    Closed,
}

impl Hub {
    /// Starts the subscription task: it subscribes the channels streams need, reconnecting
    /// after a failure, until `shutdown`.
    pub fn start(settings: HubSettings, keys: Keys, shutdown: CancellationToken) -> Hub {
        let (hub, commands) = Hub::new(settings.buffer);
        let task_hub = hub.clone();
        let commands = Arc::new(tokio::sync::Mutex::new(commands));
        tokio::spawn(async move {
            let address = settings.redis.address().to_owned();
            infra::reconnecting(
                "the event hub's subscription",
                Server::Redis,
                &address,
                &shutdown,
                || async {
                    let mut commands = commands.lock().await;
                    let result = tokio::select! {
                        r = task_hub.session(&settings, &keys, &mut commands) => r,
                        _ = shutdown.cancelled() => return Ok(()),
                    };
                    // Whatever the connection delivered no more, the lists have.
                    task_hub.lost_connection();
                    Ok(result?)
                },
            )
            .await;
        });
        hub
    }

    /// A hub without its subscription task (`start` adds it), and what the task reads.
    fn new(buffer: usize) -> (Hub, mpsc::UnboundedReceiver<Channel>) {
        let (commands, rx) = mpsc::unbounded_channel();
        let hub = Hub {
            inner: Arc::new(Inner {
                clients: Mutex::new(HashMap::new()),
                threads: Mutex::new(HashMap::new()),
                channels: Mutex::new(HashMap::new()),
                commands,
                next_id: 0.into(),
                buffer,
            }),
        };
        (hub, rx)
    }

    /// Whether the hub holds a subscription now (it holds none while it serves no stream).
    pub fn is_connected(&self) -> bool {
        let channels = self.inner.channels.lock().expect("hub lock");
        channels.values().any(|w| w.confirmed)
    }

    pub fn subscribe(&self, run: Uuid) -> Subscription {
        let (tx, rx) = mpsc::channel(self.inner.buffer);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner
            .clients
            .lock()
            .expect("hub lock")
            .entry(run)
            .or_default()
            .push((id, tx));
        self.want(Channel::Run(run));
        Subscription {
            rx,
            hub: self.clone(),
            run,
            id,
        }
    }

    /// A stream needs `channel`: subscribed unless it is (or is being) already.
    fn want(&self, channel: Channel) {
        let mut channels = self.inner.channels.lock().expect("hub lock");
        match channels.get_mut(&channel) {
            Some(wanted) => wanted.unused_since = None,
            None => {
                channels.insert(
                    channel,
                    Wanted {
                        confirmed: false,
                        unused_since: None,
                    },
                );
                // Without a task (tests) nobody subscribes; nothing else to do.
                let _ = self.inner.commands.send(channel);
                metrics::gauge!("agentfleet_hub_channels").set(channels.len() as f64);
            }
        }
    }

    /// The last stream that needed `channel` left.
    fn unused(&self, channel: Channel) {
        let mut channels = self.inner.channels.lock().expect("hub lock");
        if let Some(wanted) = channels.get_mut(&channel) {
            wanted.unused_since = Some(Instant::now());
        }
    }

    /// Holds the subscriptions on one connection until it fails (or shutdown, which the caller
    /// watches).
    async fn session(
        &self,
        settings: &HubSettings,
        keys: &Keys,
        commands: &mut mpsc::UnboundedReceiver<Channel>,
    ) -> Result<(), SessionError> {
        let (push_tx, mut pushes) = mpsc::unbounded_channel();
        let mut conn = subscriber_connection(&settings.redis, push_tx)?;
        // Whatever is wanted now, made again on this connection.
        while commands.try_recv().is_ok() {}
        let all: Vec<Channel> = {
            let mut channels = self.inner.channels.lock().expect("hub lock");
            channels.values_mut().for_each(|w| w.confirmed = false);
            channels.keys().copied().collect()
        };
        self.subscribe_channels(&mut conn, keys, &all, settings.connect_within)
            .await?;
        // The PINGs go out from a task of their own, so that waiting for an answer never holds
        // up the messages; it says when one went unanswered, and goes with this call.
        let every = settings.ping_every;
        let (dead_tx, mut dead) = tokio::sync::oneshot::channel::<()>();
        let pinger_hub = self.clone();
        let mut pinger_conn = conn.clone();
        let _pinger = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // A lazy connection holding nothing is not made just to be checked.
                if pinger_hub
                    .inner
                    .channels
                    .lock()
                    .expect("hub lock")
                    .is_empty()
                {
                    continue;
                }
                let ping = redis::cmd("PING");
                if within(every, ping.query_async::<Value>(&mut pinger_conn))
                    .await
                    .is_err()
                {
                    let _ = dead_tx.send(());
                    return;
                }
            }
        }));
        let linger = settings.linger;
        let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + linger, linger);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                push = pushes.recv() => {
                    let Some(push) = push else { return Err(SessionError::Closed) };
                    self.on_push(keys, push);
                }
                channel = commands.recv() => {
                    let Some(channel) = channel else { return Ok(()) };
                    let mut batch = vec![channel];
                    while let Ok(more) = commands.try_recv() {
                        batch.push(more);
                    }
                    self.subscribe_channels(&mut conn, keys, &batch, settings.connect_within)
                        .await?;
                }
                _ = sweep.tick() => {
                    let gone = self.sweep(linger);
                    if !gone.is_empty() {
                        let (sharded, classic) = names(keys, &gone);
                        within(settings.connect_within, conn.unsubscribe_live(&sharded, &classic))
                            .await?;
                    }
                }
                _ = &mut dead => return Err(SessionError::Silent),
            }
        }
    }

    async fn subscribe_channels(
        &self,
        conn: &mut RedisConnection,
        keys: &Keys,
        channels: &[Channel],
        limit: Duration,
    ) -> redis::RedisResult<()> {
        if channels.is_empty() {
            return Ok(());
        }
        let (sharded, classic) = names(keys, channels);
        within(limit, conn.subscribe_live(&sharded, &classic)).await
    }

    /// Forgets the channels no stream has needed for `linger`, and returns them to unsubscribe.
    fn sweep(&self, linger: Duration) -> Vec<Channel> {
        let mut channels = self.inner.channels.lock().expect("hub lock");
        let clients = self.inner.clients.lock().expect("hub lock");
        let threads = self.inner.threads.lock().expect("hub lock");
        let mut gone = Vec::new();
        channels.retain(|channel, wanted| {
            let needed = match channel {
                Channel::Run(run) => clients.contains_key(run),
                Channel::Thread(thread) => threads.contains_key(thread),
            };
            if needed {
                wanted.unused_since = None;
                return true;
            }
            let since = *wanted.unused_since.get_or_insert_with(Instant::now);
            if since.elapsed() < linger {
                return true;
            }
            gone.push(*channel);
            false
        });
        metrics::gauge!("agentfleet_hub_channels").set(channels.len() as f64);
        gone
    }

    /// One message from the connection: an event, a subscription confirmed or dropped, or the
    /// connection lost.
    fn on_push(&self, keys: &Keys, push: PushInfo) {
        if push.kind == PushKind::Disconnection {
            self.lost_connection();
            return;
        }
        let Some((name, channel)) = channel_of(keys, &push.data) else {
            return;
        };
        match (push.kind, channel) {
            (PushKind::Message | PushKind::SMessage, Channel::Thread(thread)) => {
                self.wake_thread(thread);
            }
            (PushKind::Message | PushKind::SMessage, Channel::Run(run)) => {
                if let Some(Value::BulkString(payload)) = push.data.get(1)
                    && let Ok(payload) = std::str::from_utf8(payload)
                {
                    self.dispatch(run, HubMessage::Event(Arc::from(payload)));
                }
            }
            (PushKind::Subscribe | PushKind::SSubscribe, _) => {
                if let Some(wanted) = self
                    .inner
                    .channels
                    .lock()
                    .expect("hub lock")
                    .get_mut(&channel)
                {
                    wanted.confirmed = true;
                }
                // Published before the confirmation: in the list (or, for a thread, in Postgres).
                match channel {
                    Channel::Run(run) => self.resync(run),
                    Channel::Thread(thread) => self.wake_thread(thread),
                }
            }
            // Not asked for while the channel is still wanted: the server dropped it (a
            // cluster's slot moved to another node). Made again; the clients resync meanwhile.
            (PushKind::Unsubscribe | PushKind::SUnsubscribe, _) => {
                let mut channels = self.inner.channels.lock().expect("hub lock");
                if let Some(wanted) = channels.get_mut(&channel) {
                    wanted.confirmed = false;
                    let _ = self.inner.commands.send(channel);
                    drop(channels);
                    tracing::debug!(channel = %name, "a live subscription was dropped; making it again");
                    if let Channel::Run(run) = channel {
                        self.resync(run);
                    }
                }
            }
            _ => {}
        }
    }

    /// The connection broke: nothing is confirmed until it is made again. The clients resync
    /// then, each run's as its subscription is confirmed anew: re-reading the list now, from a
    /// Redis that may well be the one out of reach, would only fail their streams.
    fn lost_connection(&self) {
        self.inner
            .channels
            .lock()
            .expect("hub lock")
            .values_mut()
            .for_each(|w| w.confirmed = false);
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

    /// Tells `run`'s clients to re-read the list. A client that cannot take it is dropped like
    /// one that cannot take an event: kept, it would never learn that live delivery missed
    /// events (its run's last ones, say), and wait for them for ever; dropped, its stream ends
    /// and the client resumes.
    fn resync(&self, run: Uuid) {
        self.dispatch(run, HubMessage::Resync);
    }

    /// Registers interest in `thread`'s new runs until the returned watch is dropped.
    pub fn watch_thread(&self, thread: Uuid) -> ThreadWatch {
        let (tx, rx) = mpsc::channel(1);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut threads = self.inner.threads.lock().expect("hub lock");
        threads.entry(thread).or_default().push((id, tx));
        drop(threads);
        self.want(Channel::Thread(thread));
        ThreadWatch {
            rx,
            hub: self.clone(),
            thread,
            id,
        }
    }

    /// Wakes the watchers of `thread`: one of its runs was queued or started.
    fn wake_thread(&self, thread: Uuid) {
        let threads = self.inner.threads.lock().expect("hub lock");
        for (_, tx) in threads.get(&thread).into_iter().flatten() {
            // Full: a wake-up is already pending, which is all a watcher needs.
            let _ = tx.try_send(());
        }
    }
}

/// The channel a push names (its first element), if it is one of [`Keys`]'s.
fn channel_of(keys: &Keys, data: &[Value]) -> Option<(String, Channel)> {
    let Some(Value::BulkString(name)) = data.first() else {
        return None;
    };
    let name = std::str::from_utf8(name).ok()?;
    let id = keys.id_of_channel(name)?;
    let channel = if keys.is_thread_channel(name) {
        Channel::Thread(id)
    } else {
        Channel::Run(id)
    };
    Some((name.to_owned(), channel))
}

/// The Redis channel names of `channels`: runs' (sharded on a cluster) and threads' (classic).
fn names(keys: &Keys, channels: &[Channel]) -> (Vec<String>, Vec<String>) {
    let mut sharded = Vec::new();
    let mut classic = Vec::new();
    for channel in channels {
        match channel {
            Channel::Run(run) => sharded.push(keys.live(*run)),
            Channel::Thread(thread) => classic.push(keys.thread_live(*thread)),
        }
    }
    (sharded, classic)
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
        let last = unregister(&mut threads, self.thread, self.id);
        drop(threads);
        if last {
            self.hub.unused(Channel::Thread(self.thread));
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::{PushInfo, PushKind, Value};
    use uuid::Uuid;

    use agentfleet_shared::events::Keys;

    use super::{Channel, Hub, HubMessage};

    fn push(kind: PushKind, channel: &str, payload: &str) -> PushInfo {
        PushInfo {
            kind,
            data: vec![
                Value::BulkString(channel.as_bytes().to_vec()),
                Value::BulkString(payload.as_bytes().to_vec()),
            ],
        }
    }

    /// A subscription confirmed tells its run's clients, and only them, to re-read the list
    /// (what was published before it is there); a client whose buffer is full then is dropped
    /// (its stream ends and it resumes), as for an event: kept, it would never learn that live
    /// delivery had missed events.
    #[tokio::test]
    async fn a_confirmed_subscription_resyncs_its_run_and_drops_a_client_too_slow_for_it() {
        // No subscription task: the pushes are the ones given here.
        let (hub, mut commands) = Hub::new(1);
        let keys = Keys::new("t");
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut slow = hub.subscribe(a);
        let mut other = hub.subscribe(b);
        assert_eq!(commands.try_recv().ok(), Some(Channel::Run(a)));
        assert_eq!(commands.try_recv().ok(), Some(Channel::Run(b)));
        assert!(!hub.is_connected(), "nothing confirmed yet");
        hub.dispatch(a, HubMessage::Event("e".into()));
        hub.on_push(&keys, push(PushKind::SSubscribe, &keys.live(a), "1"));
        assert!(hub.is_connected());
        assert!(matches!(slow.rx.recv().await, Some(HubMessage::Event(_))));
        assert!(
            slow.rx.recv().await.is_none(),
            "the slow client's stream ends"
        );
        assert!(
            other.rx.try_recv().is_err(),
            "the other run's client is not disturbed"
        );
        // An event on the other run's channel reaches its client, as stored.
        hub.on_push(&keys, push(PushKind::Message, &keys.live(b), "{\"id\":1}"));
        assert!(matches!(other.rx.recv().await, Some(HubMessage::Event(e)) if &*e == "{\"id\":1}"));
    }

    /// A channel is subscribed once however many streams follow its run, and given up only
    /// when none has for `linger`; a subscription the server dropped while still wanted is made
    /// again.
    #[tokio::test]
    async fn a_run_s_channel_is_held_while_streams_follow_it_and_made_again_when_dropped() {
        let (hub, mut commands) = Hub::new(8);
        let keys = Keys::new("t");
        let run = Uuid::new_v4();
        let first = hub.subscribe(run);
        let second = hub.subscribe(run);
        assert_eq!(commands.try_recv().ok(), Some(Channel::Run(run)));
        assert!(
            commands.try_recv().is_err(),
            "one subscription for both streams"
        );
        hub.on_push(&keys, push(PushKind::SUnsubscribe, &keys.live(run), "0"));
        assert_eq!(
            commands.try_recv().ok(),
            Some(Channel::Run(run)),
            "dropped by the server while wanted: subscribed again"
        );
        drop(first);
        let linger = std::time::Duration::from_millis(50);
        assert!(
            hub.sweep(linger).is_empty(),
            "a stream still follows the run"
        );
        drop(second);
        assert!(hub.sweep(linger).is_empty(), "kept for the linger");
        tokio::time::sleep(linger).await;
        assert_eq!(hub.sweep(linger), vec![Channel::Run(run)]);
        // Unsubscribed on purpose: its confirmation is not taken for a loss.
        hub.on_push(&keys, push(PushKind::SUnsubscribe, &keys.live(run), "0"));
        assert!(commands.try_recv().is_err());
    }
}
