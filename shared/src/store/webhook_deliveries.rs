//! The outbox's deliveries: claiming due ones, recording attempts, listing them.
//!
//! A claim takes due rows with `FOR UPDATE SKIP LOCKED` (replicas never take the same row at
//! once), counts the attempt and pushes `next_attempt_at` one lease ahead: if the claimer dies
//! before it records the outcome, the row is due again when the lease ends, for any replica.
//! An outcome is recorded only by the attempt that claimed it (`attempts` is the fence), so a
//! sender slower than its lease cannot overwrite a later attempt's outcome.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

/// A delivery claimed for one attempt.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub id: Uuid,
    pub endpoint_id: Uuid,
    pub tenant_id: Uuid,
    pub url: String,
    /// The endpoint's secret if still plain (written before sealing), else none.
    pub secret: Option<String>,
    /// The endpoint's sealed secret (`webhooks::stored_secret` opens either form).
    pub secret_sealed: Option<Vec<u8>>,
    /// The body exactly as it is sent (and signed).
    pub body: String,
    /// This attempt's number (1 for the first).
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// Claims up to `limit` due deliveries for one attempt each, reserving them for `lease`,
/// every tenant alike ([`claim_due_shared`] with no tenant busy and no share).
pub async fn claim_due(
    pool: &PgPool,
    limit: usize,
    lease: Duration,
) -> Result<Vec<Claimed>, StoreError> {
    claim_due_shared(pool, limit, lease, limit, &[]).await
}

/// Due deliveries per tenant (pending ones by due time: migration 0032), found one tenant
/// after another; then, per tenant with room, its oldest due rows up to that room (locked,
/// skipping rows another claimer holds); of those, the rows of the least busy tenants first,
/// then the oldest. So a tenant never holds more than `per_tenant` of the claimer's slots, and a
/// tenant with nothing in flight is served before one more delivery of a busy tenant.
const CLAIM_SHARED: &str = "
WITH RECURSIVE tenant AS (
    (SELECT tenant_id FROM webhook_deliveries
      WHERE status = 'pending' AND next_attempt_at <= now()
      ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.tenant_id FROM webhook_deliveries d
             WHERE d.status = 'pending' AND d.next_attempt_at <= now()
               AND d.tenant_id > tenant.tenant_id
             ORDER BY d.tenant_id LIMIT 1)
      FROM tenant WHERE tenant.tenant_id IS NOT NULL),
 room AS (
    SELECT t.tenant_id, coalesce(b.busy, 0) AS busy
      FROM tenant t LEFT JOIN UNNEST($3::uuid[], $4::int8[]) AS b(tenant_id, busy)
           ON b.tenant_id = t.tenant_id
     WHERE t.tenant_id IS NOT NULL AND coalesce(b.busy, 0) < $5),
 candidate AS (
    SELECT c.id, c.next_attempt_at,
           room.busy + row_number() OVER (PARTITION BY room.tenant_id
                                          ORDER BY c.next_attempt_at) AS load
      FROM room CROSS JOIN LATERAL (
           SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
            WHERE d.tenant_id = room.tenant_id AND d.status = 'pending'
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at
            LIMIT $5 - room.busy
            FOR UPDATE SKIP LOCKED) c),
 due AS (
    SELECT id FROM candidate ORDER BY load, next_attempt_at LIMIT $1)
UPDATE webhook_deliveries d
   SET attempts = d.attempts + 1,
       next_attempt_at = now() + make_interval(secs => $2),
       last_attempt_at = now()
  FROM due, webhook_endpoints e
 WHERE d.id = due.id AND e.id = d.endpoint_id
RETURNING d.id, d.endpoint_id, d.tenant_id, e.url, e.secret, e.secret_sealed,
          d.body::text AS body, d.attempts, d.created_at";

/// Claims up to `limit` due deliveries for one attempt each, reserving them for `lease`, with
/// each tenant's share: `busy` says how many attempts of which tenants the claimer has in
/// flight, and no tenant gets more than `per_tenant` in all (see [`CLAIM_SHARED`]).
pub async fn claim_due_shared(
    pool: &PgPool,
    limit: usize,
    lease: Duration,
    per_tenant: usize,
    busy: &[(Uuid, u64)],
) -> Result<Vec<Claimed>, StoreError> {
    let (tenants, counts): (Vec<Uuid>, Vec<i64>) = busy
        .iter()
        .map(|(t, n)| (*t, i64::try_from(*n).unwrap_or(i64::MAX)))
        .unzip();
    Ok(sqlx::query_as::<_, Claimed>(CLAIM_SHARED)
        .bind(limit as i64)
        .bind(lease.as_secs_f64())
        .bind(&tenants)
        .bind(&counts)
        .bind(per_tenant as i64)
        .fetch_all(pool)
        .await?)
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx answer: delivered.
    Delivered { status_code: u16 },
    /// Anything else; retried at `retry_in` unless `give_up`.
    Failed {
        status_code: Option<u16>,
        error: String,
        retry_in: Duration,
        give_up: bool,
    },
}

