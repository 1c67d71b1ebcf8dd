//! `[redis]`: the event bus's server and the time limits of its calls.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    /// Prefix of every key and channel, e.g. `agentfleet:run:{id}:events`.
    pub prefix: String,
    /// The longest one event-bus call (an append, a read) may take, waiting for a reconnect
    /// included: past it the call fails like an unreachable Redis (an append is logged and
    /// dropped, the run goes on).
    pub timeout_ms: NonZeroU64,
    /// One connection attempt.
    pub connect_timeout_ms: NonZeroU64,
    /// One command's answer on an established connection.
    pub response_timeout_ms: NonZeroU64,
    /// How often a failed attempt to re-make the shared connection is repeated; calls made
    /// meanwhile wait for it. Once they are used up, the next call starts over.
    pub reconnect_retries: usize,
    /// The first delay before such a repeat, doubled (with jitter) each time, at most
    /// [`RedisSettings::RECONNECT_MAX_BACKOFF`].
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
