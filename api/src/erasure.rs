//! Driving tenant erasures after the request (`DELETE /admin/v1/tenants/{id}`,
//! `agentfleet-api tenants erase`): cancel the tenant's runs, wait out the grace period, delete
//! its rows and Redis keys step by step, verify, record the proof. See `store::erasure` for the
//! tables and the steps, docs/operations.md ("Erasing a tenant") for the operator's view.
//!
//! - **A driver** holds the erasure's lease (`tenant_erasures.lease_owner`, a token of its
//!   own): the replica that took the request, the CLI with `--wait`, or any replica's sweep.
//!   Each step renews the lease in the step's own transaction and records what it did there,
//!   so a driver that lost its lease stops, and the counts are exact whatever crashes.
//! - **The sweep** (every API replica, every `erasure.interval_ms`) takes an erasure nobody
//!   holds: one not started yet, or one whose driver's lease ran out (it died). The steps find
//!   their rows anew each time, so a take-over continues where the dead driver stopped.
//! - **Runs** are cancelled on the cancel path (`transitions::cancel`, then `run_cancelled`
//!   with the final fence and the hint that stops a worker at once): those waiting for their
//!   thread first, so no cancel promotes one. Nothing is deleted until `erasure.grace_ms`
//!   after the last cancel: by then every replica refuses the tenant's keys and every worker
//!   that held one of its runs has stopped (its late appends would meet the final fence as
//!   long as the fence exists; after the grace there are none).
//! - **Redis keys** are named by the runs and threads read from Postgres just before their rows
//!   go, and deleted before and again after the rows (a key written between the two, by a
//!   stream restoring a lost event from Postgres, goes with the second). Nothing lists keys.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::events::EventBus;
use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::erasure::{self, Progress};
use agentfleet_shared::store::transitions::{self, Cancelled};

use crate::state::AppState;

/// Cancels of one erasure in flight at once (each is its own short transaction).
const CANCELS_IN_FLIGHT: usize = 4;

/// What a driver needs: the database, the event bus (cancels and Redis keys), the settings.
#[derive(Clone)]
pub struct Eraser {
    pool: PgPool,
    bus: EventBus,
    settings: Arc<Settings>,
    shutdown: CancellationToken,
}

/// How a drive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The erasure is done (by this driver or another).
    Done,
    /// Another driver holds it now.
    LostLease,
    /// The process is stopping; the lease was given back.
    Stopped,
}

/// A new lease token: unique per driver, so a driver that stalled past its lease is refused
/// even by its own process's next driver.
pub fn new_owner() -> String {
    format!(
        "erasure-{}-{}",
        std::process::id(),
        &Uuid::new_v4().simple().to_string()[..12]
    )
}

impl Eraser {
    pub fn new(
        pool: PgPool,
        bus: EventBus,
        settings: Arc<Settings>,
        shutdown: CancellationToken,
    ) -> Eraser {
        Eraser {
            pool,
            bus,
            settings,
            shutdown,
        }
    }

    pub fn of(state: &AppState) -> Eraser {
        Eraser::new(
            state.pool.clone(),
            state.bus.clone(),
            state.settings.clone(),
            state.shutdown.clone(),
        )
    }

    fn limit(&self) -> i64 {
        i64::from(self.settings.erasure.batch_size)
    }

    fn lease_ms(&self) -> u64 {
        self.settings.erasure.lease_ms.get()
    }

    /// Drives `tenant`'s erasure, whose lease `owner` holds, until it is done, the lease is
    /// lost or the process stops. A failed step is returned (and noted on the erasure); the
    /// lease is kept, so the erasure is tried again when it runs out.
    pub async fn drive(&self, tenant: Uuid, owner: &str) -> anyhow::Result<Outcome> {
        let outcome = self.drive_inner(tenant, owner).await;
        if let Err(e) = &outcome {
            let line = agentfleet_shared::report::one_line(e);
            if let Err(noted) = erasure::note_error(&self.pool, tenant, &line).await {
                tracing::debug!(%tenant, error = %noted, "could not note the erasure's error");
            }
        }
        outcome
    }

