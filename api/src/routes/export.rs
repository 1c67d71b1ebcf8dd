//! `GET /v1/export`: everything of the key's tenant a portability request asks for (its
//! threads, runs, messages and tool calls) as JSON lines, streamed page by page
//! (`store::export`: keyset pages of `export.page_size` rows), so an export of any size holds one
//! page in memory, and is read as fast as the client reads it.
//!
//! The lines come a page of threads at a time: the threads' lines, then their runs', then the
//! runs' tool calls', then the threads' messages', then the next page of threads. The last line
//! is `{"type": "end", ...}` with what was sent of each kind: an export cut short (the
//! connection, or a failure the status line can no longer report) has none.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use agentfleet_shared::domain::{Risk, ToolCallStatus};
use agentfleet_shared::store::export::{
    self, MessageCursor, RunCursor, ThreadCursor, ToolCallCursor,
};
use agentfleet_shared::store::tool_calls::ToolCallRow;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::QueryParams;
use crate::routes::view;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/export", tag = "export", operation_id = "export",
    responses((status = 200, description = "The tenant's threads, runs, messages and tool calls, one JSON object per line, each with its `type`: `thread` (`id`, `created_at`), `run` (as `GET /v1/runs/{id}` answers it, with `queued_input` while it waits for its thread), `tool_call` (`id`, `run_id`, `tool_call_id`, `iteration`, `position`, `name`, `raw_arguments`, `arguments`, `risk`, `status`, `result`, `error`, `dispatch_count`, `decided_by`, `decided_at`, `decision_reason`, `created_at`, `started_at`, `finished_at`), `message` (as `GET /v1/threads/{id}/messages` answers it, with `thread_id`); a page of threads at a time (their lines, their runs, the runs' tool calls, the threads' messages). The last line is `{\"type\": \"end\", \"threads\", \"runs\", \"tool_calls\", \"messages\"}`, the lines sent of each: an export without it was cut short", body = String, content_type = "application/x-ndjson")))]
pub async fn export(
    State(state): State<AppState>,
    Caller(caller): Caller,
    QueryParams(_): QueryParams<ExportQuery>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_id;
    let limit = i64::from(state.settings.export.page_size);
    let pages = futures_util::stream::unfold(
        Some(Export {
            stage: Stage::Threads(None),
            sent: Sent::default(),
        }),
        move |export| {
            let state = state.clone();
            async move {
                let mut export = export?;
                match export.next_page(&state, tenant, limit).await {
                    Ok(Some(bytes)) => {
                        Some((Ok::<_, std::io::Error>(Bytes::from(bytes)), Some(export)))
                    }
                    Ok(None) => None,
                    Err(e) => {
                        // The status line is sent already: the body is cut short, without the
                        // `end` line.
                        tracing::warn!(%tenant, error = %e, "export cut short");
                        Some((Err(std::io::Error::other("export cut short")), None))
                    }
                }
            }
        },
    );
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(pages),
    )
        .into_response())
}

/// No parameter: an unknown one is refused (422 naming it), as everywhere.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportQuery {}

/// Where an export is.
struct Export {
    stage: Stage,
    sent: Sent,
}

/// A page of threads: their ids, and where the next page starts (`None`: it is the last).
#[derive(Clone)]
struct Page {
    threads: Arc<Vec<Uuid>>,
    next: Option<ThreadCursor>,
}

enum Stage {
    Threads(ThreadCursor),
    Runs(Page, RunCursor),
    ToolCalls(Page, ToolCallCursor),
    Messages(Page, MessageCursor),
    End,
    Done,
}

/// Lines sent of each kind (the `end` line).
#[derive(Default, Serialize)]
struct Sent {
    threads: u64,
    runs: u64,
    tool_calls: u64,
    messages: u64,
}

/// One line: its `type`, then the item's fields.
#[derive(Serialize)]
struct Line<T> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    item: T,
}

#[derive(Serialize)]
struct ThreadLine {
    id: Uuid,
    created_at: DateTime<Utc>,
}

#[derive(Serialize)]
struct RunLine {
    #[serde(flatten)]
    run: view::Run,
    /// The user message of a run waiting for its thread (joins the thread when it starts).
    queued_input: Option<Value>,
}

#[derive(Serialize)]
struct MessageLine {
    thread_id: Uuid,
    #[serde(flatten)]
    message: view::Message,
}

