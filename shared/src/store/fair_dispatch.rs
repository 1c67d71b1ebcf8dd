//! Fair dispatch: every tenant has a dispatch window, and at most that many of its runs are in
//! flight — published and waiting for a worker, or running. Its other queued runs are `held` in
//! Postgres, unpublished, and dispatched oldest first as its runs end or pause.
//!
//! The window is the fair share's (`[fair_share]`, migration 0031): `window_per_slot` runs per
//! slot of the live workers, so a tenant alone fills the fleet and keeps as many queued, and a
//! tenant arriving later finds at most the others' windows ahead of it in the RabbitMQ queue,
//! not their backlogs: work-conserving, with equal windows for every busy tenant. A tenant's
//! `max_running_runs` is a hard cap below that (exact: counted under the tenant row's lock).
//! The queue so holds only runnable work, which is what an autoscaler should look at; the held
//! backlog is a metric of its own.
//!
//! Who dispatches: the creator of a run held by a running limit (the API, after the commit), whoever ends,
//! pauses or cancels a run (the worker or the API, right after that commit), a resume, and the
//! sweeper, which heals whatever was missed (a process that died between the two commits, a
//! raised limit, a tenant no longer suspended, workers that joined). Dispatching is one call of
//! its own (`dispatch_held`, one statement's transaction): the rows of the tenants with held
//! runs are locked first, so two dispatchers of one tenant count one after the other and never
//! both fill the same free place.
//!
//! A create decides in its insert which runs wait (`fair_share_room`: none published while the
//! tenant has held runs, else what is left of its window), without the lock: the common case, a
//! tenant within its window, costs no dispatch at all, and the window is soft by the creates in
//! flight. A tenant held back by the fair share alone is dispatched in chunks of an eighth of
//! its window, so a backlog drains with one dispatch per chunk rather than per run's end.

use std::sync::Arc;

use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use super::group_commit::Batcher;
use crate::domain::FairShare;

/// Runs one dispatch may hand out for one tenant; the next dispatch or the sweeper takes the
/// rest (only a tenant without a limit whose runs were held by a suspension has more).
pub const MAX_PER_TENANT: u32 = 1000;

/// Runs dispatched by one call, to publish once the call returns (it has committed).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dispatched {
    /// (tenant, run), oldest first within a tenant.
    pub runs: Vec<(Uuid, Uuid)>,
}

impl Dispatched {
    pub fn ids(&self) -> Vec<Uuid> {
        self.runs.iter().map(|(_, id)| *id).collect()
    }

    /// The runs of one tenant.
    pub fn of(&self, tenant: Uuid) -> Vec<Uuid> {
        self.runs
            .iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, id)| *id)
            .collect()
    }
}

/// Dispatches the held runs of `tenants` that fit their windows: the fair share's (`share`;
/// none when it is off) capped by the running limit (`default_limit` for a tenant without its
/// own `max_running_runs`), at most `max_per_tenant` each. The caller publishes what it
/// returns; if it dies first, the sweeper re-publishes them (they are queued, not held, and
/// their `enqueued_at` ages).
///
/// One call of `dispatch_held` (migration 0031): it finds which of the tenants have held runs,
/// locks those rows in id order, then, in a statement of its own (so its snapshot sees every
/// dispatch that committed before the lock was granted), gives each tenant not suspended its
/// oldest held runs up to its free places (or up to `max_per_tenant` when it has no window).
/// Outside a transaction the call commits in the same round trip, so the tenant rows stay
/// locked for one statement only.
pub async fn next<'e>(
    db: impl sqlx::PgExecutor<'e>,
    tenants: &[Uuid],
    default_limit: u32,
    share: Option<FairShare>,
    max_per_tenant: u32,
) -> Result<Dispatched, StoreError> {
    if tenants.is_empty() {
        return Ok(Dispatched::default());
    }
    let mut tenants = tenants.to_vec();
    tenants.sort_unstable();
    tenants.dedup();
    let (per_slot, min_window, ttl_ms) = share_args(share);
    let mut runs: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT tenant_id, run_id
         FROM dispatch_held($1, $2, $3, fair_share_window($4, $5, $6))",
    )
    .bind(&tenants)
    .bind(i64::from(default_limit))
    .bind(i64::from(max_per_tenant))
    .bind(per_slot)
    .bind(min_window)
    .bind(ttl_ms)
    .fetch_all(db)
    .await?;
    runs.sort_unstable();
    Ok(Dispatched { runs })
}

