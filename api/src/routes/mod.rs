//! The HTTP endpoints, one folder per resource and one file per endpoint in it (`runs/create.rs`
//! is `POST /v1/runs`), and the router of `/v1` below.

pub mod admin;
pub mod batches;
pub mod export;
pub mod health;
pub mod mcp_servers;
pub mod openapi;
pub mod runs;
pub mod sse;
pub mod threads;
pub mod usage;
pub mod view;
pub mod webhooks;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

use crate::auth::caller::{require_key, require_key_or_stream_token};
use crate::rate_limit::limit_requests;
use crate::state::AppState;

/// Every `/v1` endpoint, each behind its authentication layer (which runs first, so a request
/// without valid credentials gets 401 before its path, query or body is looked at).
pub fn router(state: &AppState) -> Router<AppState> {
    let keyed = Router::new()
        .route(
            "/v1/runs",
            post(runs::create::create_run).get(runs::list::list_runs),
        )
        .route("/v1/runs/batch", post(runs::batch::create_batch))
        .route("/v1/runs/counts", get(runs::counts::count_runs))
        .route("/v1/runs/{id}", get(runs::get::get_run))
        .route("/v1/runs/{id}/cancel", post(runs::cancel::cancel_run))
        .route("/v1/runs/{id}/resume", post(runs::resume::resume_run))
        .route("/v1/runs/{id}/tasks", get(runs::tasks::list_tasks))
        .route(
            "/v1/runs/{id}/stream-token",
            post(runs::stream_token::issue_stream_token),
        )
        .route(
            "/v1/threads/{id}/messages",
            get(threads::messages::list_messages),
        )
        .route(
            "/v1/threads/{id}/events",
            get(threads::events::thread_events),
        )
        .route("/v1/usage", get(usage::get_usage))
        .route("/v1/export", get(export::export))
        // A batch may be far larger than any other request: its own body limit.
        .route(
            "/v1/batches",
            post(batches::create::submit_batch)
                .layer(DefaultBodyLimit::max(
                    state.settings.api.max_batch_body_bytes,
                ))
                .get(batches::list::list_batches),
        )
        .route("/v1/batches/{id}", get(batches::get::get_batch))
        .route(
            "/v1/batches/{id}/results",
            get(batches::results::batch_results),
        )
        .route(
            "/v1/batches/{id}/cancel",
            post(batches::cancel::cancel_batch),
        )
        .route(
            "/v1/batches/{id}/events",
            get(batches::events::batch_events),
        )
        .route(
            "/v1/mcp-servers",
            post(mcp_servers::create::create_mcp_server).get(mcp_servers::list::list_mcp_servers),
        )
        .route(
            "/v1/mcp-servers/{name}",
            get(mcp_servers::get::get_mcp_server).delete(mcp_servers::delete::delete_mcp_server),
        )
        .route(
            "/v1/webhooks",
            post(webhooks::create::create_webhook).get(webhooks::list::list_webhooks),
        )
        .route(
            "/v1/webhooks/{id}",
            get(webhooks::get::get_webhook).delete(webhooks::delete::delete_webhook),
        )
        .route(
            "/v1/webhooks/{id}/deliveries",
            get(webhooks::deliveries::list_deliveries),
        )
        .route(
            "/v1/webhooks/{id}/deliveries/{delivery_id}/retry",
            post(webhooks::retry::retry_delivery),
        )
        .route(
            "/v1/webhooks/{id}/rotate-secret",
            post(webhooks::rotate::rotate_secret),
        )
        // Layers run bottom-up: the key first, then the tenant's request rate, then the
        // admission of the request's body (`crate::admission`).
        .route_layer(from_fn_with_state(
            state.admission.clone(),
            crate::admission::admit_body,
        ))
        .route_layer(from_fn_with_state(
            (state.rate_limiter.clone(), state.settings.clone()),
            limit_requests,
        ))
        .route_layer(from_fn_with_state(state.clone(), require_key));
    let streams = Router::new()
        .route("/v1/runs/{id}/events", get(runs::events::run_events))
        .route_layer(from_fn_with_state(
            (state.rate_limiter.clone(), state.settings.clone()),
            limit_requests,
        ))
        .route_layer(from_fn_with_state(
            state.clone(),
            require_key_or_stream_token,
        ));
    keyed.merge(streams)
}
