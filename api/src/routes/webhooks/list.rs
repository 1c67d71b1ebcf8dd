//! `GET /v1/webhooks`: the tenant's endpoints, oldest first (at most
//! `webhooks.max_endpoints_per_tenant`, so one page). Secrets are never shown again.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use agentfleet_shared::store::webhooks::{self, Endpoint};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    pub data: Vec<Endpoint>,
}

#[derive(Debug, thiserror::Error)]
pub enum ListWebhooksError {
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<ListWebhooksError> for ApiError {
    fn from(e: ListWebhooksError) -> ApiError {
        match e {
            ListWebhooksError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", operation_id = "list_webhooks",
    responses((status = 200, description = "The tenant's endpoints, oldest first", body = WebhookList)))]
pub async fn list_webhooks(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<WebhookList>, ApiError> {
    let data = webhooks::list_endpoints(&state.pool, caller.tenant_id)
        .await
        .map_err(|e| ListWebhooksError::Unexpected(e.into()))?;
    Ok(Json(WebhookList { data }))
}
