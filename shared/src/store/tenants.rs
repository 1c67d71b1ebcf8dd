//! Tenants and API keys. Only a SHA-256 of a key is stored.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use super::keys::hash_key;
use crate::domain::{LimitOverrides, RetentionOverrides};

pub struct CreatedTenant {
    pub tenant_id: Uuid,
    pub key_id: Uuid,
    /// Shown once; only its hash is kept.
    pub api_key: String,
}

/// Makes a tenant and its first key (named `default`). The caller has checked `name`
/// ([`super::keys::check_name`]).
pub async fn create(pool: &PgPool, name: &str) -> Result<CreatedTenant, StoreError> {
    let tenant_id = Uuid::now_v7();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2)")
        .bind(tenant_id)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    let created = super::keys::insert(&mut tx, tenant_id, "default", None).await?;
    tx.commit().await?;
    Ok(CreatedTenant {
        tenant_id,
        key_id: created.key.id,
        api_key: created.api_key,
    })
}

/// The caller behind a key, with what its tenant may do (cached with the key, so a change of
/// limits or a suspension reaches every API replica within `api.auth_cache_ttl_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Principal {
    pub tenant_id: Uuid,
    pub key_id: Uuid,
    /// The tenant's own limits; [`LimitOverrides::over`] the configured defaults.
    pub limits: LimitOverrides,
    /// A suspended tenant's keys still read and cancel; nothing new starts.
    pub suspended: bool,
    /// When the key stops working. Checked on every request (`api/src/auth/caller.rs`), cached or
    /// not, so an expiry takes effect at once on every replica.
    pub expires_at: Option<DateTime<Utc>>,
}

impl Principal {
    /// Whether the key has expired by `now`.
    pub fn expired_at(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

pub async fn authenticate(pool: &PgPool, key: &str) -> Result<Option<Principal>, StoreError> {
    authenticate_hash(pool, &hash_key(key)).await
}

/// The principal of a key given its hash (see `hash_key`): none for an unknown, revoked or
/// expired key.
pub async fn authenticate_hash(
    pool: &PgPool,
    key_hash: &[u8],
) -> Result<Option<Principal>, StoreError> {
    let row: Option<PrincipalRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{PRINCIPAL_SELECT} AND k.key_hash = $1"
    )))
    .bind(key_hash)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(principal))
}

/// The principal of a key given its id (a stream token names the key that issued it): none
/// for an unknown, revoked or expired key.
pub async fn principal_of_key(
    pool: &PgPool,
    key_id: Uuid,
) -> Result<Option<Principal>, StoreError> {
    let row: Option<PrincipalRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{PRINCIPAL_SELECT} AND k.id = $1"
    )))
    .bind(key_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(principal))
}

/// A live key and its tenant (not erased); the caller adds which key.
const PRINCIPAL_SELECT: &str = "SELECT k.tenant_id, k.id, t.limits, t.suspended_at IS NOT NULL, k.expires_at \
     FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
     WHERE k.revoked_at IS NULL AND t.erased_at IS NULL \
       AND (k.expires_at IS NULL OR k.expires_at > now())";

type PrincipalRow = (
    Uuid,
    Uuid,
    sqlx::types::Json<LimitOverrides>,
    bool,
    Option<DateTime<Utc>>,
);

fn principal((tenant_id, key_id, limits, suspended, expires_at): PrincipalRow) -> Principal {
    Principal {
        tenant_id,
        key_id,
        limits: limits.0,
        suspended,
        expires_at,
    }
}

/// One tenant as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TenantInfo {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// Set while the tenant is suspended: its keys may read and cancel, nothing new starts.
    pub suspended_at: Option<DateTime<Utc>>,
    /// Only the limits set for this tenant; absent ones are the configured `[limits]`.
    #[schema(value_type = Object)]
    pub limits: LimitOverrides,
    /// Only the retention windows set for this tenant; absent ones are the configured
    /// `[retention]`.
    #[schema(value_type = Object)]
    pub retention: RetentionOverrides,
    /// Set when its erasure was requested (`DELETE /admin/v1/tenants/{id}`): its keys are
    /// refused, its data is being (or has been) removed, and the row stays as a tombstone
    /// (`GET /admin/v1/tenants/{id}/erasure`).
    pub erased_at: Option<DateTime<Utc>>,
}

type TenantRow = (
    Uuid,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    sqlx::types::Json<LimitOverrides>,
    sqlx::types::Json<RetentionOverrides>,
    Option<DateTime<Utc>>,
);

const TENANT_COLUMNS: &str = "id, name, created_at, suspended_at, limits, retention, erased_at";

fn tenant(
    (id, name, created_at, suspended_at, limits, retention, erased_at): TenantRow,
) -> TenantInfo {
    TenantInfo {
        id,
        name,
        created_at,
        suspended_at,
        limits: limits.0,
        retention: retention.0,
        erased_at,
    }
}

