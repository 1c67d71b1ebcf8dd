//! The worker's own small HTTP server: liveness, readiness and Prometheus metrics.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::shared::Shared;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|| async { agentfleet_shared::telemetry::metrics_handle().render() }),
        )
        .with_state(shared)
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    let db = agentfleet_shared::db::ping(&shared.pool).await;
    let broker = tokio::time::timeout(std::time::Duration::from_secs(2), shared.publisher.check())
        .await
        .unwrap_or(false);
    if db && broker {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
