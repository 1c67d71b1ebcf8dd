//! `GET /v1/batches/{id}/results`: one JSON line per item, in submission order, streamed page
//! by page (keyset on the item's position, `RESULTS_PAGE` rows per query), so a batch of
//! 100,000 never sits in memory: at most one page does.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use agentfleet_shared::store::batches::{self, ResultRow};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::extract::QueryParams;
use crate::state::AppState;

/// Items read per query.
const RESULTS_PAGE: i64 = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsQuery {
    status: Option<String>,
}

/// The `status` filter of the results (the only one).
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ResultsFilter {
    Finished,
}

#[utoipa::path(get, path = "/v1/batches/{id}/results", tag = "batches", operation_id = "batch_results",
    params(("id" = uuid::Uuid, Path, description = "The batch"),
           ("status" = Option<ResultsFilter>, Query, description = "`finished`: only items whose run ended (or that could get none)")),
    responses((status = 200, description = "One JSON object per line, in submission order: `{\"custom_id\", \"run_id\", \"status\", \"output\", \"error\"}`. `status` is the run's, or `pending` (no run yet), `cancelled` (never created: the batch was cancelled), `failed` (no run could be made: `error` says why); `output` is the final answer of a completed run", body = String, content_type = "application/x-ndjson"),
              (status = 404, description = "No batch of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn batch_results(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    QueryParams(q): QueryParams<ResultsQuery>,
) -> Result<Response, ApiError> {
    let finished_only = match q.status.as_deref() {
        None => false,
        Some("finished") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "status",
                format!("must be `finished`, not `{other}`"),
            ));
        }
    };
    let batch = crate::routes::batches::get::load(&state, caller.tenant_id, id).await?;
    let cancelled = batch.is_cancelled();
    // The state is the next position to read after; `None` once the last page was sent.
    let pages = futures_util::stream::unfold(Some(-1), move |after| {
        let state = state.clone();
        async move {
            let after = after?;
            match batches::results_page(&state.pool, id, after, RESULTS_PAGE).await {
                Ok(rows) if rows.is_empty() => None,
                Ok(rows) => {
                    let next = if (rows.len() as i64) < RESULTS_PAGE {
                        None
                    } else {
                        rows.last().map(|r| r.position)
                    };
                    let mut out = Vec::with_capacity(rows.len() * 128);
                    for row in &rows {
                        let line = line(row, cancelled);
                        if finished_only && !is_finished(&line) {
                            continue;
                        }
                        serde_json::to_writer(&mut out, &line).expect("serializes");
                        out.push(b'\n');
                    }
                    Some((Ok::<_, std::io::Error>(Bytes::from(out)), next))
                }
                Err(e) => {
                    // The status line is sent already: the stream is cut short, which a client
                    // sees as a truncated body (no final newline, fewer lines than `total`).
                    tracing::warn!(batch = %id, error = %e, "batch results cut short");
                    Some((Err(std::io::Error::other("results cut short")), None))
                }
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(pages),
    )
        .into_response())
}

/// One item's line.
fn line(row: &ResultRow, cancelled: bool) -> Value {
    let status = match (&row.status, &row.item_error) {
        (Some(s), _) => s.as_str(),
        (None, Some(_)) => "failed",
        (None, None) if cancelled => "cancelled",
        (None, None) => "pending",
    };
    let error = row
        .error
        .as_ref()
        .or(row.item_error.as_ref())
        .map(|e| json!({"code": e.0["code"], "message": e.0["message"]}));
    json!({
        "custom_id": row.custom_id,
        "run_id": row.run_id,
        "status": status,
        "output": row.answer.as_ref().and_then(|m| final_answer(&m.0)),
        "error": error,
    })
}

fn is_finished(line: &Value) -> bool {
    matches!(
        line["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// The final answer in a run's last assistant message: its text, or, when it has none, the
/// `summary` the model gave the built-in `complete` tool.
pub fn final_answer(message: &Value) -> Option<String> {
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        return Some(text.to_owned());
    }
    message["tool_calls"]
        .as_array()?
        .iter()
        .find(|c| c["function"]["name"] == "complete")
        .and_then(|c| {
            let args = &c["function"]["arguments"];
            let parsed: Value = match args {
                Value::String(s) => serde_json::from_str(s).ok()?,
                other => other.clone(),
            };
            parsed["summary"].as_str().map(str::to_owned)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_answer_is_the_text_or_the_complete_summary() {
        assert_eq!(
            final_answer(&json!({"role": "assistant", "content": "42"})).as_deref(),
            Some("42")
        );
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "complete", "arguments": "{\"summary\": \"done\"}"}}]});
        assert_eq!(final_answer(&call).as_deref(), Some("done"));
        assert_eq!(
            final_answer(&json!({"role": "assistant", "content": ""})),
            None
        );
    }
}
