//! Driving batches (`POST /v1/batches`) after the answer: creating their runs in chunks,
//! cancelling them, and finishing them. See `store::batches` for the tables and
//! docs/architecture.md ("Batches") for why.
//!
//! - **A driver** holds a batch's lease (`batches.lease_owner`, a token of its own) and does
//!   what the batch's status says: `creating` → the next chunk of runs, `cancelling` → the next
//!   chunk of cancels. Each chunk first locks the batch row and renews the lease, so chunks
//!   and a cancel are serialized and a driver that lost its lease stops.
//! - **The sweep** (every replica, `api.batch_sweep_interval_ms`) takes over batches whose
//!   lease expired (their replica died mid-way) and finishes batches none of whose runs is
//!   active: one short statement per unfinished batch, nothing on the path of a run.
//!   `started_at` is recorded by the first read whose counts show a run past `queued` (and
//!   by the finish), not by the sweep: a backlog that has not started costs it nothing.

use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::{Acquire, PgConnection};
use uuid::Uuid;

use agentfleet_shared::domain::AgentSpec;
use agentfleet_shared::store::batches::{self, BatchRow, Held};
use agentfleet_shared::store::runs::RunRow;
use agentfleet_shared::store::transitions::{self, Cancelled, NewRun};
use agentfleet_shared::store::{StoreError, create_many, webhooks};

use crate::state::AppState;

/// Cancels of one batch in flight at once (each is its own short transaction).
const CANCELS_IN_FLIGHT: usize = 4;
/// Batches one sweep takes over at most.
const TAKE_OVER_PER_SWEEP: i64 = 16;
/// Unfinished batches one sweep looks at at most (oldest first).
const SWEEP_BATCHES: i64 = 1000;

