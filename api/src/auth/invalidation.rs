//! Faster than the TTL: when a key is revoked or rotated, or a tenant suspended, resumed or
//! given new limits, the change is announced on one Redis channel,
//! `{redis.prefix}:auth:invalidate`, and every API replica drops the cached keys it names.
//!
//! This only shortens the common case. The bound stays `api.auth_cache_ttl_ms` whatever
//! happens to a message (Redis down, a replica between two subscriptions, a publish that
//! failed): entries expire on their own. A replica that (re)subscribes clears its whole cache,
//! since it may have missed messages while it was away.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::config::RedisSettings;
use agentfleet_shared::events::RedisConnection;
use agentfleet_shared::infra::{self, Server};

use crate::auth::cache::AuthCache;

/// What changed: one key, or everything of one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalidation {
    Key(Uuid),
    Tenant(Uuid),
}

impl Invalidation {
    fn encode(self) -> String {
        match self {
            Invalidation::Key(id) => format!("key:{id}"),
            Invalidation::Tenant(id) => format!("tenant:{id}"),
        }
    }

    fn decode(raw: &str) -> Option<Invalidation> {
        let (kind, id) = raw.split_once(':')?;
        let id = Uuid::parse_str(id).ok()?;
        match kind {
            "key" => Some(Invalidation::Key(id)),
            "tenant" => Some(Invalidation::Tenant(id)),
            _ => None,
        }
    }
}

pub fn channel(prefix: &str) -> String {
    format!("{prefix}:auth:invalidate")
}

/// Announces changes (the admin API and the CLI, after their write has committed).
#[derive(Clone)]
pub struct Announcer {
    conn: RedisConnection,
    channel: String,
    timeout: Duration,
}

impl Announcer {
    pub fn new(conn: RedisConnection, prefix: &str, timeout: Duration) -> Announcer {
        Announcer {
            conn,
            channel: channel(prefix),
            timeout,
        }
    }

    /// Publishes `what`; a failure is logged and otherwise ignored (the TTL still bounds the
    /// change). Says whether it was published.
    pub async fn announce(&self, what: Invalidation) -> bool {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&self.channel).arg(what.encode());
        let publish = cmd.query_async::<i64>(&mut conn);
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, ?what, "announcing an auth change failed; replicas see it within api.auth_cache_ttl_ms");
                false
            }
            Err(_) => {
                tracing::warn!(
                    ?what,
                    "announcing an auth change timed out; replicas see it within api.auth_cache_ttl_ms"
                );
                false
            }
        }
    }
}

/// Listens until `shutdown`, reconnecting, and drops what each message names from `cache`.
pub fn spawn_listener(
    redis: RedisSettings,
    prefix: &str,
    cache: Arc<AuthCache>,
    shutdown: CancellationToken,
) {
    let channel = channel(prefix);
    tokio::spawn(async move {
        infra::reconnecting(
            "the auth cache's invalidation subscription",
            Server::Redis,
            redis.address(),
            &shutdown,
            || async {
                tokio::select! {
                    r = listen(&redis, &channel, &cache) => r,
                    _ = shutdown.cancelled() => Ok(()),
                }
            },
        )
        .await;
    });
}

async fn listen(redis: &RedisSettings, channel: &str, cache: &AuthCache) -> anyhow::Result<()> {
    let mut pubsub = agentfleet_shared::events::classic_pubsub(redis).await?;
    pubsub.subscribe(channel).await?;
    // Whatever was announced while we were not subscribed is lost: forget everything.
    cache.invalidate(|_| true);
    let mut messages = pubsub.into_on_message();
    while let Some(msg) = messages.next().await {
        match std::str::from_utf8(msg.get_payload_bytes())
            .ok()
            .and_then(Invalidation::decode)
        {
            Some(Invalidation::Key(id)) => cache.invalidate(|p| p.key_id == id),
            Some(Invalidation::Tenant(id)) => cache.invalidate(|p| p.tenant_id == id),
            None => tracing::warn!("ignoring a malformed auth invalidation message"),
        }
    }
    anyhow::bail!("the invalidation subscription ended")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_back_as_written() {
        let id = Uuid::now_v7();
        for what in [Invalidation::Key(id), Invalidation::Tenant(id)] {
            assert_eq!(Invalidation::decode(&what.encode()), Some(what));
        }
        assert_eq!(Invalidation::decode("key:nope"), None);
        assert_eq!(Invalidation::decode(&format!("user:{id}")), None);
    }
}
