//! agentfleet-worker: takes runs from the queue and executes the agent loop.
//!
//! A run's life, file by file: `intake` (deliveries into slots) → `claim` (lease + attempt) →
//! `quarantine` (a run taken over too often runs alone in its worker) →
//! `lease` (heartbeat) → `run` (the driver, over `run_ctx`) → `iteration` (one model turn, over
//! the `history`) → `model_call` →
//! `tools` (settle the calls) → `pause` (ask, confirm) → `drain` (shutdown). `sweeper`
//! re-enqueues what should be moving and is not; `retention` removes runs past their window;
//! `control` carries cancel hints.

pub mod bounded;
pub mod budget;
pub mod claim;
pub mod context_summary;
pub mod context_window;
pub mod control;
pub mod deps;
pub mod drain;
pub mod emitter;
pub mod fair_dispatch;
pub mod health;
pub mod history;
pub mod intake;
pub mod iteration;
pub mod lease;
pub mod model_call;
pub mod model_http;
pub mod model_stream;
pub mod pause;
pub mod plan;
pub mod quarantine;
pub mod retention;
pub mod run;
pub mod run_ctx;
pub mod stop;
pub mod sweeper;
pub mod tokens;
pub mod tools;
pub mod usage;
pub mod xml_calls;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use agentfleet_shared::config::Settings;
use agentfleet_shared::events::{EventBus, Keys};
use agentfleet_shared::infra::{self, Server};
use agentfleet_shared::queue::Topology;
use agentfleet_shared::{db, telemetry};

use crate::deps::Deps;

pub struct Worker {
    deps: Arc<Deps>,
    health: Option<tokio::net::TcpListener>,
}

