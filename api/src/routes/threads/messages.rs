//! `GET /v1/threads/{id}/messages`: a page of a thread's messages, oldest first.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use agentfleet_shared::store::{messages, runs};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::extract::QueryParams;
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    after: Option<String>,
    limit: Option<String>,
}

/// `GET /v1/threads/{id}/messages`: oldest first, `after` a message id for the next page.
#[utoipa::path(get, path = "/v1/threads/{id}/messages", tag = "threads", operation_id = "list_messages",
    params(("id" = uuid::Uuid, Path, description = "The thread"),
           ("after" = Option<u64>, Query, minimum = 0, maximum = 999_999_999_999_999_999_i64, description = "`next_after` of the previous page"),
           ("limit" = Option<u32>, Query, minimum = 1, description = "Page size (`api.default_page_size` when absent)")),
    responses((status = 200, description = "A page of the thread's messages, oldest first", body = view::MessagePage),
              (status = 404, description = "No thread of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn list_messages(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    QueryParams(q): QueryParams<MessagesQuery>,
) -> Result<Json<view::MessagePage>, ApiError> {
    let thread = id;
    let api = &state.settings.api;
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let after = validate::non_negative("after", q.after.as_deref())?.unwrap_or(0) as i64;
    if !runs::thread_belongs_to(&state.pool, caller.tenant_id, thread)
        .await
        .map_err(ApiError::unexpected)?
    {
        return Err(ApiError::not_found("thread"));
    }
    let rows = messages::list(&state.pool, thread, after, limit as i64 + 1)
        .await
        .map_err(ApiError::unexpected)?;
    let more = rows.len() > limit as usize;
    let data: Vec<view::Message> = rows
        .iter()
        .take(limit as usize)
        .map(view::Message::from)
        .collect();
    let next_after = if more {
        data.last().map(|m| m.id)
    } else {
        None
    };
    Ok(Json(view::MessagePage { data, next_after }))
}
