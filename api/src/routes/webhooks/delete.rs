//! `DELETE /v1/webhooks/{id}`: removes an endpoint and its deliveries; pending ones are never
//! sent (an attempt already on the wire completes). Answers the endpoint as it was.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::webhooks::{self, Endpoint};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::state::AppState;

#[derive(Debug, thiserror::Error)]
pub enum DeleteWebhookError {
    #[error("webhook not found")]
    NotFound,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<DeleteWebhookError> for ApiError {
    fn from(e: DeleteWebhookError) -> ApiError {
        match e {
            DeleteWebhookError::NotFound => ApiError::not_found("webhook"),
            DeleteWebhookError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "delete_webhook",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    responses((status = 200, description = "Deleted, with its pending deliveries; the endpoint as it was", body = Endpoint),
              (status = 404, description = "No endpoint of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn delete_webhook(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<Endpoint>, ApiError> {
    match webhooks::delete_endpoint(&state.pool, caller.tenant_id, id).await {
        Ok(endpoint) => Ok(Json(endpoint)),
        Err(StoreError::NotFound) => Err(DeleteWebhookError::NotFound.into()),
        Err(e) => Err(DeleteWebhookError::Unexpected(e.into()).into()),
    }
}
