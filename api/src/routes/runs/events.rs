//! `GET /v1/runs/{id}/events`: Server-Sent Events. Replays from `Last-Event-ID` (or
//! `?after=N`), then follows live events without gap or duplicate, and ends after a pausing or
//! terminal event. Authorized by the API key, or by a short-lived stream token (`?token=`) for
//! browsers, whose `EventSource` cannot send headers.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use agentfleet_shared::store::{StoreError, runs};

use crate::auth::caller::StreamTenant;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::extract::QueryParams;
use crate::state::AppState;
use crate::stream::follow::{Follower, Mode};
use crate::stream::slots::StreamSlot;
use crate::validate;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    pub after: Option<String>,
    /// Verified before the handler by `require_key_or_stream_token`; named here so that it is
    /// not an unknown parameter.
    #[serde(rename = "token")]
    pub _token: Option<String>,
}

#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "events", operation_id = "run_events",
    params(("id" = uuid::Uuid, Path, description = "The run"),
           ("after" = Option<u64>, Query, minimum = 0, maximum = 999_999_999_999_999_999_i64, description = "Replay events after this id (`Last-Event-ID` wins)"),
           ("token" = Option<String>, Query, description = "A stream token for this run, instead of the API key (browsers)"),
           ("Last-Event-ID" = Option<String>, Header, nullable = false, pattern = "^[0-9]{1,18}$", description = "The last event id the client has")),
    responses((status = 200, description = "Server-Sent Events; see docs/events.md", body = inline(crate::routes::sse::RunEvent), content_type = "text/event-stream"),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody)),
    security(("bearer" = []), ("stream_token" = [])))]
pub async fn run_events(
    State(state): State<AppState>,
    StreamTenant(tenant): StreamTenant,
    PathId(id): PathId,
    QueryParams(q): QueryParams<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let run_id = id;
    // Both are checked; `Last-Event-ID` (a reconnecting `EventSource`) wins over `after`.
    let after = validate::non_negative("after", q.after.as_deref())?;
    let after = match last_event_id(&headers)? {
        Some(v) => validate::non_negative("Last-Event-ID", Some(&v))?,
        None => after,
    }
    .unwrap_or(0);
    // Taken before the run is read, so an end after the read arrives live.
    let subscription = state.hub.subscribe(run_id);
    let status = match runs::get_for_tenant(&state.pool, tenant, run_id).await {
        Ok(run) => run.status,
        Err(StoreError::NotFound) => return Err(ApiError::not_found("run")),
        Err(e) => return Err(ApiError::unexpected(e)),
    };
    let (tx, rx) = channel(&state, tenant)?;
    let response = sse(rx, &state);
    tokio::spawn(async move {
        let mut follower = Follower::new(&state, &tx, run_id, after, Mode::Run);
        if let Err(e) = follower.follow(subscription, Some(status)).await {
            tracing::debug!(%run_id, error = %e, "event stream ended early");
        }
    });
    Ok(response)
}

pub fn last_event_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("last-event-id") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim().to_owned()))
            .map_err(|_| ApiError::invalid("Last-Event-ID", "must be visible ASCII")),
    }
}

/// The per-client channel, starting with the reconnection hint.
pub fn channel(state: &AppState, tenant: Uuid) -> Result<(mpsc::Sender<Event>, Opened), ApiError> {
    let slot = state
        .streams
        .take(tenant, state.settings.api.max_streams_per_tenant)?;
    let (tx, rx) = mpsc::channel::<Event>(64);
    let retry = Duration::from_millis(state.settings.events.sse_retry_ms);
    let _ = tx.try_send(Event::default().retry(retry).comment("stream"));
    metrics::counter!("agentfleet_sse_streams_total").increment(1);
    Ok((tx, Opened { rx, slot }))
}

/// A stream's receiving end and its tenant's place (`api.max_streams_per_tenant`), held by
/// the response body: the place is free again when the client leaves or the stream ends.
pub struct Opened {
    rx: mpsc::Receiver<Event>,
    slot: StreamSlot,
}

/// The SSE response over a client's channel, with the keep-alive comment at the configured
/// interval (proxies close idle connections).
pub fn sse(
    opened: Opened,
    state: &AppState,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let Opened { rx, slot } = opened;
    let stream = futures_util::stream::unfold((rx, slot), |(mut rx, slot)| async move {
        rx.recv()
            .await
            .map(|ev| (Ok::<_, Infallible>(ev), (rx, slot)))
    });
    let every = Duration::from_secs(state.settings.events.keepalive_secs.max(1));
    Sse::new(stream).keep_alive(KeepAlive::new().interval(every).text("keep-alive"))
}