    async fn drive_inner(&self, tenant: Uuid, owner: &str) -> anyhow::Result<Outcome> {
        let limit = self.limit();
        loop {
            if self.shutdown.is_cancelled() {
                erasure::release(&self.pool, tenant, owner).await?;
                return Ok(Outcome::Stopped);
            }
            let mut tx = self.pool.begin().await?;
            let Some(current) = erasure::renew(&mut tx, tenant, owner, self.lease_ms()).await?
            else {
                drop(tx);
                let done = erasure::get(&self.pool, tenant)
                    .await?
                    .is_some_and(|e| e.status == "done");
                return Ok(if done {
                    Outcome::Done
                } else {
                    Outcome::LostLease
                });
            };
            tx.commit().await?;
            let recorded = match current.phase.as_str() {
                "cancelling" => {
                    let ids = erasure::runs_to_cancel(&self.pool, tenant, limit, true).await?;
                    if ids.is_empty() {
                        self.record(tenant, owner, &phase("waiting", true)).await?
                    } else {
                        let n = self.cancel(tenant, &ids).await;
                        if n == 0 {
                            // None went through (each failure is logged): no tight loop.
                            self.nap(Duration::from_millis(
                                self.settings.erasure.interval_ms.get(),
                            ))
                            .await;
                        }
                        let progress = Progress {
                            runs_cancelled: n,
                            ..Default::default()
                        };
                        self.record(tenant, owner, &progress).await?
                    }
                }
                "waiting" => {
                    // A run made since (a key still cached by a replica that missed the
                    // announcement, a batch's last chunk): cancelled first, and the wait
                    // starts again.
                    if !erasure::runs_to_cancel(&self.pool, tenant, 1, true)
                        .await?
                        .is_empty()
                    {
                        self.record(tenant, owner, &phase("cancelling", false))
                            .await?
                    } else {
                        let since = current.quiet_since.unwrap_or(current.requested_at);
                        let grace = chrono::Duration::milliseconds(
                            self.settings.erasure.grace_ms.min(i64::MAX as u64) as i64,
                        );
                        let left = (since + grace) - chrono::Utc::now();
                        if left <= chrono::Duration::zero() {
                            let counted = erasure::counts(&self.pool, tenant).await?;
                            let progress = Progress {
                                phase: Some("deleting"),
                                counted: Some(&counted),
                                ..Default::default()
                            };
                            self.record(tenant, owner, &progress).await?
                        } else {
                            // Woken before the lease runs out, to renew it.
                            let nap = left
                                .to_std()
                                .unwrap_or_default()
                                .min(Duration::from_millis(self.lease_ms() / 3));
                            self.nap(nap).await;
                            true
                        }
                    }
                }
                "deleting" => {
                    if !erasure::runs_to_cancel(&self.pool, tenant, 1, false)
                        .await?
                        .is_empty()
                    {
                        self.record(tenant, owner, &phase("cancelling", false))
                            .await?
                    } else {
                        match self.delete_step(tenant, owner).await? {
                            Step::Deleted => true,
                            Step::LostLease => false,
                            Step::Nothing => {
                                self.record(tenant, owner, &phase("verifying", false))
                                    .await?
                            }
                        }
                    }
                }
                "verifying" => {
                    // The tenant's own keys (its runs' went with them).
                    let bucket = crate::rate_limit::bucket_key(&self.settings.redis.prefix, tenant);
                    let redis = self
                        .bus
                        .delete_keys(&[], &[], &[bucket])
                        .await
                        .context("deleting the tenant's Redis keys")?;
                    let remaining = erasure::counts(&self.pool, tenant).await?;
                    let progress = Progress {
                        redis_keys_deleted: redis,
                        remaining: Some(&remaining),
                        phase: (!erasure::all_zero(&remaining)).then_some("deleting"),
                        ..Default::default()
                    };
                    let mut tx = self.pool.begin().await?;
                    if !erasure::record(&mut tx, tenant, owner, &progress).await? {
                        false
                    } else if erasure::all_zero(&remaining) {
                        let finished = erasure::finish(&mut tx, tenant, owner, &remaining).await?;
                        tx.commit().await?;
                        if finished {
                            tracing::info!(%tenant, "tenant erased: no row of it is left");
                            metrics::counter!("agentfleet_tenant_erasures_total").increment(1);
                            return Ok(Outcome::Done);
                        }
                        false
                    } else {
                        tx.commit().await?;
                        tracing::warn!(%tenant, ?remaining, "erasure verification found rows left; deleting again");
                        true
                    }
                }
                _ => return Ok(Outcome::Done),
            };
            if !recorded {
                return Ok(Outcome::LostLease);
            }
        }
    }

