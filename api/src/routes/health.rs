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

/// Ready only when Postgres, Redis and RabbitMQ all answer: a 202 needs all three. Answered
/// from the last background round (`crate::readiness`), so a call touches none of them.
#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz", security(),
    responses((status = 200, description = "Ready: every backing service answered the last check (made every `api.readiness_interval_ms`)", body = Readiness),
              (status = 503, description = "Not ready: the flags say which service did not answer", body = Readiness)))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let interval = std::time::Duration::from_millis(state.settings.api.readiness_interval_ms.get());
    let servers = state.readiness.servers(interval);
    let ready = servers.all();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness {
            status: if ready { "ready" } else { "not_ready" }.to_owned(),
            postgres: servers.postgres,
            redis: servers.redis,
            rabbitmq: servers.rabbitmq,
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
