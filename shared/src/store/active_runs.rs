//! Each tenant's runs not yet ended (`queued`, `running`, `waiting_for_input`,
//! `waiting_for_confirmation`, and a plan's `waiting_for_tasks` and `waiting_for_slot`), for
//! `limits.max_active_runs`.
//!
//! Triggers on `runs` (migration 0033) write a delta to `tenant_active_deltas` whenever a run
//! starts or stops being active: one row per tenant and insert statement, one per run that
//! ends, is promoted or is deleted while active. A count is the sum of the tenant's deltas,
//! plus the items of its batches not yet created (each will be a run); the sweeper [`fold`]s
//! each tenant's deltas into one row, so the sum reads a handful of rows whatever the tenant's
//! size. Appending deltas takes no row lock: ends of one tenant's runs on many connections
//! never wait for each other.
//!
//! Exactness under concurrent creates: every create of a limited tenant takes the tenant's
//! creation lock (a transaction-scoped advisory lock) before it counts, and holds it until
//! its runs are committed, so creates of one tenant, on any replica, count one after the
//! other ([`lock_and_count`]; the grouped insert of single creates calls the same SQL
//! function, `lock_and_count_active`, inside its statement). A group takes the locks of all
//! its tenants at once, in key order, so two groups cannot deadlock.

use std::collections::HashMap;

use sqlx::PgConnection;
use uuid::Uuid;

use super::StoreError;

/// How many of `tenant`'s runs have not ended, with the items of its batches still being
/// created, without any lock (a quick refusal before a request is validated; the exact check
/// is [`reserve`]).
pub async fn count<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    tenant: Uuid,
) -> Result<i64, StoreError> {
    let rows: Vec<(Uuid, i64)> = sqlx::query_as("SELECT tenant_id, active FROM count_active($1)")
        .bind(vec![tenant])
        .fetch_all(executor)
        .await?;
    Ok(rows.first().map_or(0, |(_, n)| *n))
}

