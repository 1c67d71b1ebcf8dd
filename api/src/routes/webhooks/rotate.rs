//! `POST /v1/webhooks/{id}/rotate-secret`: gives the endpoint a new signing secret (generated,
//! or the body's `secret`), shown in this answer only. Every attempt from then on, retries of
//! earlier deliveries included, is signed with it; the old secret signs nothing more.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::webhooks::{self, secret_key};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::extract::PathId;
use crate::routes::webhooks::create::{NO_KEY, WebhookCreated};
use crate::state::AppState;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// `whsec_` and the base64 of 24 to 64 bytes; absent: one is generated.
    #[serde(default)]
    #[schema(schema_with = crate::routes::webhooks::create::secret)]
    pub secret: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RotateSecretError {
    #[error("webhook not found")]
    NotFound,
    #[error("secret: {0}")]
    InvalidSecret(String),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<RotateSecretError> for ApiError {
    fn from(e: RotateSecretError) -> ApiError {
        match e {
            RotateSecretError::NotFound => ApiError::not_found("webhook"),
            RotateSecretError::InvalidSecret(m) => ApiError::invalid("secret", m),
            RotateSecretError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(post, path = "/v1/webhooks/{id}/rotate-secret", tag = "webhooks", operation_id = "rotate_webhook_secret",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    request_body = RotateSecret,
    responses((status = 200, description = "The endpoint with its new secret, shown only here", body = WebhookCreated),
              (status = 404, description = "No endpoint of this tenant has that id", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming `secret` (malformed, or the deployment has no `webhooks.encryption_key`)", body = crate::routes::view::ErrorBody)))]
pub async fn rotate_secret(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    JsonBody(body): JsonBody<RotateSecret>,
) -> Result<Json<WebhookCreated>, ApiError> {
    let Some(key) = state.webhook_key else {
        return Err(RotateSecretError::InvalidSecret(NO_KEY.into()).into());
    };
    if let Some(secret) = &body.secret {
        secret_key(secret).map_err(RotateSecretError::InvalidSecret)?;
    }
    let secret = body.secret.unwrap_or_else(webhooks::generate_secret);
    let endpoint =
        match webhooks::set_secret(&state.pool, caller.tenant_id, id, &secret, &key).await {
            Ok(e) => e,
            Err(StoreError::NotFound) => return Err(RotateSecretError::NotFound.into()),
            Err(e) => return Err(RotateSecretError::Unexpected(e.into()).into()),
        };
    Ok(Json(WebhookCreated {
        id: endpoint.id,
        url: endpoint.url,
        events: endpoint.events,
        description: endpoint.description,
        created_at: endpoint.created_at,
        secret,
    }))
}
