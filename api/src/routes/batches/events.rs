//! `GET /v1/batches/{id}/events`: Server-Sent Events of a batch's progress. `progress` (data:
//! the batch) when the counts or status changed, looked at every
//! `api.batch_progress_interval_ms` (one counts query per stream and interval); then
//! `batch_completed` (data: the batch) once it is `completed` or `cancelled`, and the stream
//! ends. The first event is always the batch as it stands.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use futures_util::Stream;
use tokio::sync::mpsc;
use uuid::Uuid;

use agentfleet_shared::store::batches;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::runs::events::{channel, sse};
use crate::routes::view;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/batches/{id}/events", tag = "batches", operation_id = "batch_events",
    params(("id" = uuid::Uuid, Path, description = "The batch")),
    responses((status = 200, description = "Server-Sent Events: `progress` (data: the batch) when its counts change, then `batch_completed` (data: the batch), after which the stream ends", body = inline(crate::routes::sse::BatchEvent), content_type = "text/event-stream"),
              (status = 404, description = "No batch of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn batch_events(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let row = crate::routes::batches::get::load(&state, caller.tenant_id, id).await?;
    let first = crate::routes::batches::get::view_of(&state, row).await?;
    let (tx, rx) = channel(&state, caller.tenant_id)?;
    let response = sse(rx, &state);
    tokio::spawn(async move {
        follow(&state, caller.tenant_id, id, first, &tx).await;
    });
    Ok(response)
}

async fn follow(
    state: &AppState,
    tenant: Uuid,
    id: Uuid,
    first: view::Batch,
    tx: &mpsc::Sender<Event>,
) {
    let every = Duration::from_millis(state.settings.api.batch_progress_interval_ms.get());
    let mut last: Option<view::Batch> = None;
    let mut current = first;
    loop {
        let finished = matches!(current.status.as_str(), "completed" | "cancelled");
        if last.as_ref() != Some(&current) && !send(tx, "progress", &current).await {
            return;
        }
        if finished {
            let _ = send(tx, "batch_completed", &current).await;
            return;
        }
        last = Some(current);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tx.closed() => return,
            _ = state.shutdown.cancelled() => return,
        }
        let next = match batches::get_for_tenant(&state.pool, tenant, id).await {
            Ok(row) => crate::routes::batches::get::view_of(state, row).await.ok(),
            Err(e) => {
                tracing::debug!(batch = %id, error = %e, "batch progress read failed; retried");
                None
            }
        };
        current = match next {
            Some(v) => v,
            None => last.clone().expect("set above"),
        };
    }
}

/// Sends one event; false once the client is gone.
async fn send(tx: &mpsc::Sender<Event>, kind: &str, batch: &view::Batch) -> bool {
    let data = serde_json::to_string(batch).expect("serializes");
    tx.send(Event::default().event(kind).data(data))
        .await
        .is_ok()
}
