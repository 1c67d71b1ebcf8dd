//! One file per endpoint.

pub mod admin;
pub mod admin_errors;
pub mod admin_keys;
pub mod admin_tenants;
pub mod batches_cancel;
pub mod batches_create;
pub mod batches_events;
pub mod batches_get;
pub mod batches_results;
pub mod health;
pub mod mcp_servers;
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
pub mod usage;
pub mod view;
pub mod webhooks_create;
pub mod webhooks_delete;
pub mod webhooks_deliveries;
pub mod webhooks_get;
pub mod webhooks_list;
pub mod webhooks_retry;
pub mod webhooks_rotate;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

use crate::auth::{require_key, require_key_or_stream_token};
use crate::rate_limit::limit_requests;
use crate::state::AppState;

/// Every `/v1` endpoint, each behind its authentication layer (which runs first, so a request
/// without valid credentials gets 401 before its path, query or body is looked at).
pub fn router(state: &AppState) -> Router<AppState> {
    let keyed = Router::new()
        .route(
            "/v1/runs",
            post(runs_create::create_run).get(runs_list::list_runs),
        )
        .route("/v1/runs/batch", post(runs_batch::create_batch))
        .route("/v1/runs/counts", get(runs_list::count_runs))
        .route("/v1/runs/{id}", get(runs_get::get_run))
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
        .route("/v1/usage", get(usage::get_usage))
        // A batch may be far larger than any other request: its own body limit.
        .route(
            "/v1/batches",
            post(batches_create::submit_batch)
                .layer(DefaultBodyLimit::max(
                    state.settings.api.max_batch_body_bytes,
                ))
                .get(batches_get::list_batches),
        )
        .route("/v1/batches/{id}", get(batches_get::get_batch))
        .route(
            "/v1/batches/{id}/results",
            get(batches_results::batch_results),
        )
        .route(
            "/v1/batches/{id}/cancel",
            post(batches_cancel::cancel_batch),
        )
        .route("/v1/batches/{id}/events", get(batches_events::batch_events))
        .route(
            "/v1/mcp-servers",
            post(mcp_servers::create_mcp_server).get(mcp_servers::list_mcp_servers),
        )
        .route(
            "/v1/mcp-servers/{name}",
            get(mcp_servers::get_mcp_server).delete(mcp_servers::delete_mcp_server),
        )
        .route(
            "/v1/webhooks",
            post(webhooks_create::create_webhook).get(webhooks_list::list_webhooks),
        )
        .route(
            "/v1/webhooks/{id}",
            get(webhooks_get::get_webhook).delete(webhooks_delete::delete_webhook),
        )
        .route(
            "/v1/webhooks/{id}/deliveries",
            get(webhooks_deliveries::list_deliveries),
        )
        .route(
            "/v1/webhooks/{id}/deliveries/{delivery_id}/retry",
            post(webhooks_retry::retry_delivery),
        )
        .route(
            "/v1/webhooks/{id}/rotate-secret",
            post(webhooks_rotate::rotate_secret),
        )
        // Layers run bottom-up: the key first, then the tenant's request rate.
        .route_layer(from_fn_with_state(
            (state.rate_limiter.clone(), state.settings.clone()),
            limit_requests,
        ))
        .route_layer(from_fn_with_state(state.clone(), require_key));
    let streams = Router::new()
        .route("/v1/runs/{id}/events", get(runs_events::run_events))
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