/// Longest `last_error` kept (characters).
pub const MAX_ERROR_CHARS: usize = 500;

/// Records the outcome of attempt `attempt` of delivery `id`. Returns whether it was recorded
/// (false: the delivery was deleted with its endpoint, or a later attempt holds it).
pub async fn record(
    pool: &PgPool,
    id: Uuid,
    attempt: i32,
    outcome: &Outcome,
) -> Result<bool, StoreError> {
    let done = match outcome {
        Outcome::Delivered { status_code } => {
            sqlx::query(
                "UPDATE webhook_deliveries
                SET status = 'delivered', finished_at = now(), last_status_code = $3,
                    last_error = NULL
              WHERE id = $1 AND attempts = $2 AND status = 'pending'",
            )
            .bind(id)
            .bind(attempt)
            .bind(i32::from(*status_code))
            .execute(pool)
            .await?
        }
        Outcome::Failed {
            status_code,
            error,
            retry_in,
            give_up,
        } => {
            let error: String = error.chars().take(MAX_ERROR_CHARS).collect();
            sqlx::query(
                "UPDATE webhook_deliveries
                    SET status = CASE WHEN $5 THEN 'failed' ELSE 'pending' END,
                        finished_at = CASE WHEN $5 THEN now() END,
                        next_attempt_at = now() + make_interval(secs => $6),
                        last_status_code = $3, last_error = $4
                  WHERE id = $1 AND attempts = $2 AND status = 'pending'",
            )
            .bind(id)
            .bind(attempt)
            .bind(status_code.map(i32::from))
            .bind(error)
            .bind(give_up)
            .bind(retry_in.as_secs_f64())
            .execute(pool)
            .await?
        }
    };
    Ok(done.rows_affected() == 1)
}

/// Deletes up to `limit` deliveries that finished (delivered or given up) more than `age` ago;
/// returns how many.
pub async fn purge_finished(pool: &PgPool, age: Duration, limit: i64) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "DELETE FROM webhook_deliveries WHERE id IN (
            SELECT id FROM webhook_deliveries
             WHERE status <> 'pending' AND finished_at < now() - make_interval(secs => $1)
             LIMIT $2)",
    )
    .bind(age.as_secs_f64())
    .bind(limit)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// The retry schedule.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    /// Give up once a delivery is this old, or has had `max_attempts` attempts.
    pub retry_for: Duration,
    pub max_attempts: i32,
}

impl Backoff {
    /// The delay after failed attempt `attempt` (1-based): `base · 2^(attempt−1)`, capped at
    /// `max`, then drawn uniformly from its upper half (jitter, so the deliveries of one outage
    /// do not all come back at once), and never past the delivery's deadline.
    pub fn delay(&self, attempt: i32, age: Duration) -> Duration {
        let exp = attempt.saturating_sub(1).clamp(0, 30) as u32;
        let full = self.base.saturating_mul(1 << exp).min(self.max);
        let jittered = full.mul_f64(rand::rng().random_range(0.5..=1.0));
        let left = self.retry_for.saturating_sub(age);
        jittered.min(left)
    }

    /// Whether a delivery that failed attempt `attempt` at age `age` is given up.
    pub fn gives_up(&self, attempt: i32, age: Duration) -> bool {
        attempt >= self.max_attempts || age >= self.retry_for
    }
}

/// What a manual retry found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retried {
    /// Due now again (it was delivered or given up); its id and body are unchanged.
    Now(DeliveryInfo),
    /// Still pending: it is retried anyway.
    AlreadyPending,
    NotFound,
}

