//! Building and running the API: `Application::build`, then `run_until_stopped`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::get;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use agentfleet_shared::config::Settings;
use agentfleet_shared::events::{EventBus, Keys};
use agentfleet_shared::infra;
use agentfleet_shared::queue::Topology;
use agentfleet_shared::store::create_many::LimitedRun;
use agentfleet_shared::store::group_commit::{Batcher, write_fn};
use agentfleet_shared::store::{create_many, fair_dispatch};
use agentfleet_shared::{db, telemetry};

use crate::routes;
use crate::state::{AppState, AppStateInner};
use crate::stream::hub::{Hub, HubSettings};

pub struct Application {
    listener: TcpListener,
    router: Router,
    /// The admin API's own listener and router (`api.admin_listen`), when it has one.
    admin: Option<(TcpListener, Router)>,
    /// The Prometheus listener (`api.metrics_listen`), apart from the public port.
    metrics: Option<TcpListener>,
    shutdown: CancellationToken,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        telemetry::install_crypto();
        let settings = Arc::new(settings);
        // The API serves nothing before all three servers answer: it waits for each (saying
        // which), then exits naming the one it could not reach.
        let wait = settings.startup.dependency_wait();
        let pool = infra::postgres(&settings.database, wait).await?;
        if settings.database.migrate_on_start {
            db::migrate(&pool, &settings.database)
                .await
                .context("applying migrations")?;
        }
        let redis = infra::redis(&settings.redis, wait).await?;
        // The rate limiter shares the event bus's multiplexed connection.
        let rate_limiter = Arc::new(crate::rate_limit::RateLimiter::new(
            redis.clone(),
            &settings.redis.prefix,
            settings.rate_limit.clone(),
        ));
        let announcer = crate::auth::invalidation::Announcer::new(
            redis.clone(),
            &settings.redis.prefix,
            settings.redis.timeout(),
        );
        let bus = EventBus::new(
            redis,
            &settings.redis.prefix,
            settings.events.retention_secs,
        )
        .with_lost_id_margin(settings.events.lost_id_margin)
        .with_fence_replication(settings.redis.fence_replication())
        .with_timeout(settings.redis.timeout());
        let publisher = infra::rabbitmq(
            &settings.amqp.url,
            "agentfleet-api",
            Topology::new(&settings.amqp.prefix),
            wait,
        )
        .await?
        .with_timeout(settings.amqp.timeout());
        let shutdown = CancellationToken::new();
        let hub = Hub::start(
            HubSettings {
                redis: settings.redis.clone(),
                buffer: settings.events.client_buffer.get(),
                linger: Duration::from_millis(settings.events.hub_linger_ms),
                ping_every: Duration::from_millis(settings.events.hub_ping_ms),
                // A connect attempt, then a SUBSCRIBE's answer.
                connect_within: Duration::from_millis(
                    settings
                        .redis
                        .connect_timeout_ms
                        .max(settings.redis.response_timeout_ms)
                        .get(),
                ),
            },
            Keys::new(&settings.redis.prefix),
            shutdown.clone(),
        );
        let tokens = crate::auth::stream_token::TokenSigner::new(&settings.api.stream_token_secret);
        let auth_cache = Arc::new(
            crate::auth::cache::AuthCache::new(
                Duration::from_millis(settings.api.auth_cache_ttl_ms),
                settings.api.auth_cache_max_keys.get(),
            )
            .with_unknown(
                Duration::from_millis(settings.api.auth_negative_ttl_ms),
                settings.api.auth_negative_max_keys.get(),
            ),
        );
        let creates = Batcher::spawn(
            pool.clone(),
            settings.api.create_groups_in_flight,
            settings.api.max_create_group,
            settings.database.write_timeout(),
            write_fn(|conn, runs: Arc<Vec<LimitedRun>>| {
                Box::pin(async move { create_many::create_within_limits(conn, &runs).await })
            }),
        );
        let dispatches = fair_dispatch::grouped(
            pool.clone(),
            settings.limits.max_running_runs,
            settings.fair_share.share(),
            settings.database.write_timeout(),
        );
        let key_usage = Arc::new(crate::auth::key_usage::KeyUsage::default());
        let flusher = (key_usage.clone(), pool.clone());
        let listener_cache = auth_cache.clone();
        let state_pool = pool.clone();
        // Validated when the settings load: a malformed key never gets here.
        let mcp_key = settings.mcp.key().context("mcp.encryption_key")?;
        let webhook_key = settings.webhooks.key().context("webhooks.encryption_key")?;
        let state = AppState::new(AppStateInner {
            mcp_key,
            webhook_key,
            admin_failures: Arc::new(crate::auth::attempts::FailedAttempts::new(
                settings.api.admin_max_failures,
                Duration::from_millis(settings.api.admin_failure_window_ms.get()),
                settings.api.admin_max_sources,
            )),
            auth_failures: (settings.api.auth_max_failures > 0).then(|| {
                Arc::new(crate::auth::attempts::FailedAttempts::new(
                    settings.api.auth_max_failures,
                    Duration::from_millis(settings.api.auth_failure_window_ms.get()),
                    settings.api.auth_max_sources,
                ))
            }),
            auth_delayed: tokio::sync::Semaphore::new(settings.api.auth_lockout_max_delayed),
            auth_unseen_lookups: tokio::sync::Semaphore::new(settings.api.auth_unseen_lookups),
            admission: crate::admission::Admission::new(&settings.api),
            readiness: Default::default(),
            streams: Default::default(),
            schema_compiles: Arc::new(tokio::sync::Semaphore::new(
                settings.api.max_schema_compiles,
            )),
            schema_verdicts: agentfleet_shared::tool_schema::Verdicts::new(
                settings.api.max_remembered_schemas,
            ),
            creates,
            dispatches,
            tokens,
            auth_cache,
            rate_limiter,
            key_usage,
            announcer,
            pool,
            bus,
            publisher,
            hub,
            settings: settings.clone(),
            shutdown: shutdown.clone(),
        });
        let sweeper_state = state.clone();
        let readiness_state = state.clone();
        let admin = if separate_admin(&settings) {
            let listener = TcpListener::bind(&settings.api.admin_listen)
                .await
                .with_context(|| {
                    format!("binding api.admin_listen {}", settings.api.admin_listen)
                })?;
            Some((listener, admin_router(state.clone())))
        } else {
            None
        };
        let eraser = crate::erasure::Eraser::of(&state);
        let router = build_router(state);
        let listener = TcpListener::bind(&settings.api.listen)
            .await
            .with_context(|| format!("binding api.listen {}", settings.api.listen))?;
        let metrics = if settings.api.metrics_listen.is_empty() {
            None
        } else {
            // Installed now, so counters are recorded from the start, not from the first scrape.
            telemetry::metrics_handle();
            Some(
                TcpListener::bind(&settings.api.metrics_listen)
                    .await
                    .with_context(|| {
                        format!("binding api.metrics_listen {}", settings.api.metrics_listen)
                    })?,
            )
        };
        // Started once nothing can fail any more; they stop with the server.
        crate::auth::invalidation::spawn_listener(
            settings.redis.clone(),
            &settings.redis.prefix,
            listener_cache,
            shutdown.clone(),
        );
        crate::webhooks::sealing::spawn(
            state_pool.clone(),
            webhook_key,
            settings.webhooks.seal_batch,
            shutdown.clone(),
        );
        crate::webhooks::deliverer::spawn(state_pool, &settings, shutdown.clone())
            .context("starting the webhook deliverer")?;
        crate::batch_driver::spawn_sweeper(sweeper_state);
        crate::readiness::spawn(readiness_state);
        crate::erasure::spawn_sweeper(eraser);
        flusher.0.spawn_flusher(
            flusher.1,
            Duration::from_millis(settings.api.key_last_used_flush_ms.get()),
            shutdown.clone(),
        );
        Ok(Application {
            listener,
            router,
            admin,
            metrics,
            shutdown,
        })
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The port of the admin API's own listener, when it has one (`api.admin_listen`).
    pub fn admin_port(&self) -> Option<u16> {
        self.admin
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
            .map(|a| a.port())
    }