/// Dispatches grouped: the tenants asked for at once are dispatched by one [`next`] (one
/// transaction, each tenant row locked once), so a limited tenant that submits fast does not
/// queue up on its own row lock. Per item, the runs dispatched for its tenant (all of them to
/// the first item naming that tenant), to publish.
pub fn grouped(
    pool: PgPool,
    default_limit: u32,
    share: Option<FairShare>,
    timeout: Option<std::time::Duration>,
) -> Batcher<Uuid, Vec<Uuid>> {
    Batcher::spawn(
        pool,
        1,
        256,
        timeout,
        super::group_commit::write_fn(move |conn, tenants: Arc<Vec<Uuid>>| {
            Box::pin(async move {
                let done = next(&mut *conn, &tenants, default_limit, share, MAX_PER_TENANT).await?;
                let mut seen = std::collections::HashSet::new();
                Ok(tenants
                    .iter()
                    .map(|t| {
                        if seen.insert(*t) {
                            done.of(*t)
                        } else {
                            Vec::new()
                        }
                    })
                    .collect())
            })
        }),
    )
}

/// `fair_share_window`'s arguments: per slot (0: off), the smallest window, the registrations'
/// time to live in ms.
pub fn share_args(share: Option<FairShare>) -> (i64, i64, i64) {
    match share {
        Some(s) => (
            i64::from(s.window_per_slot),
            i64::from(s.min_window),
            i64::try_from(s.worker_ttl_ms).unwrap_or(i64::MAX),
        ),
        None => (0, 1, 0),
    }
}

/// The window every tenant has now (0: fair share is off), as dispatch computes it.
pub async fn window(pool: &PgPool, share: Option<FairShare>) -> Result<i64, StoreError> {
    let (per_slot, min_window, ttl_ms) = share_args(share);
    let (n,): (i64,) = sqlx::query_as("SELECT fair_share_window($1, $2, $3)")
        .bind(per_slot)
        .bind(min_window)
        .bind(ttl_ms)
        .fetch_one(pool)
        .await?;
    Ok(n)
}

/// Registers (or refreshes) a worker's slots, which the windows count while the row is younger
/// than `fair_share.worker_ttl_ms`.
pub async fn register_worker(pool: &PgPool, worker_id: &str, slots: u16) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO fleet_workers (worker_id, slots, seen_at) VALUES ($1, $2, now())
         ON CONFLICT (worker_id) DO UPDATE SET slots = EXCLUDED.slots, seen_at = now()",
    )
    .bind(worker_id)
    .bind(i32::from(slots))
    .execute(pool)
    .await?;
    Ok(())
}

