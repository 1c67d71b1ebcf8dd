//! Fair dispatch: a tenant with a running limit (`max_running_runs` > 0) has at most that many
//! runs in flight — published and waiting for a worker, or running. Its other queued runs are
//! `held` in Postgres, unpublished, and dispatched oldest first as its runs end or pause.
//!
//! The RabbitMQ queue so holds at most a limit's worth of each limited tenant's runs, so a
//! tenant with a backlog of thousands delays another tenant's first run by at most its own
//! window, not by its backlog. (The window is per tenant: within the queue, tenants take
//! turns by arrival.) The queue then also holds only runnable work, which is what an
//! autoscaler should look at; the held backlog is a metric of its own.
//!
//! Who dispatches: the creator of a fair run (the API, after the create commits), whoever
//! ends, pauses or cancels a fair run (the worker or the API, right after that commit), a
//! resume, and the sweeper, which heals whatever was missed (a process that died between the
//! two commits, a raised limit, a tenant no longer suspended). Dispatching is one call of its
//! own (`dispatch_held`, one statement's transaction): the tenant rows are locked first, so
//! two dispatchers of one tenant count one after the other and never both fill the same free
//! slot.

use std::sync::Arc;

use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use super::group_commit::Batcher;

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

/// Dispatches the held runs of `tenants` that fit their limits (`default_limit` for a tenant
/// without its own `max_running_runs`), at most `max_per_tenant` each. The caller publishes
/// what it returns; if it dies first, the sweeper re-publishes them (they are queued, not
/// held, and their `enqueued_at` ages).
///
/// One call of `dispatch_held` (migration 0016): it locks the tenant rows in id order, then,
/// in a statement of its own (so its snapshot sees every dispatch that committed before the
/// lock was granted), gives each tenant not suspended its oldest held runs up to its free
/// slots (or up to `max_per_tenant` when it has no limit). Outside a transaction the call
/// commits in the same round trip, so the tenant rows stay locked for one statement only.
pub async fn next<'e>(
    db: impl sqlx::PgExecutor<'e>,
    tenants: &[Uuid],
    default_limit: u32,
    max_per_tenant: u32,
) -> Result<Dispatched, StoreError> {
    if tenants.is_empty() {
        return Ok(Dispatched::default());
    }
    let mut tenants = tenants.to_vec();
    tenants.sort_unstable();
    tenants.dedup();
    let mut runs: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT tenant_id, run_id FROM dispatch_held($1, $2, $3)")
            .bind(&tenants)
            .bind(i64::from(default_limit))
            .bind(i64::from(max_per_tenant))
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
    timeout: Option<std::time::Duration>,
) -> Batcher<Uuid, Vec<Uuid>> {
    Batcher::spawn(
        pool,
        1,
        256,
        timeout,
        super::group_commit::write_fn(move |conn, tenants: Arc<Vec<Uuid>>| {
            Box::pin(async move {
                let done = next(&mut *conn, &tenants, default_limit, MAX_PER_TENANT).await?;
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

        let first = next(&pool, &[t], 0, 1000).await.unwrap();
        assert_eq!(first.ids(), ids[..3].to_vec(), "the three oldest");
        assert!(
            next(&pool, &[t], 0, 1000).await.unwrap().runs.is_empty(),
            "window full"
        );

        let claimed = transitions::claim(&pool, ids[0], "w", std::time::Duration::from_secs(10))
            .await
            .unwrap()
            .expect("dispatched runs are claimable");
        assert!(
            next(&pool, &[t], 0, 1000).await.unwrap().runs.is_empty(),
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
            next(&pool, &[t], 0, 1000).await.unwrap().ids(),
            vec![ids[3]]
        );
        assert_eq!(in_flight(&pool, t).await, 3);
    }

    /// The configured default applies to tenants without their own limit; 0 is no limit.
    #[sqlx::test(migrations = "../migrations")]
    async fn the_default_limit_and_no_limit(pool: PgPool) {
        let t = tenant(&pool, json!({})).await;
        create(&pool, t, 5, true).await;
        assert_eq!(next(&pool, &[t], 2, 1000).await.unwrap().runs.len(), 2);
        assert_eq!(next(&pool, &[t], 0, 1000).await.unwrap().runs.len(), 3);
    }

    /// Dispatchers of one tenant running at once never overshoot its limit.
    #[sqlx::test(migrations = "../migrations")]
    async fn concurrent_dispatchers_do_not_overshoot(pool: PgPool) {
        let t = tenant(&pool, json!({"max_running_runs": 4})).await;
        create(&pool, t, 40, true).await;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(
                async move { next(&pool, &[t], 0, 1000).await },
            ));
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
            tokio::spawn(async move { next(&pool, &[t], 0, 1000).await })
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
        assert!(next(&pool, &[t], 0, 1000).await.unwrap().runs.is_empty());
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
        assert_eq!(next(&pool, &[t], 0, 1000).await.unwrap().ids(), ids);
        assert!(tenants_with_held(&pool, 10).await.unwrap().is_empty());
        let run = runs::get(&pool, ids[0]).await.unwrap();
        assert!(!run.held);
    }
}
