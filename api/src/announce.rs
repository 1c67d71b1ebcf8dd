//! What the API tells Redis and RabbitMQ after it committed a run's change: shared by the run
//! routes and the batch driver (`crate::batch_driver`), which must say the same things.

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::events::{EventType, Expiry, FINAL_FENCE, Floor, NewEvent};
use agentfleet_shared::store::runs::{self, RunRow};

use crate::publish::publish_bounded;
use crate::state::AppState;

/// The data of a run's `run_queued` event (shared with the batch's bulk announce).
pub fn queued_data() -> Value {
    json!({"status": "queued"})
}

/// `announce` for a whole batch: every `run_queued` (event 1 of each run) in one Redis round
/// trip, then every message as one burst on the confirm channel, the confirms awaited
/// together, within the same bound as one run's publish. The runs are already durable, so
/// failures are logged, not returned: the sweeper re-publishes queued runs it finds idle.
pub async fn announce_all(state: &AppState, runs: &[RunRow], limited: bool) {
    let data = queued_data();
    let events: Vec<NewEvent<'_>> = runs
        .iter()
        .map(|run| NewEvent {
            run_id: run.id,
            thread_id: run.thread_id,
            kind: EventType::RunQueued,
            data: &data,
        })
        .collect();
    match state
        .bus
        .append_many(&events, 0, Floor::Exact(0), Expiry::Persist)
        .await
    {
        Ok(outcomes) => {
            for (run, outcome) in runs.iter().zip(outcomes) {
                if let Err(e) = outcome {
                    tracing::warn!(run_id = %run.id, error = %e, "could not append run_queued");
                }
            }
        }
        Err(e) => {
            tracing::warn!(runs = runs.len(), error = %e, "could not append run_queued for a batch");
        }
    }
    // The runs inside their tenant's window go out at once; past it, they wait held. Held by a
    // running limit (`limited`), what fits it is dispatched now, oldest first; held by the fair
    // share, the window was full and the runs in flight dispatch them as they end.
    let ids: Vec<Uuid> = runs.iter().filter(|r| !r.held).map(|r| r.id).collect();
    if !ids.is_empty() {
        publish_bounded(state, &ids).await;
    }
    if limited && let Some(held) = runs.iter().find(|r| r.held) {
        crate::fair_dispatch::dispatch_and_publish(state, held.tenant_id).await;
    }
}

/// After `transitions::cancel` moved a run to `cancelled`: `run_cancelled` (with the final
/// fence, so nothing follows it) and the hint that stops its worker at once. `error`: the one
/// the cancel recorded (a newer message's interrupt), which the event repeats.
pub async fn cancelled(
    state: &AppState,
    id: Uuid,
    thread_id: Uuid,
    previous: RunStatus,
    error: Option<&Value>,
    last_event_id: i64,
) {
    cancelled_on(
        &state.pool,
        &state.bus,
        id,
        thread_id,
        previous,
        error,
        last_event_id,
    )
    .await;
}

/// [`cancelled`] on a pool and a bus of the caller's (an erasure driven by the CLI has no
/// `AppState`).
pub async fn cancelled_on(
    pool: &sqlx::PgPool,
    bus: &agentfleet_shared::events::EventBus,
    id: Uuid,
    thread_id: Uuid,
    previous: RunStatus,
    error: Option<&Value>,
    last_event_id: i64,
) {
    metrics::counter!("agentfleet_runs_total", "status" => "cancelled").increment(1);
    // The final fence shuts the stream to the worker: nothing follows run_cancelled.
    let data = agentfleet_shared::events::cancelled_data(Some(previous), error);
    let event = NewEvent {
        run_id: id,
        thread_id,
        kind: EventType::RunCancelled,
        data: &data,
    };
    // Ids continue past every one handed out, whether or not Redis still has the list;
    // the id of `run_cancelled` is recorded so a stream rebuilt later ends with it.
    let listed = bus.len(id).await.unwrap_or(0);
    let floor = Floor::Recorded((last_event_id as u64).max(listed));
    match bus.append(event, FINAL_FENCE, floor, Expiry::Expire).await {
        Ok(appended) => {
            if let Err(e) = runs::record_last_event_id(pool, id, appended.id).await {
                tracing::warn!(run_id = %id, error = %e, "could not record run_cancelled's id");
            }
        }
        Err(e) => tracing::warn!(run_id = %id, error = %e, "could not append run_cancelled"),
    }
    if let Err(e) = bus.send_control(id, "cancel").await {
        tracing::warn!(run_id = %id, error = %e, "could not hint the worker; its lease renewal will see the cancel");
    }
}
