//! `GET /v1/webhooks/{id}/deliveries`: an endpoint's deliveries, newest first, with their
//! attempts: `status` (`pending`, `delivered`, `failed`), `attempts`, the last answer's
//! status code and error, and when the next attempt is due.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::webhook_deliveries::{self, DeliveryInfo};
use agentfleet_shared::store::webhooks;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::extract::QueryParams;
use crate::routes::runs::list::cursor;
use crate::state::AppState;
use crate::validate;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryPage {
    pub data: Vec<DeliveryInfo>,
    /// Pass as `cursor` for the next (older) page; null on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ListDeliveriesError {
    #[error("webhook not found")]
    NotFound,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<ListDeliveriesError> for ApiError {
    fn from(e: ListDeliveriesError) -> ApiError {
        match e {
            ListDeliveriesError::NotFound => ApiError::not_found("webhook"),
            ListDeliveriesError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks", operation_id = "list_webhook_deliveries",
    params(("id" = uuid::Uuid, Path, description = "The endpoint"),
           ("limit" = Option<u32>, Query, minimum = 1, description = "Page size (`api.default_page_size` when absent)"),
           ("cursor" = Option<String>, Query, pattern = "^[0-9]{1,16}_[0-9a-f]{32}$", description = "`next_cursor` of the previous page")),
    responses((status = 200, description = "A page of deliveries, newest first", body = DeliveryPage),
              (status = 404, description = "No endpoint of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn list_deliveries(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    QueryParams(q): QueryParams<DeliveriesQuery>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let api = &state.settings.api;
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => {
            Some(cursor::decode(c).ok_or_else(|| ApiError::invalid("cursor", "malformed cursor"))?)
        }
    };
    match webhooks::get_endpoint(&state.pool, caller.tenant_id, id).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ListDeliveriesError::NotFound.into()),
        Err(e) => return Err(ListDeliveriesError::Unexpected(e.into()).into()),
    }
    let mut rows = webhook_deliveries::list(&state.pool, id, before, limit as i64 + 1)
        .await
        .map_err(|e| ListDeliveriesError::Unexpected(e.into()))?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|d| cursor::encode(d.created_at, d.id))
    } else {
        None
    };
    Ok(Json(DeliveryPage {
        data: rows,
        next_cursor,
    }))
}
