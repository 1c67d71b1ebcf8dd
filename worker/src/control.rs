//! Cancel hints on the control channel, and the registry of runs executing in this worker.
//! The cancel itself is in Postgres (the lease renewal also sees it); the hint only makes the
//! stop immediate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::config::RedisSettings;
use agentfleet_shared::events::Keys;
use agentfleet_shared::infra::{self, Server};

use crate::stop::{StopReason, StopSignal};

#[derive(Clone, Default)]
pub struct Registry {
    runs: Arc<Mutex<HashMap<Uuid, StopSignal>>>,
}

impl Registry {
    pub fn insert(&self, run: Uuid, stop: StopSignal) {
        self.runs.lock().expect("registry lock").insert(run, stop);
    }
    pub fn remove(&self, run: Uuid) {
        self.runs.lock().expect("registry lock").remove(&run);
    }
    pub fn stop(&self, run: Uuid, reason: StopReason) {
        if let Some(s) = self.runs.lock().expect("registry lock").get(&run) {
            s.stop(reason);
        }
    }
    pub fn interrupt(&self, run: Uuid) {
        if let Some(s) = self.runs.lock().expect("registry lock").get(&run) {
            s.request_interrupt();
        }
    }
    pub fn stop_all(&self, reason: StopReason) {
        for s in self.runs.lock().expect("registry lock").values() {
            s.stop(reason);
        }
    }
    pub fn len(&self) -> usize {
        self.runs.lock().expect("registry lock").len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Listens for cancel hints until `shutdown`, reconnecting with backoff.
pub fn spawn_listener(
    redis: RedisSettings,
    keys: Keys,
    registry: Registry,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        infra::reconnecting(
            "the cancel listener",
            Server::Redis,
            redis.address(),
            &shutdown,
            || async {
                tokio::select! {
                    r = listen(&redis, &keys, &registry) => r,
                    _ = shutdown.cancelled() => Ok(()),
                }
            },
        )
        .await;
    });
}

/// Never `Ok`: returns when the subscription breaks.
async fn listen(redis: &RedisSettings, keys: &Keys, registry: &Registry) -> anyhow::Result<()> {
    let mut pubsub = agentfleet_shared::events::classic_pubsub(redis).await?;
    pubsub.psubscribe(keys.control_pattern()).await?;
    let mut messages = pubsub.into_on_message();
    while let Some(msg) = messages.next().await {
        let Some(run) = keys.id_of_channel(msg.get_channel_name()) else {
            continue;
        };
        match msg.get_payload_bytes() {
            b"cancel" => registry.stop(run, StopReason::Cancelled),
            // Durable in Postgres too (`interrupt_requested_at`, read at every claim).
            b"interrupt" => registry.interrupt(run),
            _ => {}
        }
    }
    anyhow::bail!("the control subscription ended")
}