    /// The port of the metrics listener, when `api.metrics_listen` is set.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port())
    }

    /// Serves until `stop` resolves, then ends open streams and drains requests.
    pub async fn run_until_stopped(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let token = self.shutdown.clone();
        let metrics = self.metrics.map(|listener| {
            let stopped = token.clone();
            tokio::spawn(async move {
                let served = axum::serve(listener, metrics_router())
                    .with_graceful_shutdown(async move { stopped.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "metrics listener failed");
                }
            })
        });
        let admin = self.admin.map(|(listener, router)| {
            let stopped = token.clone();
            tokio::spawn(async move {
                // The peer's address: failed attempts are counted per source.
                let app = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stopped.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "admin listener failed");
                }
            })
        });
        // Small writes (SSE events) must not wait for the peer's delayed ACK (Nagle).
        let listener = self.listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
        let stopping = token.clone();
        let app = self
            .router
            .into_make_service_with_connect_info::<std::net::SocketAddr>();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                stop.await;
                token.cancel();
            })
            .await;
        stopping.cancel();
        if let Some(admin) = admin
            && let Err(e) = admin.await
        {
            tracing::error!(error = %e, "admin listener task failed");
        }
        if let Some(metrics) = metrics
            && let Err(e) = metrics.await
        {
            tracing::error!(error = %e, "metrics listener task failed");
        }
        served?;
        Ok(())
    }
}

