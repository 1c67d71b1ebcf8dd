//! The HTTP clients of model calls: how a worker's model streams are spread over connections.
//!
//! Over HTTP/1.1 each stream in flight holds a connection of its own: a thousand runs waiting on
//! the model are a thousand sockets, each with its buffers, and a read and a wake-up per chunk.
//! Over HTTP/2 many streams share one connection, and chunks of several streams arrive in one
//! read. But a server caps the streams of one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`,
//! commonly 100–256), and one client keeps one HTTP/2 connection per host: calls past the cap
//! would wait for a free stream. So a worker keeps several clients, each with its own pool
//! (`ceil(worker.concurrency / worker.model_streams_per_connection)`), and gives each call the
//! one with the fewest calls in flight: no connection carries more streams than the setting
//! while the worker's slots are its only callers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentfleet_shared::config::{ModelSettings, WorkerSettings};

/// The model clients of one worker.
pub struct ModelClients {
    /// For models spoken to as usual: HTTP/1.1 on `http://`, HTTP/2 where TLS negotiates it.
    usual: Vec<Counted>,
    /// For models with `http2 = true`: HTTP/2 only (on `http://` without negotiation: h2c).
    http2: Vec<Counted>,
}

struct Counted {
    client: reqwest::Client,
    in_flight: Arc<AtomicUsize>,
}

/// A client taken for one call; counts as in flight on it until dropped.
pub struct Lease {
    client: reqwest::Client,
    in_flight: Arc<AtomicUsize>,
}

impl Lease {
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ModelClients {
    pub fn new(settings: &WorkerSettings) -> reqwest::Result<ModelClients> {
        let concurrency = usize::from(settings.concurrency.get());
        let per_connection = settings.model_streams_per_connection.get();
        let count = concurrency.div_ceil(per_connection).max(1);
        let build = |http2: bool| {
            (0..count)
                .map(|_| {
                    let mut builder = reqwest::Client::builder()
                        .connect_timeout(Duration::from_millis(settings.model_connect_timeout_ms))
                        // A slot's next model call reuses an idle connection (HTTP/1.1).
                        .pool_max_idle_per_host(concurrency.div_ceil(count))
                        .tcp_nodelay(true);
                    if http2 {
                        builder = builder.http2_prior_knowledge();
                    }
                    Ok(Counted {
                        client: builder.build()?,
                        in_flight: Arc::default(),
                    })
                })
                .collect::<reqwest::Result<Vec<Counted>>>()
        };
        Ok(ModelClients {
            usual: build(false)?,
            http2: build(true)?,
        })
    }

    /// The client for a call to `model`: of its kind, the one with the fewest calls in flight.
    pub fn lease(&self, model: &ModelSettings) -> Lease {
        let clients = if model.http2 {
            &self.http2
        } else {
            &self.usual
        };
        let least = clients
            .iter()
            .min_by_key(|c| c.in_flight.load(Ordering::Relaxed))
            .expect("at least one client");
        least.in_flight.fetch_add(1, Ordering::Relaxed);
        Lease {
            client: least.client.clone(),
            in_flight: least.in_flight.clone(),
        }
    }

    /// Calls in flight on each client of a kind (tests).
    #[cfg(test)]
    fn loads(&self, http2: bool) -> Vec<usize> {
        let clients = if http2 { &self.http2 } else { &self.usual };
        clients
            .iter()
            .map(|c| c.in_flight.load(Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(http2: bool) -> ModelSettings {
        let mut m: ModelSettings = serde_json::from_value(serde_json::json!({
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
        }))
        .unwrap();
        m.http2 = http2;
        m
    }

    fn worker(concurrency: u16, per_connection: usize) -> WorkerSettings {
        agentfleet_shared::telemetry::install_crypto();
        let mut w = agentfleet_shared::config::Settings::load_with(None, [], false)
            .expect("defaults")
            .worker;
        w.concurrency = std::num::NonZeroU16::new(concurrency).unwrap();
        w.model_streams_per_connection = std::num::NonZeroUsize::new(per_connection).unwrap();
        w
    }

    #[test]
    fn calls_spread_over_enough_connections_for_the_slots() {
        let clients = ModelClients::new(&worker(250, 100)).unwrap();
        assert_eq!(clients.loads(true).len(), 3, "ceil(250 / 100) clients");
        let leases: Vec<Lease> = (0..250).map(|_| clients.lease(&model(true))).collect();
        let loads = clients.loads(true);
        assert_eq!(loads.iter().sum::<usize>(), 250);
        assert!(
            loads.iter().all(|l| *l <= 100),
            "no connection over its streams: {loads:?}"
        );
        assert_eq!(
            clients.loads(false),
            vec![0, 0, 0],
            "the other kind untouched"
        );
        drop(leases);
        assert_eq!(
            clients.loads(true),
            vec![0, 0, 0],
            "a dropped lease frees its place"
        );
    }

    #[test]
    fn a_freed_place_is_taken_again_first() {
        let clients = ModelClients::new(&worker(4, 2)).unwrap();
        let mut leases: Vec<Lease> = (0..4).map(|_| clients.lease(&model(false))).collect();
        assert_eq!(clients.loads(false), vec![2, 2]);
        leases.remove(0);
        let _again = clients.lease(&model(false));
        assert_eq!(clients.loads(false), vec![2, 2]);
    }
}