/// Makes a delivered or given-up delivery of `endpoint` due again at once (same id, same
/// body: a receiver that deduplicates sees it as a repeat).
pub async fn retry(pool: &PgPool, endpoint: Uuid, id: Uuid) -> Result<Retried, StoreError> {
    let row = sqlx::query_as::<_, DeliveryInfo>(
        "WITH found AS (
            SELECT id, status FROM webhook_deliveries WHERE id = $2 AND endpoint_id = $1
            FOR UPDATE),
         again AS (
            UPDATE webhook_deliveries d
               SET status = 'pending', finished_at = NULL, next_attempt_at = now()
              FROM found WHERE d.id = found.id AND found.status <> 'pending'
            RETURNING d.*)
         SELECT id, endpoint_id, event, status, attempts, last_status_code, last_error,
                next_attempt_at, last_attempt_at, created_at, finished_at
           FROM again",
    )
    .bind(endpoint)
    .bind(id)
    .fetch_optional(pool)
    .await?;
    if let Some(row) = row {
        return Ok(Retried::Now(row));
    }
    let exists: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM webhook_deliveries WHERE id = $2 AND endpoint_id = $1")
            .bind(endpoint)
            .bind(id)
            .fetch_optional(pool)
            .await?;
    Ok(match exists {
        Some(_) => Retried::AlreadyPending,
        None => Retried::NotFound,
    })
}

/// One delivery as its tenant sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DeliveryInfo {
    /// The stable id: the `webhook-id` header of every attempt.
    pub id: Uuid,
    pub endpoint_id: Uuid,
    /// The event type (the body's `type`).
    pub event: String,
    /// `pending` (to be tried at `next_attempt_at`), `delivered` or `failed` (given up).
    pub status: String,
    pub attempts: i32,
    pub last_status_code: Option<i32>,
    /// Why the last attempt failed (truncated), if it did.
    pub last_error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// An endpoint's deliveries, newest first, before the cursor `(created_at, id)` if given.