pub fn build_router(state: AppState) -> Router {
    let api = &state.settings.api;
    let timeout = Duration::from_millis(api.request_timeout_ms);
    let v1 = routes::router(&state)
        .layer(DefaultBodyLimit::max(api.max_body_bytes))
        .layer(from_fn_with_state(timeout, crate::layers::deadline));
    let cors = cors_layer(&state.settings.api.cors_allowed_origins);
    let mut routes = Router::new()
        .route("/healthz", get(routes::health::healthz))
        .route("/readyz", get(routes::health::readyz))
        .route("/openapi.json", get(routes::openapi::openapi))
        .merge(v1);
    if !separate_admin(&state.settings) {
        routes = routes.merge(routes::admin::router(&state));
    }
    if state.settings.api.console {
        routes = routes.merge(crate::console::router());
    }
    if telemetry::exporting() {
        routes = routes.route_layer(from_fn(crate::layers::name_span));
    }
    with_common_layers(routes).layer(cors).with_state(state)
}

/// What every listener's router ends with: its answers to unknown paths and methods, panics
/// caught, and a span per request.
fn with_common_layers(routes: Router<AppState>) -> Router<AppState> {
    routes
        .fallback(crate::error::no_route)
        .method_not_allowed_fallback(crate::error::method_not_allowed)
        .layer(from_fn(crate::layers::catch_panic))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(crate::layers::request_span)
                .on_response(crate::layers::record_status),
        )
}

/// Whether the admin API has a listener of its own: `api.admin_listen` is set and the admin
/// API is on (`api.admin_token`). Otherwise its paths are on the public router, where they
/// answer 404 while the token is empty.
fn separate_admin(settings: &Settings) -> bool {
    !settings.api.admin_listen.is_empty() && !settings.api.admin_token.is_empty()
}

/// The admin listener's router: `/admin/v1/…` and the probes, nothing of `/v1`.
pub fn admin_router(state: AppState) -> Router {
    let routes = Router::new()
        .route("/healthz", get(routes::health::healthz))
        .merge(routes::admin::router(&state));
    with_common_layers(routes).with_state(state)
}

/// The metrics listener's router: Prometheus text at `/metrics`, nothing else.
pub fn metrics_router() -> Router {
    Router::new()
        .route("/metrics", get(routes::health::metrics))
        .fallback(crate::error::no_route)
        .method_not_allowed_fallback(crate::error::method_not_allowed)
}

/// CORS for browser clients: the configured origins (or `*`), the methods and headers the API
/// uses, and `Last-Event-ID` for reconnecting streams. Empty configuration allows none.
fn cors_layer(origins: &str) -> tower_http::cors::CorsLayer {
    use axum::http::{HeaderName, HeaderValue, Method, header};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<&str> = origins
        .split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .collect();
    let allow = if origins.contains(&"*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static("last-event-id"),
        ])
        .max_age(Duration::from_secs(600))
}
