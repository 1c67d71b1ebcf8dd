//! `[redis]`: the event bus's server and the time limits of its calls.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// The Redis server of the event bus (each run's event list, live events) and of the shared
    /// request-rate buckets.
    pub url: String,
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

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !is_name(&self.prefix) {
            return Err(invalid("redis.prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        Ok(())
    }
}
