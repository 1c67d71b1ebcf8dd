//! `GET /v1/threads/{id}/events`: one connection for a chat UI. Follows the thread's runs one
//! after another: each run's events through its pauses to its end, then the next run as soon
//! as it is queued (the hub wakes the stream on its `run_queued`). SSE ids are
//! `<run_id>:<event id>`, so `Last-Event-ID` resumes exactly.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use futures_util::Stream;
use tokio::sync::mpsc;
use uuid::Uuid;

use agentfleet_shared::store::runs;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::runs::events::{channel, last_event_id, sse};
use crate::state::AppState;
use crate::stream::follow::{FollowError, Follower, Mode};
use crate::validate;

#[utoipa::path(get, path = "/v1/threads/{id}/events", tag = "events", operation_id = "thread_events",
    params(("id" = uuid::Uuid, Path, description = "The thread"), ("Last-Event-ID" = Option<String>, Header, nullable = false, pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}:[0-9]{1,18}$", description = "`<run_id>:<event id>`")),
    responses((status = 200, description = "Server-Sent Events of the thread's runs, one after another", body = inline(crate::routes::sse::ThreadEvent), content_type = "text/event-stream"),
              (status = 404, description = "No thread of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn thread_events(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let thread = id;
    if !runs::thread_belongs_to(&state.pool, caller.tenant_id, thread)
        .await
        .map_err(ApiError::unexpected)?
    {
        return Err(ApiError::not_found("thread"));
    }
    let start = match last_event_id(&headers)? {
        None => None,
        Some(v) => {
            let parsed = v.split_once(':').and_then(|(r, n)| {
                let n = validate::non_negative("Last-Event-ID", Some(n)).ok()??;
                Some((validate::parse_uuid(r)?, n))
            });
            Some(parsed.ok_or_else(|| {
                ApiError::invalid("Last-Event-ID", "must be `<run_id>:<event id>`")
            })?)
        }
    };
    let (tx, rx) = channel(&state, caller.tenant_id)?;
    let response = sse(rx, &state);
    tokio::spawn(async move {
        if let Err(e) = follow_thread(&state, caller.tenant_id, thread, start, &tx).await {
            tracing::debug!(%thread, error = %e, "thread stream ended");
        }
    });
    Ok(response)
}

/// Runs listed at a time; past a page, the stream lists again from where it got to.
const PAGE: i64 = 100;

async fn follow_thread(
    state: &AppState,
    tenant: Uuid,
    thread: Uuid,
    mut current: Option<(Uuid, u64)>,
    tx: &mpsc::Sender<Event>,
) -> Result<(), FollowError> {
    // Watch before the first look, so no run queued after it goes unnoticed.
    let mut watch = state.hub.watch_thread(thread);
    let recheck = Duration::from_millis(state.settings.events.thread_recheck_ms);
    loop {
        watch.clear();
        // From the run the stream is at: a long thread costs a page, not its whole history.
        let from = current.map(|(run, _)| run);
        let pending = runs::thread_runs_from(&state.pool, tenant, thread, from, PAGE).await?;
        let mut progressed = false;
        for run in pending {
            let after = current
                .filter(|(r, _)| *r == run)
                .map(|(_, n)| n)
                .unwrap_or(0);
            let sub = state.hub.subscribe(run);
            let mut follower = Follower::new(state, tx, run, after, Mode::Thread);
            follower.follow(sub, None).await?;
            if current != Some((run, follower.last)) {
                progressed = true;
            }
            current = Some((run, follower.last));
        }
        if progressed {
            continue;
        }
        // Wait for the thread's next run: its `run_queued` wakes us; the recheck only covers an
        // event that never reached Redis.
        tokio::select! {
            _ = watch.woken() => {}
            _ = tokio::time::sleep(recheck) => {}
            _ = tx.closed() => return Err(FollowError::ClientGone),
            _ = state.shutdown.cancelled() => return Err(FollowError::Shutdown),
        }
    }
}
