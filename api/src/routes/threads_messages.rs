use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use agentfleet_shared::store::{messages, runs};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::parse_id;
use crate::state::AppState;

#[derive(Deserialize)]
pub struct MessagesQuery {
    after: Option<i64>,
    limit: Option<u32>,
}

/// `GET /v1/threads/{id}/messages`: oldest first, `after` a message id for the next page.
#[utoipa::path(get, path = "/v1/threads/{id}/messages", tag = "threads",
    params(("id" = String, Path), ("after" = Option<i64>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, description = "`{data: [message], next_after}`", body = Object), (status = 404)),
    security(("bearer" = [])))]
pub async fn list_messages(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    Query(q): Query<MessagesQuery>,
) -> Result<Json<Value>, ApiError> {
    let thread = parse_id(&id, "id")?;
    let api = &state.settings.api;
    let limit = q.limit.unwrap_or(api.default_page_size);
    if limit == 0 || limit > api.max_page_size {
        return Err(ApiError::invalid(
            "limit",
            format!("must be within 1..={}", api.max_page_size),
        ));
    }
    if !runs::thread_belongs_to(&state.pool, caller.tenant_id, thread)
        .await
        .map_err(ApiError::unexpected)?
    {
        return Err(ApiError::not_found("thread"));
    }
    let rows = messages::list(&state.pool, thread, q.after.unwrap_or(0), limit as i64 + 1)
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