/// Tenants in creation order (ids are UUIDv7), `limit` of them after the tenant `after`.
pub async fn list(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<TenantInfo>, StoreError> {
    let rows: Vec<TenantRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {TENANT_COLUMNS} FROM tenants WHERE $1::uuid IS NULL OR id > $1 \
         ORDER BY id LIMIT $2"
    )))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(tenant).collect())
}

pub async fn get(pool: &PgPool, id: Uuid) -> Result<TenantInfo, StoreError> {
    let row: Option<TenantRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    row.map(tenant).ok_or(StoreError::NotFound)
}

/// Suspends (keeping the first `suspended_at`) or resumes a tenant. Reaches every API
/// replica within `api.auth_cache_ttl_ms` (the suspension travels with the cached key).
pub async fn set_suspended(
    pool: &PgPool,
    id: Uuid,
    suspended: bool,
) -> Result<TenantInfo, StoreError> {
    let mut tx = pool.begin().await?;
    let row: Option<TenantRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenants SET suspended_at = CASE WHEN $2 THEN COALESCE(suspended_at, now()) END \
         WHERE id = $1 AND erased_at IS NULL RETURNING {TENANT_COLUMNS}"
    )))
    .bind(id)
    .bind(suspended)
    .fetch_optional(&mut *tx)
    .await?;
    let row = row.ok_or(StoreError::NotFound)?;
    if suspended {
        // Nothing of it starts: its queued runs, dispatched or not, are held (a message
        // already in the queue then claims nothing); its running runs go on to their end.
        // Lifting the suspension leaves them to the next dispatch (`store::fair_dispatch`).
        sqlx::query(
            "UPDATE runs SET held = true, updated_at = now()
             WHERE tenant_id = $1 AND status = 'queued' AND NOT held",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(tenant(row))
}

/// The names of the per-tenant limits (the fields of [`LimitOverrides`]), read from the type
/// itself: the literal below names every field, so adding one fails to compile until it is
/// listed here too.
pub fn limit_fields() -> Vec<String> {
    let all = LimitOverrides {
        requests_per_second: Some(0),
        request_burst: Some(0),
        max_active_runs: Some(0),
        max_running_runs: Some(0),
        max_batch_size: Some(0),
        tokens_per_day: Some(0),
    };
    match serde_json::to_value(all) {
        Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Sets the tenant's limits named in `set` and clears those in `clear` (back to the
/// configured defaults), in one statement, so concurrent updates of other fields are kept.
/// The caller has checked that `clear` holds only [`limit_fields`].
pub async fn update_limits(
    pool: &PgPool,
    id: Uuid,
    set: &LimitOverrides,
    clear: &[String],
) -> Result<TenantInfo, StoreError> {
    let row: Option<TenantRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenants SET limits = (limits - $2::text[]) || $3::jsonb \
         WHERE id = $1 AND erased_at IS NULL RETURNING {TENANT_COLUMNS}"
    )))
    .bind(id)
    .bind(clear)
    .bind(sqlx::types::Json(set))
    .fetch_optional(pool)
    .await?;
    row.map(tenant).ok_or(StoreError::NotFound)
}

/// Sets the tenant's retention windows named in `set` and clears those in `clear` (back to the
/// configured `[retention]`), in one statement, as [`update_limits`] does. The caller has
/// checked that `clear` holds only [`RetentionOverrides::fields`]. Every window set or cleared
/// loses its legacy key in days too, so a row is left in seconds only.
pub async fn update_retention(
    pool: &PgPool,
    id: Uuid,
    set: &RetentionOverrides,
    clear: &[String],
) -> Result<TenantInfo, StoreError> {
    let set_fields = match serde_json::to_value(set) {
        Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
        _ => Vec::new(),
    };
    let removed: Vec<String> = clear
        .iter()
        .chain(&set_fields)
        .flat_map(|f| RetentionOverrides::stored_keys(f))
        .collect();
    let row: Option<TenantRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenants SET retention = (retention - $2::text[]) || $3::jsonb \
         WHERE id = $1 RETURNING {TENANT_COLUMNS}"
    )))
    .bind(id)
    .bind(&removed)
    .bind(sqlx::types::Json(set))
    .fetch_optional(pool)
    .await?;
    row.map(tenant).ok_or(StoreError::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_fields_are_every_field_of_limit_overrides() {
        let fields = limit_fields();
        assert_eq!(fields.len(), 6, "{fields:?}");
        for f in &fields {
            let one = serde_json::json!({ f.as_str(): 1 });
            assert!(
                serde_json::from_value::<LimitOverrides>(one).is_ok(),
                "{f} is a field"
            );
        }
    }

    #[test]
    fn an_expiry_ends_the_principal() {
        let now = Utc::now();
        let p = Principal {
            tenant_id: Uuid::nil(),
            key_id: Uuid::nil(),
            limits: LimitOverrides::default(),
            suspended: false,
            expires_at: Some(now),
        };
        assert!(p.expired_at(now));
        assert!(!p.expired_at(now - chrono::Duration::seconds(1)));
        let forever = Principal {
            expires_at: None,
            ..p
        };
        assert!(!forever.expired_at(now));
    }
}
