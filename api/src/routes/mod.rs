//! One file per endpoint.

pub mod health;
pub mod openapi;
pub mod runs_batch;
pub mod runs_cancel;
pub mod runs_create;
pub mod runs_events;
pub mod runs_get;
pub mod runs_list;
pub mod runs_resume;
pub mod runs_stream_token;
pub mod threads_events;
pub mod threads_messages;
pub mod view;

use axum::Router;
use axum::routing::{get, post};

use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/runs",
            post(runs_create::create_run).get(runs_list::list_runs),
        )
        .route("/v1/runs/batch", post(runs_batch::create_batch))
        .route("/v1/runs/{id}", get(runs_get::get_run))
        .route("/v1/runs/{id}/events", get(runs_events::run_events))
        .route("/v1/runs/{id}/cancel", post(runs_cancel::cancel_run))
        .route("/v1/runs/{id}/resume", post(runs_resume::resume_run))
        .route(
            "/v1/runs/{id}/stream-token",
            post(runs_stream_token::issue_stream_token),
        )
        .route(
            "/v1/threads/{id}/messages",
            get(threads_messages::list_messages),
        )
        .route(
            "/v1/threads/{id}/events",
            get(threads_events::thread_events),
        )
}

/// Parses a path id; a malformed id names the parameter.
pub fn parse_id(raw: &str, what: &str) -> Result<uuid::Uuid, crate::error::ApiError> {
    uuid::Uuid::parse_str(raw).map_err(|_| crate::error::ApiError::invalid(what, "must be a UUID"))
}
