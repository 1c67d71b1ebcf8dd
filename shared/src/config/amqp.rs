//! `[amqp]`: the RabbitMQ broker that carries runs to workers.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    /// The RabbitMQ broker that carries runs to workers (`%2f` is the default virtual host `/`).
    pub url: String,
    /// Prefix of the exchange and queues, e.g. `agentfleet.runs` and the dead letters'
    /// `agentfleet.runs.dead`: non-empty `[A-Za-z0-9._-]`.
    pub prefix: String,
    /// The longest a publish waits for RabbitMQ's confirm (reconnecting included), and a consumer's
    /// start, a cancel or a connection (opened or closed) for its answer: a broker that stops
    /// answering without closing anything (a memory or disk alarm holds publishers) fails the
    /// publish (the sweeper publishes the run again later) instead of holding the run that made it,
    /// and a drain goes on.
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
