//! `POST /v1/webhooks`: registers an endpoint for some events. The answer carries the
//! endpoint's signing secret, the only time the API shows it (it is stored sealed under
//! `webhooks.encryption_key` so deliveries can be signed; without that key nothing is
//! registered). The URL is held to the egress policy of tools: an address the policy refuses
//! is refused here when written literally (host names are judged when a delivery resolves
//! them), and plain `http://` is accepted only for an address the policy lists
//! (`egress.allow`): anywhere else a delivery would cross networks unencrypted.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use agentfleet_shared::domain::check_tool_url;
use agentfleet_shared::store::webhooks::{
    self, CreateEndpointError, EVENTS, Endpoint, NewEndpoint, secret_key,
};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Longest description, in characters (as `webhook_endpoints.description` checks).
pub const MAX_DESCRIPTION_CHARS: usize = 1000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    /// Where deliveries are POSTed: `https://`, or `http://` to an address `egress.allow`
    /// lists; no credentials; at most `webhooks.max_url_bytes`.
    #[schema(schema_with = webhook_url)]
    pub url: String,
    /// The events to deliver, each once: `run.waiting_for_input`,
    /// `run.waiting_for_confirmation`, `run.completed`, `run.failed`, `run.cancelled`,
    /// `batch.completed`.
    #[schema(schema_with = events)]
    pub events: Vec<String>,
    /// `whsec_` and the base64 of 24 to 64 bytes; absent: one is generated.
    #[serde(default)]
    #[schema(schema_with = secret)]
    pub secret: Option<String>,
    /// Free text, at most 1000 characters.
    #[serde(default)]
    #[schema(max_length = 1000, pattern = "^[^\u{0}]*$")]
    pub description: Option<String>,
}

fn webhook_url() -> utoipa::openapi::schema::ObjectBuilder {
    agentfleet_shared::domain::schema::tool_url(
        agentfleet_shared::domain::MAX_TOOL_URL_BYTES,
        "`https://`, or `http://` to an address `egress.allow` lists; no credentials; an address the egress policy refuses is refused",
    )
}

fn events() -> utoipa::openapi::schema::ArrayBuilder {
    utoipa::openapi::schema::ArrayBuilder::new()
        .min_items(Some(1))
        .unique_items(true)
        .items(
            utoipa::openapi::schema::ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::Type::String)
                .enum_values(Some(EVENTS)),
        )
        .description(Some("The events to deliver, each once"))
}

/// What `store::webhooks::secret_key` accepts: `whsec_` and the standard base64 (padded, its
/// unused bits zero) of 24 to 64 bytes, that is 8 to 21 groups of four characters and the
/// padded rest of one or two bytes (64 bytes: 21 groups and one byte).
pub const SECRET_PATTERN: &str = "^whsec_(([A-Za-z0-9+/]{4}){8,20}([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?|([A-Za-z0-9+/]{4}){21}([A-Za-z0-9+/][AQgw]==)?)$";

/// A signing secret, or null for one generated (also `rotate-secret`'s).
pub fn secret() -> utoipa::openapi::schema::ObjectBuilder {
    use utoipa::openapi::schema::{SchemaType, Type};
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .pattern(Some(SECRET_PATTERN))
        .description(Some(
            "`whsec_` and the standard base64 of 24 to 64 bytes; generated when absent",
        ))
}

