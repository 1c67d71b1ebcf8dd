use axum::Json;
use axum::extract::State;
use base64_cursor::{decode, encode};
use serde::Deserialize;
use serde_json::{Value, json};

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::store::runs::{self, ListFilter};

use crate::auth::Caller;
use crate::error::{ApiError, QueryParams};
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

/// Read as text and checked here, so every error names its parameter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    thread_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/runs`: newest first; `status`, `thread_id` filters; `limit`; `cursor` from
/// `next_cursor` of the previous page.
#[utoipa::path(get, path = "/v1/runs", tag = "runs",
    params(("status" = Option<String>, Query), ("thread_id" = Option<String>, Query), ("limit" = Option<u32>, Query),
           ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses((status = 200, description = "`{data: [run], next_cursor}`", body = Object)),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(state): State<AppState>,
    Caller(caller): Caller,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let api = &state.settings.api;
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(
            RunStatus::parse(s)
                .ok_or_else(|| ApiError::invalid("status", format!("unknown status `{s}`")))?,
        ),
    };
    let thread_id = match q.thread_id.as_deref() {
        None => None,
        Some(t) => Some(validate::uuid("thread_id", t)?),
    };
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => Some(decode(c).ok_or_else(|| ApiError::invalid("cursor", "malformed cursor"))?),
    };
    let filter = ListFilter {
        tenant: caller.tenant_id,
        status,
        thread_id,
        before,
        limit: limit as i64 + 1,
    };
    let mut rows = runs::list(&state.pool, &filter)
        .await
        .map_err(ApiError::unexpected)?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|r| encode(r.created_at, r.id))
    } else {
        None
    };
    Ok(Json(json!({
        "data": rows.iter().map(view::run_json).collect::<Vec<_>>(),
        "next_cursor": next_cursor,
    })))
}

/// Opaque keyset cursors: `<micros since epoch>_<uuid>`.
mod base64_cursor {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    pub fn encode(at: DateTime<Utc>, id: Uuid) -> String {
        format!("{}_{}", at.timestamp_micros(), id.simple())
    }

    pub fn decode(raw: &str) -> Option<(DateTime<Utc>, Uuid)> {
        let (micros, id) = raw.split_once('_')?;
        let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        Some((at, Uuid::parse_str(id).ok()?))
    }
}