impl Worker {
    pub async fn build(settings: Settings) -> anyhow::Result<Worker> {
        telemetry::install_crypto();
        let settings = Arc::new(settings);
        // Nothing is announced before all three servers answer: a worker that cannot reach
        // one waits (unready, saying which), then exits naming it.
        let wait = settings.startup.dependency_wait();
        let pool = infra::postgres(&settings.database, wait).await?;
        if settings.database.migrate_on_start {
            db::migrate(&pool, &settings.database)
                .await
                .context("applying migrations")?;
        }
        let redis = infra::redis(&settings.redis, wait).await?;
        let bus = EventBus::new(
            redis,
            &settings.redis.prefix,
            settings.events.retention_secs,
        )
        .with_lost_id_margin(settings.events.lost_id_margin)
        .with_fence_replication(settings.redis.fence_replication())
        .with_compact_header(settings.events.compact_header)
        .with_pack_max_events(settings.events.pack_max_events)
        .with_timeout(settings.redis.timeout());
        let worker_id = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into()),
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let publisher = infra::rabbitmq(
            &settings.amqp.url,
            &worker_id,
            Topology::new(&settings.amqp.prefix),
            wait,
        )
        .await?
        .with_timeout(settings.amqp.timeout());
        let model_http =
            model_http::ModelClients::new(&settings.worker).context("model http clients")?;
        let egress = Arc::new(settings.egress_policy());
        let tools_http = tools::egress::client(
            egress.clone(),
            settings.egress.max_redirects,
            Duration::from_millis(settings.worker.model_connect_timeout_ms),
            usize::from(settings.worker.concurrency.get()),
        )
        .context("tool http client")?;
        let health = if settings.worker.metrics_listen.is_empty() {
            None
        } else {
            // Installed now, not at the first scrape: what is recorded before it would be lost,
            // and `agentfleet_runs_in_flight` (the autoscaling signal) would go negative when a
            // run taken before the first scrape ends after it.
            telemetry::metrics_handle();
            // Counters the alerts and the dashboard compute `increase()` or `rate()` on exist from the start at 0: a series
            // born at its first event would hide that event from `increase()`.
            for name in [
                "agentfleet_poison_runs_total",
                "agentfleet_quarantined_runs_total",
                "agentfleet_lease_expiries_total",
                "agentfleet_recoveries_total",
                "agentfleet_run_handbacks_total",
                "agentfleet_claim_failures_total",
                "agentfleet_run_panics_total",
            ] {
                metrics::counter!(name).absolute(0);
            }
            metrics::gauge!("agentfleet_quarantined_runs_in_flight").set(0.0);
            crate::retention::register_metrics();
            Some(
                tokio::net::TcpListener::bind(&settings.worker.metrics_listen)
                    .await
                    .with_context(|| {
                        format!(
                            "binding worker.metrics_listen {}",
                            settings.worker.metrics_listen
                        )
                    })?,
            )
        };
        let writes = deps::Writes::spawn(&pool, &settings, &worker_id);
        let mcp_key = settings.mcp.key().context("mcp.encryption_key")?;
        let mcp_tools = tools::mcp::ToolCache::new(
            Duration::from_millis(settings.mcp.tools_ttl_ms.get()),
            settings.mcp.tools_cache_max_entries.get(),
            settings.mcp.tools_cache_max_per_tenant.get(),
        );
        let schemas = Arc::new(tools::compiled::Schemas::new(tools::SchemaMemory::new(
            settings.worker.max_compiled_schema_kib,
            settings.worker.max_compiled_schema_kib_per_tenant,
        )));
        let deps = Arc::new(Deps {
            mcp_key,
            mcp_tools,
            schemas,
            catalogs: Default::default(),
            writes,
            late_timings: Default::default(),
            dispatch_spacing: Default::default(),
            pool,
            bus,
            publisher,
            settings,
            model_http,
            tools_http,
            egress,
            worker_id,
            active: Default::default(),
            leases: Default::default(),
        });
        Ok(Worker { deps, health })
    }

    pub fn id(&self) -> &str {
        &self.deps.worker_id
    }

    pub fn health_port(&self) -> Option<u16> {
        self.health
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port())
    }

    /// Runs until `stop` resolves, then drains and returns.
    pub async fn run_until_stopped(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let deps = self.deps.clone();
        let background = CancellationToken::new();
        let intake_stop = CancellationToken::new();
        let draining = CancellationToken::new();
        let tracker = TaskTracker::new();
        crate::sweeper::spawn(deps.clone(), background.clone());
        crate::retention::spawn(deps.clone(), background.clone());
        crate::lease::spawn(deps.clone(), background.clone());
        crate::control::spawn_listener(
            deps.settings.redis.clone(),
            Keys::new(&deps.settings.redis.prefix),
            deps.active.clone(),
            background.clone(),
        );
        if let Some(listener) = self.health {
            let router = crate::health::router(deps.clone());
            let token = background.clone();
            tokio::spawn(async move {
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(token.cancelled_owned())
                    .await;
            });
        }
        let intake = intake::Intake {
            deps: deps.clone(),
            slots: Arc::new(Semaphore::new(usize::from(
                deps.settings.worker.concurrency.get(),
            ))),
            freed: Arc::new(Notify::new()),
            tracker: tracker.clone(),
            draining: draining.clone(),
            unacked: Default::default(),
            quarantine: Arc::new(crate::quarantine::Quarantine::new(draining.clone())),
        };
        let stopper = intake_stop.clone();
        tokio::spawn(async move {
            stop.await;
            stopper.cancel();
        });
        tracing::info!(worker = %deps.worker_id, concurrency = deps.settings.worker.concurrency, "worker started");
        // The consumer's connection is re-made whenever it fails (broker restart, network);
        // a session returns `Ok` once the intake has stopped.
        infra::reconnecting(
            "the run intake",
            Server::RabbitMq,
            &deps.settings.amqp.url,
            &intake_stop,
            || async {
                // Bounded, and given up on a stop, as every later step of the session: a broker
                // that takes the connection but never answers must not hold the drain.
                let opened = async {
                    // The publisher's nodes: the intake starts on the node the publisher found
                    // alive last, and a node lost to one is passed over by the other.
                    let conn = deps
                        .publisher
                        .brokers()
                        .connect(&deps.worker_id, deps.settings.amqp.timeout())
                        .await?;
                    let channel = conn.create_channel().await?;
                    anyhow::Ok((conn, channel))
                };
                let (conn, channel) = tokio::select! {
                    opened = tokio::time::timeout(deps.settings.amqp.timeout(), opened) => {
                        opened.map_err(|_| anyhow::anyhow!(
                            "RabbitMQ did not open the intake's connection within amqp.timeout_ms"
                        ))??
                    }
                    _ = intake_stop.cancelled() => return Ok(()),
                };
                let result = intake.run(&channel, intake_stop.clone()).await;
                let closing = conn.close(200, "intake stopped".into());
                let _ = tokio::time::timeout(deps.settings.amqp.timeout(), closing).await;
                result
            },
        )
        .await;
        crate::fair_dispatch::unregister(&deps).await;
        let grace = Duration::from_millis(deps.settings.worker.drain_grace_ms);
        crate::drain::drain(&tracker, &draining, &deps.active, grace).await;
        crate::iteration::write_late_timings(&deps).await;
        background.cancel();
        deps.publisher.close().await;
        Ok(())
    }
}