#[derive(Serialize)]
struct ToolCallLine {
    id: Uuid,
    run_id: Uuid,
    tool_call_id: String,
    iteration: i32,
    position: i32,
    name: String,
    raw_arguments: String,
    arguments: Option<Value>,
    risk: Risk,
    status: ToolCallStatus,
    result: Option<Value>,
    error: Option<String>,
    dispatch_count: i32,
    decided_by: Option<Uuid>,
    decided_at: Option<DateTime<Utc>>,
    decision_reason: Option<String>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

impl From<ToolCallRow> for ToolCallLine {
    fn from(c: ToolCallRow) -> ToolCallLine {
        ToolCallLine {
            id: c.id,
            run_id: c.run_id,
            tool_call_id: c.tool_call_id,
            iteration: c.iteration,
            position: c.position,
            name: c.name,
            raw_arguments: c.raw_arguments,
            arguments: c.arguments.map(|a| a.0),
            risk: c.risk,
            status: c.status,
            result: c.result.map(|r| r.0),
            error: c.error,
            dispatch_count: c.dispatch_count,
            decided_by: c.decided_by,
            decided_at: c.decided_at,
            decision_reason: c.decision_reason,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
        }
    }
}

fn write_line<T: Serialize>(out: &mut Vec<u8>, kind: &'static str, item: T) {
    serde_json::to_writer(&mut *out, &Line { kind, item }).expect("an export line serializes");
    out.push(b'\n');
}

impl Export {
    /// The next page's lines: one query's rows. `None` once everything was sent.
    async fn next_page(
        &mut self,
        state: &AppState,
        tenant: Uuid,
        limit: i64,
    ) -> Result<Option<Vec<u8>>, agentfleet_shared::store::StoreError> {
        let pool = &state.pool;
        let mut out = Vec::new();
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        self.stage = match stage {
            Stage::Threads(after) => {
                let rows = export::threads(pool, tenant, after, limit).await?;
                if rows.is_empty() {
                    Stage::End
                } else {
                    let next = (rows.len() as i64 == limit)
                        .then(|| rows.last().map(|t| (t.first_run_at, t.first_run_id)));
                    for t in &rows {
                        write_line(
                            &mut out,
                            "thread",
                            ThreadLine {
                                id: t.id,
                                created_at: t.created_at,
                            },
                        );
                    }
                    self.sent.threads += rows.len() as u64;
                    let threads = Arc::new(rows.iter().map(|t| t.id).collect());
                    Stage::Runs(Page { threads, next }, None)
                }
            }
            Stage::Runs(page, after) => {
                let rows = export::runs(pool, tenant, &page.threads, after, limit).await?;
                let last = rows
                    .last()
                    .map(|r| (r.run.thread_id, r.run.created_at, r.run.id));
                self.sent.runs += rows.len() as u64;
                let full = rows.len() as i64 == limit;
                for r in rows {
                    let line = RunLine {
                        run: view::run(&r.run),
                        queued_input: r.queued_input.map(|q| q.0),
                    };
                    write_line(&mut out, "run", line);
                }
                if full {
                    Stage::Runs(page, last)
                } else {
                    Stage::ToolCalls(page, None)
                }
            }
            Stage::ToolCalls(page, after) => {
                let rows = export::tool_calls(pool, tenant, &page.threads, after, limit).await?;
                let last = rows.last().map(|c| (c.run_id, c.iteration, c.position));
                self.sent.tool_calls += rows.len() as u64;
                let full = rows.len() as i64 == limit;
                for c in rows {
                    write_line(&mut out, "tool_call", ToolCallLine::from(c));
                }
                if full {
                    Stage::ToolCalls(page, last)
                } else {
                    Stage::Messages(page, None)
                }
            }
            Stage::Messages(page, after) => {
                let rows = export::messages(pool, tenant, &page.threads, after, limit).await?;
                let last = rows.last().map(|m| (m.thread_id, m.message.id));
                self.sent.messages += rows.len() as u64;
                let full = rows.len() as i64 == limit;
                for m in &rows {
                    let line = MessageLine {
                        thread_id: m.thread_id,
                        message: view::Message::from(&m.message),
                    };
                    write_line(&mut out, "message", line);
                }
                if full {
                    Stage::Messages(page, last)
                } else {
                    match page.next {
                        Some(next) => Stage::Threads(next),
                        None => Stage::End,
                    }
                }
            }
            Stage::End => {
                write_line(&mut out, "end", &self.sent);
                Stage::Done
            }
            Stage::Done => return Ok(None),
        };
        Ok(Some(out))
    }
}
