//! One Redis subscription per API process, fanned out in-process to SSE clients.
//!
//! The hub pattern-subscribes once to every run's live channel, so a client never waits for a
//! SUBSCRIBE round trip and cannot race it. Each client has a bounded buffer; a client that
//! falls behind is dropped (its stream ends) rather than silently skipped, and it resumes with
//! `Last-Event-ID`. When the Redis connection drops, every client is told to resync from the
//! list, which closes any hole the outage made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::events::Keys;
use agentfleet_shared::infra::{self, Server};

#[derive(Debug, Clone)]
pub enum HubMessage {
    /// An appended event, as stored.
    Event(Arc<str>),
    /// Live delivery may have missed events: re-read the list from the last id seen.
    Resync,
}

type Clients = HashMap<Uuid, Vec<(u64, mpsc::Sender<HubMessage>)>>;

#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    clients: Mutex<Clients>,
    next_id: std::sync::atomic::AtomicU64,
    connected: std::sync::atomic::AtomicBool,
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
        if let Some(list) = clients.get_mut(&self.run) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                clients.remove(&self.run);
            }
        }
    }
}

impl Hub {
    /// Starts the subscription task; it reconnects until `shutdown`.
    pub fn start(redis_url: String, keys: Keys, buffer: usize, shutdown: CancellationToken) -> Hub {
        let hub = Hub {
            inner: Arc::new(Inner {
                clients: Mutex::new(HashMap::new()),
                next_id: 0.into(),
                connected: false.into(),
                buffer,
            }),
        };
        let task_hub = hub.clone();
        tokio::spawn(async move {
            let url = redis_url.clone();
            infra::reconnecting(
                "the event hub's subscription",
                Server::Redis,
                &url,
                &shutdown,
                || async {
                    let result = tokio::select! {
                        r = task_hub.pump(&redis_url, &keys) => r,
                        _ = shutdown.cancelled() => return Ok(()),
                    };
                    task_hub
                        .inner
                        .connected
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                    task_hub.broadcast_resync();
                    Ok(result?)
                },
            )
            .await;
        });
        hub
    }

    async fn pump(&self, url: &str, keys: &Keys) -> redis::RedisResult<()> {
        let client = redis::Client::open(url)?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.psubscribe(keys.live_pattern()).await?;
        self.inner
            .connected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Events published while we were away are in the lists: make every client look.
        self.broadcast_resync();
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let Some(run) = keys.run_of_channel(msg.get_channel_name()) else {
                continue;
            };
            let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) else {
                continue;
            };
            self.dispatch(run, HubMessage::Event(Arc::from(payload)));
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "subscription stream ended",
        )))
    }

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
            // A full buffer means a slow client: drop its sender so its stream ends.
            list.retain(|(_, tx)| match tx.try_send(msg.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    metrics::counter!("agentfleet_sse_slow_clients_dropped_total").increment(1);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
            if list.is_empty() {
                clients.remove(&run);
            }
        }
    }

    fn broadcast_resync(&self) {
        let clients = self.inner.clients.lock().expect("hub lock");
        for list in clients.values() {
            for (_, tx) in list {
                let _ = tx.try_send(HubMessage::Resync);
            }
        }
    }
}
