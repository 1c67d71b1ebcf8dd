//! Readiness from the background: each API process asks Postgres, Redis and RabbitMQ whether
//! they answer every `api.readiness_interval_ms`, and `/readyz` answers from the last round.
//! A probe endpoint is unauthenticated, so answering it by touching the three servers would let
//! anyone turn requests into load on them; this way their cost is one round per interval
//! whatever the probes' rate.
//!
//! A round that has not finished within [`STALE_AFTER_INTERVALS`] intervals (plus its
//! servers' time limit) counts as not ready: a stuck prober must not keep a replica "ready".

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::state::AppState;

/// How long one server may take to answer a round's question.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Rounds that may be missed before the last answer is too old to trust.
const STALE_AFTER_INTERVALS: u32 = 3;

/// Which servers answered the last round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Servers {
    pub postgres: bool,
    pub redis: bool,
    pub rabbitmq: bool,
}

impl Servers {
    pub fn all(self) -> bool {
        self.postgres && self.redis && self.rabbitmq
    }
}

/// The last round's answer, shared by the prober and `/readyz`.
#[derive(Default)]
pub struct Readiness {
    last: Mutex<Option<(Servers, Instant)>>,
}

impl Readiness {
    /// The last round's answer, or none answering when there was none recent enough.
    pub fn servers(&self, interval: Duration) -> Servers {
        let fresh_for = interval * STALE_AFTER_INTERVALS + PROBE_TIMEOUT;
        match *self.last.lock().expect("readiness lock") {
            Some((servers, at)) if at.elapsed() <= fresh_for => servers,
            _ => Servers::default(),
        }
    }

    fn set(&self, servers: Servers) {
        *self.last.lock().expect("readiness lock") = Some((servers, Instant::now()));
    }
}

/// Asks the three servers, at once, each within [`PROBE_TIMEOUT`].
async fn probe(state: &AppState) -> Servers {
    let postgres = tokio::time::timeout(PROBE_TIMEOUT, agentfleet_shared::db::ping(&state.pool));
    // On the connection the API's appends and reads use (the bus bounds it itself too).
    let redis = tokio::time::timeout(PROBE_TIMEOUT, state.bus.ping());
    let rabbitmq = tokio::time::timeout(PROBE_TIMEOUT, state.publisher.check());
    let (postgres, redis, rabbitmq) = tokio::join!(postgres, redis, rabbitmq);
    metrics::counter!("agentfleet_readiness_probes_total").increment(1);
    Servers {
        postgres: postgres.unwrap_or(false),
        redis: redis.is_ok_and(|answered| answered.is_ok()),
        rabbitmq: rabbitmq.unwrap_or(false),
    }
}

/// Probes at once, then every `api.readiness_interval_ms`, until the server stops.
pub fn spawn(state: AppState) {
    let every = Duration::from_millis(state.settings.api.readiness_interval_ms.get());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = state.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let servers = probe(&state).await;
            state.readiness.set(servers);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_too_old_is_not_ready() {
        let readiness = Readiness::default();
        let interval = Duration::from_millis(10);
        assert!(!readiness.servers(interval).all(), "no round yet");
        let up = Servers {
            postgres: true,
            redis: true,
            rabbitmq: true,
        };
        readiness.set(up);
        assert_eq!(readiness.servers(interval), up);
        *readiness.last.lock().unwrap() = Some((up, Instant::now() - Duration::from_secs(10)));
        assert!(!readiness.servers(interval).all(), "stale");
    }
}
