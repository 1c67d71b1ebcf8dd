//! `[startup]`: how long a binary waits for its servers when it starts.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupSettings {
    /// How long a binary waits at start-up for Postgres, Redis and RabbitMQ (retrying with
    /// back-off, logging which server and address it waits for every 5 s) before it exits non-zero
    /// naming the one it could not reach. One attempt takes up to 10 s.
    pub dependency_wait_ms: NonZeroU64,
}

impl StartupSettings {
    pub fn dependency_wait(&self) -> Duration {
        Duration::from_millis(self.dependency_wait_ms.get())
    }
}
