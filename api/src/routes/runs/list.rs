//! `GET /v1/runs`: a page of the tenant's runs, newest first, and the keyset cursor its pages
//! (and those of webhook deliveries and batches) are read with.

use axum::Json;
use axum::extract::State;
use cursor::{decode, encode};
use serde::Deserialize;

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::store::runs::{self, ListFilter};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::QueryParams;
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

/// Read as text and checked here, so every error names its parameter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    thread_id: Option<String>,
    batch_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/runs`: newest first; `status`, `thread_id`, `batch_id` filters; `limit`; `cursor`
/// from `next_cursor` of the previous page.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", operation_id = "list_runs",
    params(("status" = Option<RunStatus>, Query, description = "Only runs in this status"),
           ("thread_id" = Option<uuid::Uuid>, Query, description = "Only runs of this thread"),
           ("batch_id" = Option<uuid::Uuid>, Query, description = "Only runs of this batch"),
           ("limit" = Option<u32>, Query, minimum = 1, description = "Page size (`api.default_page_size` when absent)"),
           ("cursor" = Option<String>, Query, pattern = "^[0-9]{1,16}_[0-9a-f]{32}$", description = "`next_cursor` of the previous page")),
    responses((status = 200, description = "A page of runs, newest first", body = view::RunPage)))]
pub async fn list_runs(
    State(state): State<AppState>,
    Caller(caller): Caller,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<view::RunPage>, ApiError> {
    let api = &state.settings.api;
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(
            RunStatus::parse(s)
                .ok_or_else(|| ApiError::invalid("status", format!("unknown status `{s}`")))?,
        ),
    };
    let thread_id = optional_uuid("thread_id", q.thread_id.as_deref())?;
    let batch_id = optional_uuid("batch_id", q.batch_id.as_deref())?;
    let limit = validate::page_limit(q.limit.as_deref(), api.default_page_size, api.max_page_size)?;
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => Some(decode(c).ok_or_else(|| ApiError::invalid("cursor", "malformed cursor"))?),
    };
    let filter = ListFilter {
        tenant: caller.tenant_id,
        status,
        thread_id,
        batch_id,
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
    Ok(Json(view::RunPage {
        data: rows.iter().map(view::run).collect(),
        next_cursor,
    }))
}

pub fn optional_uuid(field: &str, raw: Option<&str>) -> Result<Option<uuid::Uuid>, ApiError> {
    raw.map(|r| validate::uuid(field, r)).transpose()
}

/// Opaque keyset cursors: `<micros since epoch>_<uuid as 32 lowercase hex>`, read back only in
/// exactly that form (the pattern the OpenAPI document gives).
pub const CURSOR_PATTERN: &str = "^[0-9]{1,16}_[0-9a-f]{32}$";

/// Also the cursor of `GET /v1/webhooks/{id}/deliveries`.
pub mod cursor {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    pub fn encode(at: DateTime<Utc>, id: Uuid) -> String {
        format!("{}_{}", at.timestamp_micros(), id.simple())
    }

    pub fn decode(raw: &str) -> Option<(DateTime<Utc>, Uuid)> {
        let (micros, id) = raw.split_once('_')?;
        let micros_ok =
            (1..=16).contains(&micros.len()) && micros.bytes().all(|b| b.is_ascii_digit());
        let id_ok = id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !(micros_ok && id_ok) {
            return None;
        }
        let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        Some((at, Uuid::try_parse(id).ok()?))
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn cursors_round_trip_and_only_their_own_form_is_read() {
            let at = chrono::DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
            let id = uuid::Uuid::now_v7();
            let c = super::encode(at, id);
            assert_eq!(super::decode(&c), Some((at, id)));
            for bad in [
                "",
                "_",
                "1_",
                "-1_0123456789abcdef0123456789abcdef",
                "1_0123456789ABCDEF0123456789ABCDEF",
                "12345678901234567_0123456789abcdef0123456789abcdef",
                "1_01234567-89ab-cdef-0123-456789abcdef",
            ] {
                assert_eq!(super::decode(bad), None, "{bad}");
            }
        }
    }
}
