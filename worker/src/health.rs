//! The worker's own small HTTP server: liveness, readiness and Prometheus metrics.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::deps::Deps;

pub fn router(deps: Arc<Deps>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|| async { agentfleet_shared::telemetry::metrics_handle().render() }),
        )
        .with_state(deps)
}

async fn readyz(State(deps): State<Arc<Deps>>) -> (StatusCode, &'static str) {
    let db = agentfleet_shared::db::ping(&deps.pool).await;
    let broker = tokio::time::timeout(std::time::Duration::from_secs(2), deps.publisher.check())
        .await
        .unwrap_or(false);
    if db && broker {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
