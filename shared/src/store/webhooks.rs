//! Webhook endpoints and the delivery outbox (migration `0009_webhooks.sql`).
//!
//! A run's status change writes its deliveries itself: the trigger `runs_webhooks` inserts one
//! row per subscribed endpoint in the transaction of the change. Other events (a batch's end)
//! call [`enqueue`] inside the transaction that records them. Either way a delivery exists
//! exactly when its change committed. The API's deliverer claims due rows
//! ([`super::webhook_deliveries`]), sends them and records each attempt.
//!
//! Secrets are kept sealed (`crate::seal`, migration 0029) under `webhooks.encryption_key`,
//! the endpoint's id as associated data. Rows written before sealing existed keep their secret
//! in the plain column until [`seal_plain`] (run by every API replica with the key) seals them.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::StoreError;
use crate::seal;

/// Every event an endpoint may subscribe to. The `run.*` names are `run.<status>`, written by
/// the trigger; `batch.completed` by [`enqueue`].
pub const EVENTS: [&str; 6] = [
    "run.waiting_for_input",
    "run.waiting_for_confirmation",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "batch.completed",
];

pub const SECRET_PREFIX: &str = "whsec_";
/// Key bytes of a secret: at least 24 (Standard Webhooks), at most 64 (HMAC-SHA256's block).
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A fresh secret: `whsec_` and the base64 of 32 random bytes.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// The HMAC key of a secret (`whsec_<base64>`), or why it is not one.
pub fn secret_key(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret
        .strip_prefix(SECRET_PREFIX)
        .ok_or("must start with `whsec_`")?;
    let key = STANDARD
        .decode(encoded)
        .map_err(|_| "must be `whsec_` followed by standard base64")?;
    if !SECRET_BYTES.contains(&key.len()) {
        return Err(format!(
            "must encode {} to {} bytes",
            SECRET_BYTES.start(),
            SECRET_BYTES.end()
        ));
    }
    Ok(key)
}

/// An endpoint as its tenant sees it: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Endpoint {
    pub id: Uuid,
    pub url: String,
    /// The events delivered to it.
    pub events: Vec<String>,
    pub description: String,
    pub created_at: DateTime<Utc>,
}

const ENDPOINT_COLUMNS: &str = "id, url, events, description, created_at";

pub struct NewEndpoint {
    pub tenant_id: Uuid,
    pub url: String,
    pub events: Vec<String>,
    /// The secret as issued (`whsec_…`); stored sealed only.
    pub secret: String,
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateEndpointError {
    #[error("the tenant has {0} endpoints already")]
    TooMany(u32),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CreateEndpointError {
    fn from(e: sqlx::Error) -> Self {
        CreateEndpointError::Store(e.into())
    }
}

/// The stored form of an endpoint's secret: sealed under `key`, bound to the endpoint `id`.
pub fn seal_secret(key: &[u8; 32], id: Uuid, secret: &str) -> Vec<u8> {
    seal::seal(key, id.as_bytes(), secret.as_bytes())
}

/// The secret of endpoint `id` as stored: sealed (opened with `key`), or plain (a row written
/// before sealing, not yet sealed).
pub fn stored_secret(
    id: Uuid,
    plain: Option<&str>,
    sealed: Option<&[u8]>,
    key: Option<&[u8; 32]>,
) -> Result<String, &'static str> {
    match (plain, sealed) {
        (Some(plain), _) => Ok(plain.to_owned()),
        (None, Some(sealed)) => {
            let key = key.ok_or("the secret is sealed and webhooks.encryption_key is not set")?;
            let opened = seal::open(key, id.as_bytes(), sealed)
                .map_err(|_| "the sealed secret does not open with webhooks.encryption_key")?;
            String::from_utf8(opened).map_err(|_| "the sealed secret is not text")
        }
        (None, None) => Err("the endpoint has no secret"),
    }
}

/// Registers an endpoint unless its tenant has `max` already, its secret sealed under `key`.
/// The tenant row is locked so that two registrations at once count one after the other.
pub async fn create_endpoint(
    pool: &PgPool,
    new: NewEndpoint,
    key: &[u8; 32],
    max: u32,
) -> Result<Endpoint, CreateEndpointError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(new.tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_endpoints WHERE tenant_id = $1")
            .bind(new.tenant_id)
            .fetch_one(&mut *tx)
            .await?;
    if n >= i64::from(max) {
        return Err(CreateEndpointError::TooMany(max));
    }
    let id = Uuid::now_v7();
    let endpoint = sqlx::query_as::<_, Endpoint>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret_sealed, description)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {ENDPOINT_COLUMNS}"
    )))
    .bind(id)
    .bind(new.tenant_id)
    .bind(&new.url)
    .bind(&new.events)
    .bind(seal_secret(key, id, &new.secret))
    .bind(&new.description)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(endpoint)
}

/// A tenant's endpoints, oldest first (at most `webhooks.max_endpoints_per_tenant`).
pub async fn list_endpoints(pool: &PgPool, tenant: Uuid) -> Result<Vec<Endpoint>, StoreError> {
    Ok(sqlx::query_as::<_, Endpoint>(sqlx::AssertSqlSafe(format!(
        "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE tenant_id = $1
         ORDER BY created_at, id"
    )))
    .bind(tenant)
    .fetch_all(pool)
    .await?)
}

/// One endpoint of a tenant; another tenant's is simply not found.
pub async fn get_endpoint(pool: &PgPool, tenant: Uuid, id: Uuid) -> Result<Endpoint, StoreError> {
    sqlx::query_as::<_, Endpoint>(sqlx::AssertSqlSafe(format!(
        "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = $1 AND tenant_id = $2"
    )))
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?
    .ok_or(StoreError::NotFound)
}

