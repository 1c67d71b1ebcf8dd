//! `[amqp]`: the RabbitMQ broker that carries runs to workers.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    pub url: String,
    /// Prefix of the exchange and queues, e.g. `agentfleet.runs`.
    pub prefix: String,
    /// The longest a publish waits for the broker's confirm, and a consumer's cancel or a
    /// connection's close for its answer. A broker that stops answering without closing
    /// anything (RabbitMQ holds publishers during a memory or disk alarm) then fails the
    /// publish (the sweeper publishes the run again later) instead of holding the run that made
    /// it, and a drain goes on.
    pub timeout_ms: NonZeroU64,
}

impl AmqpSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.get())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !is_name(&self.prefix) {
            return Err(invalid("amqp.prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        Ok(())
    }
}