/// A worker's goodbye: its slots stop counting at once (a drain, a scale-in).
pub async fn forget_worker(pool: &PgPool, worker_id: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM fleet_workers WHERE worker_id = $1")
        .bind(worker_id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Deletes registrations of workers gone for an hour (killed without a goodbye).
pub async fn prune_workers(pool: &PgPool) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM fleet_workers WHERE seen_at < now() - interval '1 hour'")
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Tenants with held runs, for the sweeper to dispatch (at most `limit`, those waiting
/// longest first).
pub async fn tenants_with_held(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, StoreError> {
    let rows: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT tenant_id FROM runs WHERE status = 'queued' AND held
         GROUP BY tenant_id ORDER BY min(enqueued_at) LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(t,)| t).collect())
}

/// What waits: runs a worker may take now, and runs fair dispatch holds back.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// Queued and dispatched: what the RabbitMQ queue holds (or will again, once the sweeper
    /// re-publishes a lost message). The signal to scale workers on.
    pub runnable: i64,
    /// How long the runnable run that became runnable first has been so (0 when none).
    pub oldest_runnable_secs: f64,
    /// Queued and held, in all.
    pub held: i64,
    /// Held runs of the tenants with most, largest first.
    pub held_by_tenant: Vec<(Uuid, i64)>,
}

/// The backlog, with the `top` tenants holding most.
pub async fn backlog(pool: &PgPool, top: i64) -> Result<Backlog, StoreError> {
    let (runnable, oldest_runnable_secs): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(updated_at))::float8
         FROM runs WHERE status = 'queued' AND NOT held",
    )
    .fetch_one(pool)
    .await?;
    let per_tenant: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT tenant_id, count(*) AS n FROM runs WHERE status = 'queued' AND held
         GROUP BY tenant_id ORDER BY n DESC, tenant_id",
    )
    .fetch_all(pool)
    .await?;
    Ok(Backlog {
        runnable,
        oldest_runnable_secs: oldest_runnable_secs.unwrap_or(0.0).max(0.0),
        held: per_tenant.iter().map(|(_, n)| n).sum(),
        held_by_tenant: per_tenant.into_iter().take(top.max(0) as usize).collect(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::AgentSpec;
    use crate::store::create_many::create_on_new_threads;
    use crate::store::transitions::{self, NewRun};
    use crate::store::{Fence, runs, tenants};

    async fn tenant(pool: &PgPool, limits: serde_json::Value) -> Uuid {
        let t = tenants::create(pool, "t").await.unwrap().tenant_id;
        sqlx::query("UPDATE tenants SET limits = $2 WHERE id = $1")
            .bind(t)
            .bind(limits)
            .execute(pool)
            .await
            .unwrap();
        t
    }

    async fn create(pool: &PgPool, tenant: Uuid, n: usize, fair: bool) -> Vec<Uuid> {
        let agent: AgentSpec = serde_json::from_value(json!({"model": "m"})).unwrap();
        let runs: Vec<NewRun> = (0..n)
            .map(|i| NewRun {
                id: Uuid::now_v7(),
                tenant_id: tenant,
                thread_id: None,
                agent: agent.clone(),
                max_iterations: 5,
                metadata: json!({}),
                idempotency_key: None,
                request_hash: None,
                input: format!("run {i}"),
                fair,
                share: None,
                traceparent: None,
            })
            .collect();
        create_on_new_threads(pool, &runs)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    async fn in_flight(pool: &PgPool, tenant: Uuid) -> i64 {
        sqlx::query_as::<_, (i64,)>(
            "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status IN ('queued','running') AND NOT held",
        )
        .bind(tenant)
        .fetch_one(pool)
        .await
        .unwrap()
        .0
    }

    /// Fair runs are created held; dispatch fills the tenant's window oldest first, a held
    /// run cannot be claimed, and an ended run makes room for exactly one more.
    #[sqlx::test(migrations = "../migrations")]
    async fn the_window_is_filled_oldest_first_and_refilled_as_runs_end(pool: PgPool) {
        let t = tenant(&pool, json!({"max_running_runs": 3})).await;
        let ids = create(&pool, t, 10, true).await;
        assert_eq!(in_flight(&pool, t).await, 0, "created held");
        let held_claim = transitions::claim(&pool, ids[0], "w", std::time::Duration::from_secs(10))
            .await
            .unwrap();
        assert!(held_claim.is_none(), "a held run is never claimed");

        let first = next(&pool, &[t], 0, None, 1000).await.unwrap();
        assert_eq!(first.ids(), ids[..3].to_vec(), "the three oldest");
        assert!(
            next(&pool, &[t], 0, None, 1000)
                .await
                .unwrap()
                .runs
                .is_empty(),
            "window full"
        );

        let claimed = transitions::claim(&pool, ids[0], "w", std::time::Duration::from_secs(10))
            .await
            .unwrap()
            .expect("dispatched runs are claimable");
        assert!(
            next(&pool, &[t], 0, None, 1000)
                .await
                .unwrap()
                .runs
                .is_empty(),
            "running counts"
        );
        transitions::complete(
            &pool,
            Fence {
                run_id: ids[0],
                attempt: claimed.run.attempt,
            },
            1,
        )
        .await
        .unwrap();
        assert_eq!(
            next(&pool, &[t], 0, None, 1000).await.unwrap().ids(),
            vec![ids[3]]
        );
        assert_eq!(in_flight(&pool, t).await, 3);
    }

    /// The configured default applies to tenants without their own limit; 0 is no limit.
    #[sqlx::test(migrations = "../migrations")]
    async fn the_default_limit_and_no_limit(pool: PgPool) {
        let t = tenant(&pool, json!({})).await;
        create(&pool, t, 5, true).await;
        assert_eq!(
            next(&pool, &[t], 2, None, 1000).await.unwrap().runs.len(),
            2
        );
        assert_eq!(
            next(&pool, &[t], 0, None, 1000).await.unwrap().runs.len(),
            3
        );
    }

    /// Dispatchers of one tenant running at once never overshoot its limit.
    #[sqlx::test(migrations = "../migrations")]
    async fn concurrent_dispatchers_do_not_overshoot(pool: PgPool) {
        let t = tenant(&pool, json!({"max_running_runs": 4})).await;
        create(&pool, t, 40, true).await;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                next(&pool, &[t], 0, None, 1000).await
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap().unwrap().runs.len();
        }
        assert_eq!(total, 4);
        assert_eq!(in_flight(&pool, t).await, 4);
    }

    /// A dispatcher that waited for the tenant's lock counts what the holder dispatched: the
    /// holder here dispatches the tenant's newer run (not the one the waiter would pick, so
    /// the row's own recheck cannot save it), and the waiter, finding the one slot taken,
    /// dispatches nothing. Counting on a snapshot from before the wait would overshoot.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_dispatcher_that_waited_for_the_lock_counts_what_the_holder_dispatched(pool: PgPool) {
        let t = tenant(&pool, json!({"max_running_runs": 1})).await;
        let ids = create(&pool, t, 2, true).await;
        let mut holder = pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
            .bind(t)
            .execute(&mut *holder)
            .await
            .unwrap();
        sqlx::query("UPDATE runs SET held = false WHERE id = $1")
            .bind(ids[1])
            .execute(&mut *holder)
            .await
            .unwrap();
        let waiter = {
            let pool = pool.clone();
            tokio::spawn(async move { next(&pool, &[t], 0, None, 1000).await })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let (waiting,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting == 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the waiter never waited for the lock"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        holder.commit().await.unwrap();
        let dispatched = waiter.await.unwrap().unwrap();
        assert!(dispatched.runs.is_empty(), "{dispatched:?}");
        assert_eq!(in_flight(&pool, t).await, 1);
    }

    /// A suspended tenant's dispatched runs are held again and nothing of it is dispatched
    /// until the suspension is lifted; the sweeper finds it then.
    #[sqlx::test(migrations = "../migrations")]
    async fn suspension_holds_everything_queued(pool: PgPool) {
        let t = tenant(&pool, json!({})).await;
        let ids = create(&pool, t, 3, false).await;
        assert_eq!(
            in_flight(&pool, t).await,
            3,
            "unlimited runs are dispatched at once"
        );
        tenants::set_suspended(&pool, t, true).await.unwrap();
        assert_eq!(in_flight(&pool, t).await, 0);
        assert!(
            transitions::claim(&pool, ids[1], "w", std::time::Duration::from_secs(10))
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            next(&pool, &[t], 0, None, 1000)
                .await
                .unwrap()
                .runs
                .is_empty()
        );
        assert_eq!(tenants_with_held(&pool, 10).await.unwrap(), vec![t]);
        assert_eq!(
            backlog(&pool, 10).await.unwrap(),
            Backlog {
                runnable: 0,
                oldest_runnable_secs: 0.0,
                held: 3,
                held_by_tenant: vec![(t, 3)]
            }
        );
        tenants::set_suspended(&pool, t, false).await.unwrap();
        assert_eq!(next(&pool, &[t], 0, None, 1000).await.unwrap().ids(), ids);
        assert!(tenants_with_held(&pool, 10).await.unwrap().is_empty());
        let run = runs::get(&pool, ids[0]).await.unwrap();
        assert!(!run.held);
    }

    const SHARE: FairShare = FairShare {
        window_per_slot: 2,
        min_window: 5,
        worker_ttl_ms: 10_000,
    };

    /// Runs of `tenants` (one per entry, in that order) created by one grouped statement under
    /// the fair share; their `held` flags in the same order.
    async fn create_shared(pool: &PgPool, tenants: &[Uuid]) -> Vec<bool> {
        let runs: Vec<NewRun> = tenants
            .iter()
            .map(|t| NewRun {
                share: Some(SHARE),
                ..NewRun::for_test(*t)
            })
            .collect();
        let rows = create_on_new_threads(pool, &runs).await.unwrap();
        assert!(rows.iter().all(|r| r.fair), "every run's end dispatches");
        rows.into_iter().map(|r| r.held).collect()
    }

    /// The window is `window_per_slot` runs per slot of the workers seen within the TTL, at
    /// least `min_window`; a worker's goodbye and its silence both take its slots away.
    #[sqlx::test(migrations = "../migrations")]
    async fn the_window_counts_the_slots_of_live_workers(pool: PgPool) {
        assert_eq!(
            window(&pool, Some(SHARE)).await.unwrap(),
            5,
            "no worker yet"
        );
        register_worker(&pool, "w1", 8).await.unwrap();
        register_worker(&pool, "w2", 4).await.unwrap();
        register_worker(&pool, "w2", 4).await.unwrap();
        assert_eq!(window(&pool, Some(SHARE)).await.unwrap(), 24);
        sqlx::query(
            "UPDATE fleet_workers SET seen_at = now() - interval '11 seconds'
             WHERE worker_id = 'w2'",
        )
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(
            window(&pool, Some(SHARE)).await.unwrap(),
            16,
            "w2 is silent"
        );
        forget_worker(&pool, "w1").await.unwrap();
        assert_eq!(window(&pool, Some(SHARE)).await.unwrap(), 5);
        assert_eq!(window(&pool, None).await.unwrap(), 0, "fair share off");
        sqlx::query("UPDATE fleet_workers SET seen_at = now() - interval '2 hours'")
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(prune_workers(&pool).await.unwrap(), 1);
    }

    /// Creates publish what is left of each tenant's window and hold the rest; once a tenant
    /// has held runs, a new run waits behind them; dispatch fills the window again as runs end.
    #[sqlx::test(migrations = "../migrations")]
    async fn creates_publish_up_to_the_window_and_hold_the_rest(pool: PgPool) {
        let (a, b) = (
            tenant(&pool, json!({})).await,
            tenant(&pool, json!({})).await,
        );
        assert_eq!(create_shared(&pool, &[a, a, a]).await, [false; 3]);
        assert_eq!(
            create_shared(&pool, &[a, b, a, a, b, a]).await,
            [false, false, false, true, false, true],
            "a has 2 places left of 5; b has all 5"
        );
        assert_eq!(in_flight(&pool, a).await, 5);
        assert_eq!(
            create_shared(&pool, &[a]).await,
            [true],
            "a new run waits behind the held ones"
        );
        assert!(
            next(&pool, &[a, b], 0, Some(SHARE), 1000)
                .await
                .unwrap()
                .runs
                .is_empty(),
            "a's window is full"
        );
        sqlx::query(
            "UPDATE runs SET status = 'completed', finished_at = now()
             WHERE id IN (SELECT id FROM runs WHERE tenant_id = $1 AND NOT held LIMIT 2)",
        )
        .bind(a)
        .execute(&pool)
        .await
        .unwrap();
        let held_before: Vec<(Uuid,)> = sqlx::query_as(
            "SELECT id FROM runs WHERE tenant_id = $1 AND held ORDER BY enqueued_at, id",
        )
        .bind(a)
        .fetch_all(&pool)
        .await
        .unwrap();
        let dispatched = next(&pool, &[a, b], 0, Some(SHARE), 1000).await.unwrap();
        assert_eq!(
            dispatched.of(a),
            held_before[..2].iter().map(|(id,)| *id).collect::<Vec<_>>(),
            "the two oldest held runs fill the two free places"
        );
        assert_eq!(in_flight(&pool, a).await, 5);
        // A running limit below the window caps it.
        sqlx::query("UPDATE tenants SET limits = '{\"max_running_runs\": 1}' WHERE id = $1")
            .bind(a)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("UPDATE runs SET status = 'completed', finished_at = now() WHERE tenant_id = $1 AND NOT held")
            .bind(a)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(
            next(&pool, &[a], 0, Some(SHARE), 1000)
                .await
                .unwrap()
                .runs
                .len(),
            1
        );
    }
}