/// Replaces an endpoint's secret, sealed under `key` (a plain one is cleared); every attempt
/// from now on (retries of earlier deliveries included) is signed with the new one.
pub async fn set_secret(
    pool: &PgPool,
    tenant: Uuid,
    id: Uuid,
    secret: &str,
    key: &[u8; 32],
) -> Result<Endpoint, StoreError> {
    sqlx::query_as::<_, Endpoint>(sqlx::AssertSqlSafe(format!(
        "UPDATE webhook_endpoints SET secret = NULL, secret_sealed = $3
         WHERE id = $1 AND tenant_id = $2
         RETURNING {ENDPOINT_COLUMNS}"
    )))
    .bind(id)
    .bind(tenant)
    .bind(seal_secret(key, id, secret))
    .fetch_optional(pool)
    .await?
    .ok_or(StoreError::NotFound)
}

/// Deletes an endpoint and, with it, its deliveries: pending ones are never sent (an attempt
/// in flight at that moment still completes, and its outcome is recorded nowhere).
pub async fn delete_endpoint(
    pool: &PgPool,
    tenant: Uuid,
    id: Uuid,
) -> Result<Endpoint, StoreError> {
    sqlx::query_as::<_, Endpoint>(sqlx::AssertSqlSafe(format!(
        "DELETE FROM webhook_endpoints WHERE id = $1 AND tenant_id = $2
         RETURNING {ENDPOINT_COLUMNS}"
    )))
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?
    .ok_or(StoreError::NotFound)
}

/// Seals up to `batch` endpoints whose secret is still plain and clears their plain column,
/// in one transaction; returns how many. Rows are taken `FOR UPDATE SKIP LOCKED` and written
/// only while still plain, so replicas running it at once seal each row once, and running it
/// again after the last plain row is gone does nothing.
pub async fn seal_plain(pool: &PgPool, key: &[u8; 32], batch: u32) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let rows: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT id, secret FROM webhook_endpoints WHERE secret IS NOT NULL
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(i64::from(batch))
    .fetch_all(&mut *tx)
    .await?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut sealed = Vec::with_capacity(rows.len());
    for (id, secret) in &rows {
        ids.push(*id);
        sealed.push(seal_secret(key, *id, secret));
    }
    let done = sqlx::query(
        "UPDATE webhook_endpoints e SET secret = NULL, secret_sealed = s.sealed
           FROM unnest($1::uuid[], $2::bytea[]) AS s(id, sealed)
          WHERE e.id = s.id AND e.secret IS NOT NULL",
    )
    .bind(&ids)
    .bind(&sealed)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(done)
}

/// How many endpoints still keep their secret plain (written before sealing, not sealed yet).
pub async fn count_plain(pool: &PgPool) -> Result<i64, StoreError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_endpoints WHERE secret IS NOT NULL")
            .fetch_one(pool)
            .await?;
    Ok(n)
}

/// Writes one delivery of `event` per endpoint of `tenant` subscribed to it, on `conn`: call
/// it inside the transaction that records the change, so the deliveries commit (and are sent)
/// exactly when the change does. `data` becomes the body's `data`. Returns the deliveries
/// written (0 for a tenant without such an endpoint: one index probe).
pub async fn enqueue(
    conn: &mut PgConnection,
    tenant: Uuid,
    event: &str,
    data: serde_json::Value,
) -> Result<u64, StoreError> {
    debug_assert!(EVENTS.contains(&event), "unknown webhook event {event}");
    let done = sqlx::query(
        "WITH written AS (
            INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event, body)
            SELECT gen_random_uuid(), e.id, e.tenant_id, $2,
                   jsonb_build_object('type', $2::text,
                       'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                       'data', $3::jsonb)
              FROM webhook_endpoints e
             WHERE e.tenant_id = $1 AND $2 = ANY (e.events)
            RETURNING 1)
         SELECT count(*), CASE WHEN count(*) > 0
                               THEN pg_notify('agentfleet_webhooks', '') END IS NULL
           FROM written",
    )
    .bind(tenant)
    .bind(event)
    .bind(sqlx::types::Json(data))
    .fetch_one(&mut *conn)
    .await?;
    use sqlx::Row;
    Ok(done.get::<i64, _>(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_whsec_base64_of_enough_bytes() {
        let s = generate_secret();
        assert_eq!(secret_key(&s).unwrap().len(), 32);
        assert!(secret_key("whsec_").is_err());
        assert!(secret_key("whsec_!!!").is_err());
        assert!(secret_key(&format!("whsec_{}", STANDARD.encode([1u8; 16]))).is_err());
        assert!(secret_key(&STANDARD.encode([1u8; 32])).is_err());
        assert_eq!(
            secret_key(&format!("whsec_{}", STANDARD.encode([7u8; 24]))).unwrap(),
            [7u8; 24]
        );
    }

    #[test]
    fn a_sealed_secret_opens_for_its_endpoint_only() {
        let (key, id, secret) = ([3u8; 32], Uuid::now_v7(), generate_secret());
        let sealed = seal_secret(&key, id, &secret);
        assert!(
            !sealed
                .windows(8)
                .any(|w| secret.as_bytes().windows(8).any(|s| s == w))
        );
        assert_eq!(
            stored_secret(id, None, Some(&sealed), Some(&key)),
            Ok(secret.clone())
        );
        assert!(stored_secret(Uuid::now_v7(), None, Some(&sealed), Some(&key)).is_err());
        assert!(stored_secret(id, None, Some(&sealed), None).is_err());
        assert!(stored_secret(id, None, Some(&sealed), Some(&[4u8; 32])).is_err());
        assert_eq!(stored_secret(id, Some(&secret), None, None), Ok(secret));
    }
}