/// A registered endpoint and its secret, shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookCreated {
    pub id: Uuid,
    pub url: String,
    pub events: Vec<String>,
    pub description: String,
    pub created_at: DateTime<Utc>,
    /// `whsec_<base64>`: the HMAC key (decoded) of every delivery's `webhook-signature`.
    pub secret: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateWebhookError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("the tenant has {0} webhook endpoints, the most allowed")]
    TooMany(u32),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<CreateWebhookError> for ApiError {
    fn from(e: CreateWebhookError) -> ApiError {
        match e {
            CreateWebhookError::Invalid { field, message } => ApiError::invalid(&field, message),
            // The request is valid in itself; it conflicts with what the tenant already has.
            CreateWebhookError::TooMany(max) => ApiError::new(
                StatusCode::CONFLICT,
                "too_many_webhooks",
                format!(
                    "url: the tenant has {max} webhook endpoints, the most allowed \
                     (webhooks.max_endpoints_per_tenant); delete one first"
                ),
            ),
            CreateWebhookError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> CreateWebhookError {
    CreateWebhookError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Why a deployment without `webhooks.encryption_key` refuses to store a secret.
pub const NO_KEY: &str =
    "this deployment stores no webhook secrets (webhooks.encryption_key is not configured)";

/// Every rule of a registration; errors name the field.
pub fn check(state: &AppState, body: &CreateWebhook) -> Result<(), CreateWebhookError> {
    if state.webhook_key.is_none() {
        return Err(invalid("url", NO_KEY));
    }
    let max = state.settings.webhooks.max_url_bytes;
    if body.url.len() > max {
        return Err(invalid(
            "url",
            format!("longer than {max} bytes (webhooks.max_url_bytes)"),
        ));
    }
    let url = check_tool_url(&body.url).map_err(|m| invalid("url", m))?;
    let policy = state.settings.egress_policy();
    if policy.refuses_literal(&body.url) {
        return Err(invalid(
            "url",
            "this address is not allowed by the deployment's egress policy",
        ));
    }
    if url.scheme() != "https" && !policy.lists(&url) {
        return Err(invalid(
            "url",
            "must be https:// (plain http:// only to an address egress.allow lists)",
        ));
    }
    if body.events.is_empty() {
        return Err(invalid("events", "must name at least one event"));
    }
    for (i, event) in body.events.iter().enumerate() {
        if !EVENTS.contains(&event.as_str()) {
            return Err(invalid(
                format!("events[{i}]"),
                format!("unknown event; one of {}", EVENTS.join(", ")),
            ));
        }
        if body.events[..i].contains(event) {
            return Err(invalid(format!("events[{i}]"), "named twice"));
        }
    }
    if let Some(secret) = &body.secret {
        secret_key(secret).map_err(|m| invalid("secret", m))?;
    }
    if let Some(d) = &body.description
        && d.chars().count() > MAX_DESCRIPTION_CHARS
    {
        return Err(invalid(
            "description",
            format!("longer than {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    Ok(())
}

#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", operation_id = "create_webhook",
    request_body = CreateWebhook,
    responses((status = 201, description = "Registered; `secret` is shown only here", body = WebhookCreated),
              (status = 409, description = "`too_many_webhooks`: the tenant has `webhooks.max_endpoints_per_tenant` endpoints; delete one first", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming the field (`url`, `events[i]`, `secret`); `url` also when the deployment has no `webhooks.encryption_key`", body = crate::routes::view::ErrorBody)))]
pub async fn create_webhook(
    State(state): State<AppState>,
    Caller(caller): Caller,
    JsonBody(body): JsonBody<CreateWebhook>,
) -> Result<(StatusCode, Json<WebhookCreated>), ApiError> {
    check(&state, &body)?;
    let Some(key) = state.webhook_key else {
        return Err(invalid("url", NO_KEY).into());
    };
    let secret = body.secret.unwrap_or_else(webhooks::generate_secret);
    let new = NewEndpoint {
        tenant_id: caller.tenant_id,
        url: body.url,
        events: body.events,
        secret: secret.clone(),
        description: body.description.unwrap_or_default(),
    };
    let max = state.settings.webhooks.max_endpoints_per_tenant;
    let Endpoint {
        id,
        url,
        events,
        description,
        created_at,
    } = match webhooks::create_endpoint(&state.pool, new, &key, max).await {
        Ok(e) => e,
        Err(CreateEndpointError::TooMany(n)) => return Err(CreateWebhookError::TooMany(n).into()),
        Err(CreateEndpointError::Store(e)) => {
            return Err(CreateWebhookError::Unexpected(e.into()).into());
        }
    };
    Ok((
        StatusCode::CREATED,
        Json(WebhookCreated {
            id,
            url,
            events,
            description,
            created_at,
            secret,
        }),
    ))
}