/// Takes the creation locks of `tenants` for the rest of the transaction on `conn`, in key
/// order, then counts their active runs in a statement of its own (so its snapshot sees every
/// create that committed before a lock was granted): `lock_and_count_active` (migration 0033),
/// one round trip.
pub async fn lock_and_count(
    conn: &mut PgConnection,
    tenants: &[Uuid],
) -> Result<HashMap<Uuid, i64>, StoreError> {
    let rows: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT tenant_id, active FROM lock_and_count_active($1)")
            .bind(tenants)
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Takes `tenant`'s creation lock for the rest of the transaction on `conn`, then refuses
/// `new_runs` more runs ([`StoreError::TooManyActiveRuns`]) when they would take the tenant
/// past `max`.
pub async fn reserve(
    conn: &mut PgConnection,
    tenant: Uuid,
    max: u32,
    new_runs: usize,
) -> Result<(), StoreError> {
    let active = lock_and_count(conn, &[tenant])
        .await?
        .get(&tenant)
        .copied()
        .unwrap_or(0);
    check(active, max, new_runs)
}

/// [`StoreError::TooManyActiveRuns`] when `active` runs and `new_runs` more go past `max`.
pub fn check(active: i64, max: u32, new_runs: usize) -> Result<(), StoreError> {
    if active.saturating_add(new_runs as i64) > i64::from(max) {
        return Err(StoreError::TooManyActiveRuns {
            max,
            active,
            new_runs,
        });
    }
    Ok(())
}

/// Folds the deltas of up to `tenants` tenants that have more than one into one row each (none
/// when the sum is 0). Exact while deltas are written: the delete takes only the rows its
/// snapshot sees, and a row a concurrent fold deleted first is skipped. Returns the rows
/// removed.
pub async fn fold<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    tenants: i64,
) -> Result<u64, StoreError> {
    let (removed,): (i64,) = sqlx::query_as(
        "WITH crowded AS (
             SELECT tenant_id FROM tenant_active_deltas
             GROUP BY tenant_id HAVING count(*) > 1 LIMIT $1),
          gone AS (
             DELETE FROM tenant_active_deltas d USING crowded c
             WHERE d.tenant_id = c.tenant_id
             RETURNING d.tenant_id, d.delta),
          kept AS (
             INSERT INTO tenant_active_deltas (tenant_id, delta)
             SELECT tenant_id, sum(delta) FROM gone GROUP BY tenant_id HAVING sum(delta) <> 0)
         SELECT count(*) FROM gone",
    )
    .bind(tenants)
    .fetch_one(executor)
    .await?;
    Ok(removed as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::PgPool;

    #[test]
    fn the_limit_itself_may_be_reached_not_passed() {
        assert!(check(0, 3, 3).is_ok());
        assert!(check(1, 3, 3).is_err());
        assert!(check(2, 3, 1).is_ok());
        assert!(check(3, 3, 1).is_err());
    }

    async fn tenant(pool: &PgPool) -> Uuid {
        crate::store::tenants::create(pool, "t")
            .await
            .unwrap()
            .tenant_id
    }

    /// The exact count the deltas must agree with.
    async fn counted(pool: &PgPool, tenant: Uuid) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status IN \
             ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation', \
              'waiting_for_tasks', 'waiting_for_slot')",
        )
        .bind(tenant)
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// Inserts `n` runs of `tenant` in `status` (`queued` or `waiting_for_thread`), one
    /// statement each.
    async fn insert_runs(conn: &mut PgConnection, tenant: Uuid, status: &str, n: usize) {
        for _ in 0..n {
            let thread = Uuid::now_v7();
            sqlx::query("INSERT INTO threads (id, tenant_id) VALUES ($1, $2)")
                .bind(thread)
                .bind(tenant)
                .execute(&mut *conn)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO runs (id, tenant_id, thread_id, status, agent, max_iterations, \
                 queued_input) VALUES ($1, $2, $3, $4, '{}', 10, \
                 CASE WHEN $4 = 'waiting_for_thread' THEN '{}'::jsonb END)",
            )
            .bind(Uuid::now_v7())
            .bind(tenant)
            .bind(thread)
            .bind(status)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
    }

    /// Moves up to `n` of `tenant`'s runs in `from` with `set` (one statement).
    async fn change(pool: &PgPool, tenant: Uuid, from: &str, n: i64, set: &str) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE runs SET {set} WHERE id IN (SELECT id FROM runs \
             WHERE tenant_id = $1 AND status = $2 LIMIT $3)"
        )))
        .bind(tenant)
        .bind(from)
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn delta_rows(pool: &PgPool, tenant: Uuid) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tenant_active_deltas WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn the_deltas_follow_every_way_a_run_starts_and_stops_being_active(pool: PgPool) {
        let a = tenant(&pool).await;
        let b = tenant(&pool).await;
        let mut conn = pool.acquire().await.unwrap();
        insert_runs(&mut conn, a, "queued", 6).await;
        insert_runs(&mut conn, b, "waiting_for_thread", 2).await;
        drop(conn);
        assert_eq!(count(&pool, a).await.unwrap(), 6);
        assert_eq!(count(&pool, b).await.unwrap(), 0);

        const RUNNING: &str =
            "status = 'running', lease_owner = 'w', lease_expires_at = now() + interval '1 minute'";
        // Claims and a pause: still active.
        change(&pool, a, "queued", 4, RUNNING).await;
        change(&pool, a, "running", 1, "status = 'waiting_for_input', lease_owner = NULL, lease_expires_at = NULL, pending = '{}'").await;
        assert_eq!(count(&pool, a).await.unwrap(), 6);
        // A planner waiting for its tasks has not ended either, nor when it runs again.
        change(
            &pool,
            a,
            "running",
            1,
            "status = 'waiting_for_tasks', lease_owner = NULL, lease_expires_at = NULL",
        )
        .await;
        assert_eq!(count(&pool, a).await.unwrap(), 6);
        change(&pool, a, "waiting_for_tasks", 1, RUNNING).await;
        assert_eq!(count(&pool, a).await.unwrap(), 6);
        // Ends of each kind, a promotion, an active run deleted, a finished one deleted.
        change(&pool, a, "running", 1, "status = 'failed', lease_owner = NULL, lease_expires_at = NULL, finished_at = now(), error = '{}'").await;
        change(&pool, a, "running", 1, "status = 'completed', lease_owner = NULL, lease_expires_at = NULL, finished_at = now()").await;
        change(
            &pool,
            a,
            "queued",
            1,
            "status = 'cancelled', finished_at = now()",
        )
        .await;
        change(
            &pool,
            b,
            "waiting_for_thread",
            1,
            "status = 'queued', queued_input = NULL",
        )
        .await;
        sqlx::query("DELETE FROM runs WHERE tenant_id = $1 AND status IN ('waiting_for_input', 'completed')")
            .bind(a)
            .execute(&pool)
            .await
            .unwrap();
        for t in [a, b] {
            assert_eq!(
                count(&pool, t).await.unwrap(),
                counted(&pool, t).await,
                "{t}"
            );
        }
        assert_eq!(count(&pool, a).await.unwrap(), 2);
        assert_eq!(count(&pool, b).await.unwrap(), 1);

        // Folding keeps every sum and leaves one row per tenant (none for a sum of 0).
        assert!(fold(&pool, 100).await.unwrap() > 0);
        assert_eq!(delta_rows(&pool, a).await, 1);
        assert_eq!(delta_rows(&pool, b).await, 1);
        assert_eq!(count(&pool, a).await.unwrap(), 2);
        assert_eq!(count(&pool, b).await.unwrap(), 1);
        change(&pool, a, "running", 10, "status = 'completed', lease_owner = NULL, lease_expires_at = NULL, finished_at = now()").await;
        change(
            &pool,
            a,
            "queued",
            10,
            "status = 'cancelled', finished_at = now()",
        )
        .await;
        fold(&pool, 100).await.unwrap();
        assert_eq!(count(&pool, a).await.unwrap(), 0);
        assert_eq!(delta_rows(&pool, a).await, 0);
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_reservation_refuses_past_the_limit_and_counts_after_a_concurrent_one(pool: PgPool) {
        let a = tenant(&pool).await;
        insert_runs(&mut pool.acquire().await.unwrap(), a, "queued", 2).await;
        assert!(matches!(
            reserve(&mut pool.begin().await.unwrap(), a, 2, 1).await,
            Err(StoreError::TooManyActiveRuns { active: 2, .. })
        ));
        // A create holds the lock until its run is committed; a second one counts after it.
        let mut first = pool.begin().await.unwrap();
        reserve(&mut first, a, 3, 1).await.unwrap();
        let second = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                reserve(&mut tx, a, 3, 1).await
            })
        };
        insert_runs(&mut first, a, "queued", 1).await;
        first.commit().await.unwrap();
        assert!(matches!(
            second.await.unwrap(),
            Err(StoreError::TooManyActiveRuns { active: 3, .. })
        ));
    }
}
