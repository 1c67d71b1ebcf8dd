//! `GET /v1/webhooks/{id}`: one endpoint of the tenant (never its secret).

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::webhooks::{self, Endpoint};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::state::AppState;

#[derive(Debug, thiserror::Error)]
pub enum GetWebhookError {
    #[error("webhook not found")]
    NotFound,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<GetWebhookError> for ApiError {
    fn from(e: GetWebhookError) -> ApiError {
        match e {
            GetWebhookError::NotFound => ApiError::not_found("webhook"),
            GetWebhookError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

impl From<StoreError> for GetWebhookError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => GetWebhookError::NotFound,
            e => GetWebhookError::Unexpected(e.into()),
        }
    }
}

#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "get_webhook",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    responses((status = 200, description = "The endpoint", body = Endpoint),
              (status = 404, description = "No endpoint of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn get_webhook(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<Endpoint>, ApiError> {
    let endpoint = webhooks::get_endpoint(&state.pool, caller.tenant_id, id)
        .await
        .map_err(GetWebhookError::from)?;
    Ok(Json(endpoint))
}
