//! `[redis]`: the event bus's server and the time limits of its calls.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// The Redis server of the event bus (each run's event list, live events) and of the shared
    /// request-rate buckets. Not used when `redis.cluster_nodes` is set.
    pub url: String,
    /// A Redis Cluster instead of one server: comma-separated `redis://` (or `rediss://`) URLs of
    /// some of its nodes, from which the rest are discovered, e.g.
    /// `redis://10.0.0.1:6379,redis://10.0.0.2:6379`. Empty (the default): `redis.url` alone.
    /// Every key of a run shares one hash slot, and live events travel by sharded pub/sub
    /// (`SPUBLISH`/`SSUBSCRIBE`, Redis 7 or later).
    pub cluster_nodes: String,
    /// On a cluster, how long an append that takes a run's stream from an earlier holder (a
    /// take-over after a crash, a resume) waits for a replica to acknowledge the stream's new
    /// fence (`WAIT 1`): a failover to a replica that missed it would let the earlier holder
    /// append again. Healthy replicas answer in well under a millisecond; with none in time the
    /// append stands and `agentfleet_fence_unreplicated_total` counts it. 0: never wait.
    /// At most 10000, and below `redis.response_timeout_ms`.
    pub fence_replication_ms: u64,
    /// Prefix of every key and channel, e.g. `agentfleet:run:{id}:events`: non-empty
    /// `[A-Za-z0-9._-]`. Fleets sharing one Redis need different prefixes.
    pub prefix: String,
    /// The longest one append or read of a run's events may take, waiting for a reconnect included:
    /// past it the call fails as if Redis were unreachable (a worker logs and drops the event, the
    /// run goes on).
    pub timeout_ms: NonZeroU64,
    /// One connection attempt to Redis.
    pub connect_timeout_ms: NonZeroU64,
    /// One command's answer on an established connection.
    pub response_timeout_ms: NonZeroU64,
    /// How often a failed attempt to re-make the shared Redis connection is repeated. Calls made
    /// meanwhile wait for it (a quick restart is ridden through); once the repeats are used up, the
    /// next call starts over, so during a long outage an append to a Redis that refuses connections
    /// fails in well under a second rather than after `redis.timeout_ms`.
    pub reconnect_retries: usize,
    /// The first delay before such a repeat, doubled (with jitter) each time, at most 2 s
    /// ([`RedisSettings::RECONNECT_MAX_BACKOFF`]).
    pub reconnect_backoff_ms: u64,
}

impl RedisSettings {
    /// The cap of the reconnect back-off.
    pub const RECONNECT_MAX_BACKOFF: Duration = Duration::from_secs(2);

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.get())
    }

    pub fn fence_replication(&self) -> Duration {
        Duration::from_millis(self.fence_replication_ms)
    }

    /// The cluster's seed nodes (`redis.cluster_nodes`); empty for a single server.
    pub fn cluster_nodes(&self) -> Vec<&str> {
        self.cluster_nodes
            .split(',')
            .map(str::trim)
            .filter(|node| !node.is_empty())
            .collect()
    }

    /// Whether the fleet talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        !self.cluster_nodes().is_empty()
    }

    /// Where Redis is, for messages: `redis.url`, or the cluster's first seed node.
    pub fn address(&self) -> &str {
        self.cluster_nodes().first().copied().unwrap_or(&self.url)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        use redis::IntoConnectionInfo;
        if !is_name(&self.prefix) {
            return Err(invalid("redis.prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        if self.fence_replication_ms > 10_000 {
            return Err(invalid(
                "redis.fence_replication_ms",
                "must be at most 10000",
            ));
        }
        // The `WAIT` is a command like any other: answered after its own time-out.
        if self.fence_replication_ms >= self.response_timeout_ms.get() {
            return Err(invalid(
                "redis.fence_replication_ms",
                "must be below redis.response_timeout_ms (the wait is one command's answer)",
            ));
        }
        for (n, node) in self.cluster_nodes().into_iter().enumerate() {
            // The entry itself is not repeated: it may hold a password.
            if let Err(e) = node.into_connection_info() {
                return Err(invalid(
                    "redis.cluster_nodes",
                    format!("entry {} is not a Redis URL: {e}", n + 1),
                ));
            }
        }
        Ok(())
    }
}
