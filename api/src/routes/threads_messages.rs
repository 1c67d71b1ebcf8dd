use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use agentfleet_shared::store::{messages, runs};

use crate::auth::Caller;
use crate::error::{ApiError, QueryParams};
use crate::routes::PathId;
use crate::state::AppState;
use crate::validate;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    after: Option<String>,
    limit: Option<String>,
}

/// `GET /v1/threads/{id}/messages`: oldest first, `after` a message id for the next page.
#[utoipa::path(get, path = "/v1/threads/{id}/messages", tag = "threads",
    params(("id" = String, Path), ("after" = Option<i64>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "`{data: [message], next_after}`", body = Object), (status = 404)),
    security(("bearer" = [])))]
pub async fn list_messages(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    QueryParams(q): QueryParams<MessagesQuery>,
) -> Result<Json<Value>, ApiError> {
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
    let data: Vec<Value> = rows
        .iter()
        .take(limit as usize)
        .map(|m| {
            json!({
                "id": m.id, "run_id": m.run_id, "role": m.role,
                "is_llm_message": m.is_llm_message, "body": m.body.0, "created_at": m.created_at,
            })
        })
        .collect();
    let next_after = if more {
        data.last().and_then(|m| m["id"].as_i64())
    } else {
        None
    };
    Ok(Json(json!({"data": data, "next_after": next_after})))
}