pub async fn list(
    pool: &PgPool,
    endpoint: Uuid,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<DeliveryInfo>, StoreError> {
    let (at, id) = before.unzip();
    Ok(sqlx::query_as::<_, DeliveryInfo>(
        "SELECT id, endpoint_id, event, status, attempts, last_status_code, last_error,
                CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at,
                last_attempt_at, created_at, finished_at
           FROM webhook_deliveries
          WHERE endpoint_id = $1
            AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
          ORDER BY created_at DESC, id DESC
          LIMIT $4",
    )
    .bind(endpoint)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::RunStatus;
    use crate::store::webhooks::{self, NewEndpoint};
    use crate::store::{tenants, transitions};
    use sqlx::Row;

    const LEASE: Duration = Duration::from_secs(30);

    fn backoff() -> Backoff {
        Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(3600),
            retry_for: Duration::from_secs(86_400),
            max_attempts: 100,
        }
    }

    #[test]
    fn the_backoff_doubles_with_jitter_up_to_its_cap_and_the_deadline() {
        let b = backoff();
        for _ in 0..50 {
            let d = b.delay(1, Duration::ZERO);
            assert!(
                d >= Duration::from_millis(2500) && d <= Duration::from_secs(5),
                "{d:?}"
            );
            let d = b.delay(4, Duration::ZERO);
            assert!(
                d >= Duration::from_secs(20) && d <= Duration::from_secs(40),
                "{d:?}"
            );
            let d = b.delay(60, Duration::ZERO);
            assert!(
                d >= Duration::from_secs(1800) && d <= Duration::from_secs(3600),
                "{d:?}"
            );
        }
        let near_end = Duration::from_secs(86_400 - 10);
        assert!(b.delay(30, near_end) <= Duration::from_secs(10));
        assert!(!b.gives_up(3, Duration::from_secs(100)));
        assert!(b.gives_up(3, Duration::from_secs(86_400)));
        assert!(b.gives_up(100, Duration::ZERO));
    }

    async fn tenant_with_endpoint(pool: &PgPool, events: &[&str]) -> (Uuid, Uuid) {
        let tenant = tenants::create(pool, "hooks").await.unwrap().tenant_id;
        let endpoint = webhooks::create_endpoint(
            pool,
            NewEndpoint {
                tenant_id: tenant,
                url: "https://hooks.example/in".into(),
                events: events.iter().map(|e| e.to_string()).collect(),
                secret: webhooks::generate_secret(),
                description: String::new(),
            },
            &[9u8; 32],
            5,
        )
        .await
        .unwrap();
        (tenant, endpoint.id)
    }

    async fn new_run(pool: &PgPool, tenant: Uuid) -> Uuid {
        let run = transitions::create_on_new_thread(
            pool,
            transitions::NewRun {
                id: Uuid::now_v7(),
                tenant_id: tenant,
                thread_id: None,
                agent: serde_json::from_value(serde_json::json!({"model": "m"})).unwrap(),
                max_iterations: 5,
                metadata: serde_json::json!({"k": "v"}),
                idempotency_key: None,
                request_hash: None,
                input: "hi".into(),
                fair: false,
                share: None,
                traceparent: None,
            },
        )
        .await
        .unwrap();
        run.id
    }

    async fn bodies(pool: &PgPool) -> Vec<serde_json::Value> {
        sqlx::query("SELECT body FROM webhook_deliveries ORDER BY created_at, event")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.get::<serde_json::Value, _>(0))
            .collect()
    }

    /// The trigger: a subscribed transition writes one delivery per endpoint in its own
    /// transaction; other transitions, other tenants and rolled-back changes write none.
    #[sqlx::test(migrations = "../migrations")]
    async fn status_changes_write_deliveries_in_their_own_transaction(pool: PgPool) {
        let (tenant, _) = tenant_with_endpoint(&pool, &["run.completed", "run.cancelled"]).await;
        let quiet = tenants::create(&pool, "no hooks").await.unwrap().tenant_id;
        let run = new_run(&pool, tenant).await;
        let other = new_run(&pool, quiet).await;
        let claimed = transitions::claim(&pool, run, "w", LEASE)
            .await
            .unwrap()
            .unwrap();
        transitions::claim(&pool, other, "w", LEASE)
            .await
            .unwrap()
            .unwrap();
        assert!(
            bodies(&pool).await.is_empty(),
            "queued -> running is not an event"
        );

        // A cancel that rolls back writes nothing.
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("UPDATE runs SET status = 'cancelled', lease_owner = NULL, lease_expires_at = NULL, finished_at = now() WHERE id = $1")
            .bind(run)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert!(bodies(&pool).await.is_empty(), "rolled back");

        transitions::complete(&pool, claimed.fence(), 3)
            .await
            .unwrap();
        let other_fence = crate::store::Fence {
            run_id: other,
            attempt: 1,
        };
        transitions::complete(&pool, other_fence, 3).await.unwrap();
        let written = bodies(&pool).await;
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0]["type"], "run.completed");
        assert_eq!(written[0]["data"]["run_id"], run.to_string());
        assert_eq!(written[0]["data"]["status"], "completed");
        assert_eq!(written[0]["data"]["previous_status"], "running");
        assert_eq!(
            written[0]["data"]["metadata"],
            serde_json::json!({"k": "v"})
        );
        assert!(written[0]["timestamp"].as_str().unwrap().ends_with('Z'));
        assert!(
            chrono::DateTime::parse_from_rfc3339(written[0]["timestamp"].as_str().unwrap()).is_ok()
        );
        // A failed run's event is not subscribed here.
        let failing = new_run(&pool, tenant).await;
        let c = transitions::claim(&pool, failing, "w", LEASE)
            .await
            .unwrap()
            .unwrap();
        transitions::fail(&pool, c.fence(), "x", "boom", 1)
            .await
            .unwrap();
        assert_eq!(bodies(&pool).await.len(), 1);
        let _ = RunStatus::Failed;
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn enqueue_writes_for_subscribed_endpoints_only(pool: PgPool) {
        let (tenant, _) = tenant_with_endpoint(&pool, &["batch.completed"]).await;
        tenant_with_endpoint(&pool, &["run.completed"]).await;
        let mut tx = pool.begin().await.unwrap();
        let n = webhooks::enqueue(
            &mut tx,
            tenant,
            "batch.completed",
            serde_json::json!({"batch_id": "b"}),
        )
        .await
        .unwrap();
        assert_eq!(n, 1);
        let n = webhooks::enqueue(&mut tx, tenant, "run.completed", serde_json::json!({}))
            .await
            .unwrap();
        assert_eq!(n, 0);
        tx.commit().await.unwrap();
        let written = bodies(&pool).await;
        assert_eq!(written.len(), 1);
        assert_eq!(written[0]["type"], "batch.completed");
        assert_eq!(written[0]["data"]["batch_id"], "b");
    }

    /// A claim reserves a row for its lease; a claimer that dies leaves it due again after
    /// the lease; only the claiming attempt records an outcome.
    #[sqlx::test(migrations = "../migrations")]
    async fn claims_lease_rows_and_outcomes_are_fenced_by_the_attempt(pool: PgPool) {
        let (tenant, endpoint) = tenant_with_endpoint(&pool, &["batch.completed"]).await;
        let mut conn = pool.acquire().await.unwrap();
        webhooks::enqueue(&mut conn, tenant, "batch.completed", serde_json::json!({}))
            .await
            .unwrap();
        drop(conn);
        let first = claim_due(&pool, 10, LEASE).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].attempts, 1);
        assert_eq!(first[0].url, "https://hooks.example/in");
        assert!(
            claim_due(&pool, 10, LEASE).await.unwrap().is_empty(),
            "leased"
        );
        // The claimer died: the lease ends.
        sqlx::query("UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 ms'")
            .execute(&pool)
            .await
            .unwrap();
        let second = claim_due(&pool, 10, LEASE).await.unwrap();
        assert_eq!((second[0].id, second[0].attempts), (first[0].id, 2));
        assert_eq!(
            second[0].body, first[0].body,
            "the same bytes on every attempt"
        );
        let stale = Outcome::Delivered { status_code: 200 };
        assert!(!record(&pool, first[0].id, 1, &stale).await.unwrap());
        let failed = Outcome::Failed {
            status_code: Some(500),
            error: "x".repeat(2000),
            retry_in: Duration::from_secs(60),
            give_up: false,
        };
        assert!(record(&pool, second[0].id, 2, &failed).await.unwrap());
        assert_eq!(
            retry(&pool, endpoint, second[0].id).await.unwrap(),
            Retried::AlreadyPending
        );
        assert_eq!(
            retry(&pool, endpoint, Uuid::now_v7()).await.unwrap(),
            Retried::NotFound
        );
        let listed = list(&pool, endpoint, None, 10).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (
                listed[0].status.as_str(),
                listed[0].attempts,
                listed[0].last_status_code
            ),
            ("pending", 2, Some(500))
        );
        assert_eq!(
            listed[0].last_error.as_ref().unwrap().len(),
            MAX_ERROR_CHARS
        );
        assert!(listed[0].next_attempt_at.unwrap() > Utc::now());
        assert!(
            claim_due(&pool, 10, LEASE).await.unwrap().is_empty(),
            "not due yet"
        );
        sqlx::query("UPDATE webhook_deliveries SET next_attempt_at = now()")
            .execute(&pool)
            .await
            .unwrap();
        let third = claim_due(&pool, 10, LEASE).await.unwrap();
        let ok = Outcome::Delivered { status_code: 204 };
        assert!(record(&pool, third[0].id, 3, &ok).await.unwrap());
        let listed = list(&pool, endpoint, None, 10).await.unwrap();
        assert_eq!(listed[0].status, "delivered");
        assert!(listed[0].next_attempt_at.is_none());
        assert!(claim_due(&pool, 10, LEASE).await.unwrap().is_empty());
        // A manual retry makes it due again under the same id.
        let Retried::Now(again) = retry(&pool, endpoint, third[0].id).await.unwrap() else {
            panic!("a delivered delivery can be retried");
        };
        assert_eq!((again.status.as_str(), again.attempts), ("pending", 3));
        let fourth = claim_due(&pool, 10, LEASE).await.unwrap();
        assert_eq!((fourth[0].id, fourth[0].attempts), (third[0].id, 4));
        // Finished deliveries are kept for a while, then removed.
        assert_eq!(
            purge_finished(&pool, Duration::from_secs(60), 10)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            purge_finished(&pool, Duration::ZERO, 10).await.unwrap(),
            0,
            "pending again"
        );
        // Deleting the endpoint deletes its deliveries.
        webhooks::delete_endpoint(&pool, tenant, endpoint)
            .await
            .unwrap();
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM webhook_deliveries")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 0);
    }

    /// Finished deliveries are kept for `webhooks.keep_finished_ms`, then removed; pending
    /// ones never are.
    #[sqlx::test(migrations = "../migrations")]
    async fn finished_deliveries_are_purged_after_their_keep(pool: PgPool) {
        let (tenant, _) = tenant_with_endpoint(&pool, &["batch.completed"]).await;
        let mut conn = pool.acquire().await.unwrap();
        for _ in 0..2 {
            webhooks::enqueue(&mut conn, tenant, "batch.completed", serde_json::json!({}))
                .await
                .unwrap();
        }
        drop(conn);
        let claimed = claim_due(&pool, 1, LEASE).await.unwrap();
        let ok = Outcome::Delivered { status_code: 200 };
        assert!(record(&pool, claimed[0].id, 1, &ok).await.unwrap());
        let keep = Duration::from_secs(60);
        assert_eq!(purge_finished(&pool, keep, 10).await.unwrap(), 0, "kept");
        assert_eq!(purge_finished(&pool, Duration::ZERO, 10).await.unwrap(), 1);
        let (left,): (String,) = sqlx::query_as("SELECT status FROM webhook_deliveries")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(left, "pending");
    }
}