/// A new lease token: unique per driver, so a driver that stalled past its lease is refused
/// even by its own process's new driver.
pub fn new_owner() -> String {
    format!(
        "api-{}-{}",
        std::process::id(),
        &Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A stored item request: the fields of `POST /v1/runs` (the route validated them).
#[derive(Deserialize)]
struct StoredRun {
    input: String,
    #[serde(default)]
    thread_id: Option<Uuid>,
    agent: AgentSpec,
    #[serde(default)]
    metadata: Option<Value>,
}

/// Drives `batch` in the background for as long as `owner` holds its lease.
pub fn spawn(state: AppState, batch: Uuid, owner: String) {
    tokio::spawn(async move {
        if let Err(e) = drive(&state, batch, &owner).await {
            // The lease expires and a sweep (here or elsewhere) takes the batch over.
            tracing::warn!(%batch, error = %e, "batch driver stopped; the sweep will take over");
        }
    });
}

async fn drive(state: &AppState, batch: Uuid, owner: &str) -> Result<(), StoreError> {
    let api = &state.settings.api;
    loop {
        if state.shutdown.is_cancelled() {
            // Left to the lease: whoever sweeps next takes over.
            return Ok(());
        }
        let mut tx = state.pool.begin().await?;
        let Some(held) = batches::renew(&mut tx, batch, owner, api.batch_lease_ms).await? else {
            return Ok(());
        };
        match held.status.as_str() {
            "creating" if held.suspended => {
                // Nothing of a suspended tenant starts. The driver stops and its lease runs
                // out; each take-over (one per `api.batch_lease_ms`) looks again.
                tx.commit().await?;
                tracing::info!(%batch, "tenant suspended: batch creation paused");
                return Ok(());
            }
            "creating" => {
                let chunk = match create_chunk(state, &mut tx, batch, &held).await {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        drop(tx); // rolled back
                        give_up_if_failing(state, batch, owner).await?;
                        return Err(e);
                    }
                };
                tx.commit().await?;
                agentfleet_shared::failpoint::hit("batch_after_chunk");
                metrics::counter!("agentfleet_runs_created_total")
                    .increment(chunk.created.len() as u64);
                crate::announce::announce_all(state, &chunk.created, held.fair).await;
                if chunk.done {
                    return Ok(());
                }
            }
            "cancelling" => {
                tx.commit().await?;
                let ids =
                    batches::active_runs(&state.pool, batch, api.batch_chunk_size as i64).await?;
                if ids.is_empty() {
                    finish(state, batch).await?;
                    return Ok(());
                }
                let failed = cancel_runs(state, held.tenant_id, &ids).await;
                if held.fair || state.settings.fair_share.share().is_some() {
                    // The cancelled runs' places in the tenant's window are free.
                    crate::fair_dispatch::dispatch_and_publish(state, held.tenant_id).await;
                }
                if failed == ids.len() {
                    // Not one went through: no tight loop. The lease runs out and a sweep
                    // tries again (one attempt per `api.batch_lease_ms`).
                    return Ok(());
                }
            }
            _ => {
                tx.commit().await?;
                return Ok(());
            }
        }
    }
}

/// Counts the chunk that just failed; once `api.batch_max_chunk_failures` have failed in a
/// row, the items still without a run get an `internal_error` and the batch moves on (its
/// runs made so far go on; the sweep finishes it when they end).
async fn give_up_if_failing(state: &AppState, batch: Uuid, owner: &str) -> Result<(), StoreError> {
    let max = state.settings.api.batch_max_chunk_failures as i32;
    let Some(failures) = batches::chunk_failed(&state.pool, batch, owner).await? else {
        return Ok(());
    };
    if failures < max {
        return Ok(());
    }
    let mut tx = state.pool.begin().await?;
    let lease = state.settings.api.batch_lease_ms;
    if batches::renew(&mut tx, batch, owner, lease)
        .await?
        .is_none()
    {
        return Ok(());
    }
    let error = json!({"code": "internal_error",
                       "message": "the run could not be created; the batch went on without it"});
    let failed = batches::fail_pending(&mut tx, batch, &error).await?;
    batches::mark_created(&mut tx, batch).await?;
    tx.commit().await?;
    tracing::error!(%batch, failures, items = failed,
        "batch creation kept failing; its remaining items were given an error");
    Ok(())
}

struct Chunk {
    /// The runs made, in item order.
    created: Vec<RunRow>,
    /// No item is left without its run: the batch is now `in_progress`.
    done: bool,
}

/// The next `api.batch_chunk_size` items get their runs, in the caller's transaction (which
/// holds the batch row's lock): runs on new threads in one statement, runs on existing threads
/// one by one (each under a savepoint: a thread that is busy or gone fails that item only).
async fn create_chunk(
    state: &AppState,
    tx: &mut PgConnection,
    batch: Uuid,
    held: &Held,
) -> Result<Chunk, StoreError> {
    if agentfleet_shared::failpoint::error("batch:chunk") {
        return Err(StoreError::Db(sqlx::Error::Protocol(
            "failpoint batch:chunk".into(),
        )));
    }
    let limit = state.settings.api.batch_chunk_size as i64;
    let items = batches::pending_items(tx, batch, limit).await?;
    let done = (items.len() as i64) < limit;
    let mut positions = Vec::with_capacity(items.len());
    let mut run_ids = Vec::with_capacity(items.len());
    let mut errors = Vec::with_capacity(items.len());
    let mut on_new = Vec::new();
    let mut on_threads = Vec::new();
    for item in items {
        let body = item.body.map(|b| b.0).unwrap_or(Value::Null);
        let hash = Sha256::digest(serde_json::to_vec(&body).expect("serializes")).to_vec();
        match serde_json::from_value::<StoredRun>(body) {
            Ok(run) => {
                let new = NewRun {
                    id: Uuid::now_v7(),
                    tenant_id: held.tenant_id,
                    thread_id: run.thread_id,
                    max_iterations: run
                        .agent
                        .max_iterations
                        .unwrap_or(state.settings.worker.default_max_iterations),
                    metadata: run.metadata.unwrap_or_else(|| json!({})),
                    idempotency_key: None,
                    request_hash: Some(hash),
                    input: run.input,
                    agent: run.agent,
                    fair: held.fair,
                    share: state.settings.fair_share.share(),
                    traceparent: held.traceparent.clone(),
                };
                if new.thread_id.is_some() {
                    on_threads.push((item.position, new));
                } else {
                    on_new.push((item.position, new));
                }
            }
            Err(e) => {
                // Validated when submitted; only a stored body from another version lands here.
                tracing::error!(%batch, position = item.position, error = %e, "stored batch item unreadable");
                positions.push(item.position);
                run_ids.push(None);
                errors.push(Some(
                    json!({"code": "invalid_request", "message": "the item could not be read"}),
                ));
            }
        }
    }
    let mut created: Vec<(i32, RunRow)> = Vec::new();
    for (position, new) in on_threads {
        let thread = new.thread_id;
        let mut savepoint = tx.begin().await?;
        let error = match transitions::create(&mut savepoint, new).await {
            Ok(row) => {
                batches::adopt_runs(&mut savepoint, batch, &[row.id]).await?;
                savepoint.commit().await?;
                positions.push(position);
                run_ids.push(Some(row.id));
                errors.push(None);
                created.push((position, row));
                continue;
            }
            Err(StoreError::NotFound) => {
                json!({"code": "not_found", "message": format!("thread {} not found", thread.unwrap_or_default())})
            }
            Err(StoreError::ThreadBusy { thread_id, .. }) => {
                json!({"code": "thread_busy", "message": format!("thread {thread_id} already has an active run")})
            }
            Err(e) => return Err(e),
        };
        savepoint.rollback().await?;
        positions.push(position);
        run_ids.push(None);
        errors.push(Some(error));
    }
    let (new_at, new_runs): (Vec<i32>, Vec<NewRun>) = on_new.into_iter().unzip();
    let rows = create_many::create_on_new_threads_in(&mut *tx, &new_runs, Some(batch)).await?;
    for (position, row) in new_at.into_iter().zip(rows) {
        positions.push(position);
        run_ids.push(Some(row.id));
        errors.push(None);
        created.push((position, row));
    }
    batches::set_outcomes(tx, batch, &positions, &run_ids, &errors).await?;
    batches::chunk_succeeded(tx, batch).await?;
    if done {
        batches::mark_created(tx, batch).await?;
    }
    created.sort_unstable_by_key(|(p, _)| *p);
    Ok(Chunk {
        created: created.into_iter().map(|(_, r)| r).collect(),
        done,
    })
}

/// Cancels runs as `POST /v1/runs/{id}/cancel` does (the same events and hints), a few at once.
/// A run that ended meanwhile is left as it is. Returns how many could not be cancelled.
async fn cancel_runs(state: &AppState, tenant: Uuid, ids: &[Uuid]) -> usize {
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let failed_ref = &failed;
    futures_util::stream::iter(ids.iter().copied())
        .for_each_concurrent(CANCELS_IN_FLIGHT, |id| async move {
            match transitions::cancel(&state.pool, tenant, id).await {
                Ok(Cancelled::Now {
                    previous,
                    thread_id,
                    last_event_id,
                    ..
                }) => {
                    crate::announce::cancelled(state, id, thread_id, previous, None, last_event_id).await;
                }
                Ok(Cancelled::Already) | Err(StoreError::WrongStatus { .. }) => {}
                Err(e) => {
                    failed_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(run_id = %id, error = %e, "cancelling a batch's run failed; retried next chunk");
                }
            }
        })
        .await;
    failed.into_inner()
}

/// Finishes the batch if none of its runs is active; exactly one caller finishes it.
pub async fn finish(state: &AppState, batch: Uuid) -> Result<Option<BatchRow>, StoreError> {
    let mut tx = state.pool.begin().await?;
    let finished = batches::finish(&mut tx, batch).await?;
    if let Some(row) = &finished {
        finished_hook(&mut tx, row).await?;
    }
    tx.commit().await?;
    Ok(finished)
}

/// Runs inside the transaction that finished `batch` (status `completed` or `cancelled`,
/// `finished_at` set), exactly once per batch whichever replica finishes it: the
/// `batch.completed` webhook deliveries (the batch's view, as `GET /v1/batches/{id}` shows it)
/// commit together with the status change or not at all.
pub async fn finished_hook(tx: &mut PgConnection, batch: &BatchRow) -> Result<(), StoreError> {
    metrics::counter!("agentfleet_batches_finished_total", "status" => batch.status.clone())
        .increment(1);
    let counts = batches::counts(&mut *tx, batch.id).await?;
    let data = serde_json::to_value(crate::routes::view::batch(batch, &counts))
        .expect("a batch view serializes");
    webhooks::enqueue(tx, batch.tenant_id, "batch.completed", data).await?;
    Ok(())
}

/// The periodic sweep of this replica, until the server stops.
pub fn spawn_sweeper(state: AppState) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(
            state.settings.api.batch_sweep_interval_ms.get(),
        ));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = sweep(&state).await {
                        tracing::warn!(error = %e, "batch sweep failed; retried next tick");
                    }
                }
                _ = state.shutdown.cancelled() => break,
            }
        }
    });
}

/// One sweep: take over orphaned batches, finish what has ended.
pub async fn sweep(state: &AppState) -> Result<(), StoreError> {
    let owner = new_owner();
    let api = &state.settings.api;
    for batch in
        batches::take_over(&state.pool, &owner, api.batch_lease_ms, TAKE_OVER_PER_SWEEP).await?
    {
        tracing::info!(%batch, "taking over a batch whose driver's lease expired");
        spawn(state.clone(), batch, owner.clone());
    }
    for batch in batches::unfinished(&state.pool, SWEEP_BATCHES).await? {
        if matches!(batch.status.as_str(), "in_progress" | "cancelling") {
            finish(state, batch.id).await?;
        }
    }
    Ok(())
}
