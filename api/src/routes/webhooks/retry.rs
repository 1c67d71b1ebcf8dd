//! `POST /v1/webhooks/{id}/deliveries/{delivery_id}/retry`: sends a delivered or given-up
//! delivery again, at once, with the same `webhook-id` and body. A delivery still pending is
//! 409 `delivery_pending` (it is being retried already).

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::webhook_deliveries::{self, DeliveryInfo, Retried};
use agentfleet_shared::store::webhooks;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::validate;

#[derive(Debug, thiserror::Error)]
pub enum RetryDeliveryError {
    #[error("webhook not found")]
    WebhookNotFound,
    #[error("delivery not found")]
    DeliveryNotFound,
    #[error("the delivery is pending")]
    Pending,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<RetryDeliveryError> for ApiError {
    fn from(e: RetryDeliveryError) -> ApiError {
        match e {
            RetryDeliveryError::WebhookNotFound => ApiError::not_found("webhook"),
            RetryDeliveryError::DeliveryNotFound => ApiError::not_found("delivery"),
            RetryDeliveryError::Pending => ApiError::new(
                StatusCode::CONFLICT,
                "delivery_pending",
                "the delivery is pending: it is retried already (see next_attempt_at)",
            ),
            RetryDeliveryError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

/// The two path ids; a malformed one answers 422 naming it.
pub struct DeliveryPath {
    pub id: uuid::Uuid,
    pub delivery_id: uuid::Uuid,
}

impl<S: Send + Sync> FromRequestParts<S> for DeliveryPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path((id, delivery_id)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::invalid("id", "must be a UUID"))?;
        Ok(DeliveryPath {
            id: validate::uuid("id", &id)?,
            delivery_id: validate::uuid("delivery_id", &delivery_id)?,
        })
    }
}

#[utoipa::path(post, path = "/v1/webhooks/{id}/deliveries/{delivery_id}/retry", tag = "webhooks",
    operation_id = "retry_webhook_delivery",
    params(("id" = uuid::Uuid, Path, description = "The endpoint"),
           ("delivery_id" = uuid::Uuid, Path, description = "The delivery")),
    responses((status = 200, description = "Due again now, under the same id", body = DeliveryInfo),
              (status = 404, description = "No such endpoint of this tenant, or no such delivery of it", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`delivery_pending`: it is being retried already", body = crate::routes::view::ErrorBody)))]
pub async fn retry_delivery(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: DeliveryPath,
) -> Result<Json<DeliveryInfo>, ApiError> {
    match webhooks::get_endpoint(&state.pool, caller.tenant_id, path.id).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(RetryDeliveryError::WebhookNotFound.into()),
        Err(e) => return Err(RetryDeliveryError::Unexpected(e.into()).into()),
    }
    let retried = webhook_deliveries::retry(&state.pool, path.id, path.delivery_id)
        .await
        .map_err(|e| RetryDeliveryError::Unexpected(e.into()))?;
    match retried {
        Retried::Now(d) => Ok(Json(d)),
        Retried::AlreadyPending => Err(RetryDeliveryError::Pending.into()),
        Retried::NotFound => Err(RetryDeliveryError::DeliveryNotFound.into()),
    }
}