    /// Sleeps `for_`, or less if the process stops.
    async fn nap(&self, for_: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(for_) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// Records `progress` in a transaction of its own; whether `owner` still held the erasure.
    async fn record(
        &self,
        tenant: Uuid,
        owner: &str,
        progress: &Progress<'_>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let recorded = erasure::record(&mut tx, tenant, owner, progress).await?;
        tx.commit().await?;
        Ok(recorded)
    }

    /// Cancels runs as `POST /v1/runs/{id}/cancel` does (the same events and hints), a few at
    /// once; how many it cancelled. A run that ended meanwhile is left as it is; one that
    /// could not be cancelled is found again by the next round.
    async fn cancel(&self, tenant: Uuid, ids: &[Uuid]) -> u64 {
        let cancelled = std::sync::atomic::AtomicU64::new(0);
        let cancelled_ref = &cancelled;
        futures_util::stream::iter(ids.iter().copied())
            .for_each_concurrent(CANCELS_IN_FLIGHT, |id| {
                // Owned (both are cheap handles): a future borrowing them is not `Send` for
                // every lifetime, as `tokio::spawn` needs.
                let (pool, bus) = (self.pool.clone(), self.bus.clone());
                async move {
                match transitions::cancel(&pool, tenant, id).await {
                    Ok(Cancelled::Now {
                        previous,
                        thread_id,
                        last_event_id,
                        ..
                    }) => {
                        crate::announce::cancelled_on(
                            &pool,
                            &bus,
                            id,
                            thread_id,
                            previous,
                            None,
                            last_event_id,
                        )
                        .await;
                        cancelled_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(Cancelled::Already)
                    | Err(StoreError::WrongStatus { .. } | StoreError::NotFound) => {}
                    Err(e) => {
                        tracing::warn!(run_id = %id, error = %e, "erasure: cancelling a run failed; tried again");
                    }
                }
                }
            })
            .await;
        cancelled.into_inner()
    }

    /// One step of deletion: the tables before the runs, or the next runs with their keys and
    /// children, or the tables after the runs. `Nothing` once every one is empty.
    async fn delete_step(&self, tenant: Uuid, owner: &str) -> anyhow::Result<Step> {
        let limit = self.limit();
        let mut tx = self.pool.begin().await?;
        if let Some(deleted) = erasure::delete_before_runs(&mut tx, tenant, limit).await? {
            return self.commit_step(tx, tenant, owner, &[deleted], 0).await;
        }
        drop(tx);
        let runs = erasure::next_runs(&self.pool, tenant, limit).await?;
        if !runs.is_empty() {
            let ids: Vec<Uuid> = runs.iter().map(|(id, _)| *id).collect();
            let mut threads: Vec<Uuid> = runs.iter().map(|(_, thread)| *thread).collect();
            threads.sort_unstable();
            threads.dedup();
            let before = self
                .bus
                .delete_keys(&ids, &threads, &[])
                .await
                .context("deleting the runs' Redis keys")?;
            loop {
                let mut tx = self.pool.begin().await?;
                match erasure::delete_run_children(&mut tx, &ids, &threads, limit).await? {
                    Some(deleted) => {
                        if self.commit_step(tx, tenant, owner, &[deleted], 0).await?
                            == Step::LostLease
                        {
                            return Ok(Step::LostLease);
                        }
                    }
                    None => break,
                }
            }
            let mut tx = self.pool.begin().await?;
            let deleted = erasure::delete_runs(&mut tx, tenant, &ids, &threads).await?;
            if self
                .commit_step(tx, tenant, owner, &deleted, before)
                .await?
                == Step::LostLease
            {
                return Ok(Step::LostLease);
            }
            let after = self
                .bus
                .delete_keys(&ids, &threads, &[])
                .await
                .context("deleting the runs' Redis keys")?;
            if after > 0 {
                let progress = Progress {
                    redis_keys_deleted: after,
                    ..Default::default()
                };
                if !self.record(tenant, owner, &progress).await? {
                    return Ok(Step::LostLease);
                }
            }
            return Ok(Step::Deleted);
        }
        let mut tx = self.pool.begin().await?;
        if let Some(deleted) = erasure::delete_after_runs(&mut tx, tenant, limit).await? {
            return self.commit_step(tx, tenant, owner, &[deleted], 0).await;
        }
        Ok(Step::Nothing)
    }

    /// Records a step's deletions in its transaction and commits both, or rolls both back
    /// when `owner` no longer holds the erasure.
    async fn commit_step(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        tenant: Uuid,
        owner: &str,
        deleted: &[(&'static str, u64)],
        redis: u64,
    ) -> anyhow::Result<Step> {
        let progress = Progress {
            deleted,
            redis_keys_deleted: redis,
            ..Default::default()
        };
        if !erasure::record(&mut tx, tenant, owner, &progress).await? {
            return Ok(Step::LostLease);
        }
        tx.commit().await?;
        for (table, n) in deleted {
            metrics::counter!("agentfleet_erased_rows_total", "table" => *table).increment(*n);
        }
        Ok(Step::Deleted)
    }

    /// Drives `tenant`'s erasure until it is done, taking its lease whenever it is free (the
    /// CLI's `--wait`, with or without API replicas driving it too). Each `poll` it looks
    /// again.
    pub async fn until_done(&self, tenant: Uuid, poll: Duration) -> anyhow::Result<()> {
        let owner = new_owner();
        loop {
            let e = erasure::get(&self.pool, tenant)
                .await?
                .context("no erasure of this tenant")?;
            if e.status == "done" {
                return Ok(());
            }
            if erasure::take(&self.pool, tenant, &owner, self.lease_ms()).await? {
                match self.drive(tenant, &owner).await? {
                    Outcome::Done => return Ok(()),
                    Outcome::Stopped => anyhow::bail!("interrupted"),
                    Outcome::LostLease => {}
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = self.shutdown.cancelled() => anyhow::bail!("interrupted"),
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Deleted,
    Nothing,
    LostLease,
}

fn phase(to: &'static str, quiet: bool) -> Progress<'static> {
    Progress {
        phase: Some(to),
        quiet,
        ..Default::default()
    }
}

/// Drives `tenant`'s erasure in the background (its lease taken by `owner`).
pub fn spawn(eraser: Eraser, tenant: Uuid, owner: String) {
    tokio::spawn(async move {
        match eraser.drive(tenant, &owner).await {
            Ok(outcome) => tracing::debug!(%tenant, ?outcome, "erasure driver stopped"),
            Err(e) => tracing::warn!(%tenant, error = %agentfleet_shared::report::one_line(&e),
                "erasure step failed; tried again once its lease runs out (erasure.lease_ms)"),
        }
    });
}

/// Every `erasure.interval_ms` until the server stops: takes the oldest erasure nobody
/// drives and drives it.
pub fn spawn_sweeper(eraser: Eraser) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(
            eraser.settings.erasure.interval_ms.get(),
        ));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = eraser.shutdown.cancelled() => break,
            }
            let owner = new_owner();
            match erasure::claim(&eraser.pool, &owner, eraser.lease_ms()).await {
                Ok(Some(tenant)) => {
                    tracing::info!(%tenant, "driving a tenant's erasure");
                    spawn(eraser.clone(), tenant, owner);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "erasure sweep failed; retried next tick"),
            }
        }
    });
}
