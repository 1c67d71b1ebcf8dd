//! `[startup]`: how long a binary waits for its servers when it starts.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupSettings {
    /// How long a binary waits for Postgres, Redis and RabbitMQ at start-up, retrying with
    /// back-off, before it exits naming the server it could not reach.
    pub dependency_wait_ms: NonZeroU64,
}

impl StartupSettings {
    pub fn dependency_wait(&self) -> Duration {
        Duration::from_millis(self.dependency_wait_ms.get())
    }
}
