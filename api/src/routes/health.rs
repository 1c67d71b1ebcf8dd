//! Liveness, readiness and metrics.

use crate::routes::view::{Health, Readiness};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;

use crate::state::AppState;

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "operations", operation_id = "healthz", security(),
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// Ready only when Postgres, Redis and RabbitMQ all answer: a 202 needs all three.
#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz", security(),
    responses((status = 200, description = "Ready: every backing service answers", body = Readiness),
              (status = 503, description = "Not ready: the flags say which service does not answer", body = Readiness)))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let timeout = std::time::Duration::from_secs(2);
    let postgres = tokio::time::timeout(timeout, agentfleet_shared::db::ping(&state.pool))
        .await
        .unwrap_or(false);
    // On the connection the API's appends and reads use (the bus bounds it itself too).
    let redis = tokio::time::timeout(timeout, state.bus.ping())
        .await
        .is_ok_and(|answered| answered.is_ok());
    let rabbitmq = tokio::time::timeout(timeout, state.publisher.check())
        .await
        .unwrap_or(false);
    let ready = postgres && redis && rabbitmq;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness {
            status: if ready { "ready" } else { "not_ready" }.to_owned(),
            postgres,
            redis,
            rabbitmq,
            event_hub: state.hub.is_connected(),
        }),
    )
}

pub async fn metrics() -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        agentfleet_shared::telemetry::metrics_handle().render(),
    )
}
