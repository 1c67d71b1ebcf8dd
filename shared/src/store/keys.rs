//! API key lifecycle: create, list, revoke, rotate, and the throttled `last_used_at` writes.
//! The CLI (`agentfleet-api keys …`) and the admin API (`/admin/v1/…`) both call these, so
//! they cannot disagree. Only a SHA-256 of a key is stored; the key is shown once.
//!
//! A key is valid while `revoked_at` is null and `expires_at` is null or in the future
//! ([`super::tenants::authenticate_hash`]). Each API replica caches a valid key for
//! `api.auth_cache_ttl_ms`, which bounds how long a revocation takes to reach every replica.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

pub const KEY_PREFIX: &str = "af_";

/// What is stored of a key, and what a presented key is looked up by.
pub fn hash_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// Whether `key` has the shape of a key [`generate_key`] makes (`af_` and 64 lowercase hex
/// digits): anything else is refused without a lookup.
pub fn well_formed(key: &str) -> bool {
    key.strip_prefix(KEY_PREFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A fresh key: `af_` and 32 random bytes in hex.
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", hex::encode(bytes))
}

/// Longest key or tenant name, in characters (as `tenants.name` and `api_keys.name` check).
pub const MAX_NAME_CHARS: usize = 200;

/// Longest expiry or grace period accepted: 100 years (what `chrono` and Postgres hold
/// comfortably; longer is "never", which is no expiry).
pub const MAX_SECS: u64 = 100 * 365 * 24 * 3600;

/// One key as operators see it: never its secret or its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct KeyInfo {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// When the key last authenticated a request, to within `api.key_last_used_flush_ms`
    /// (plus the auth cache's TTL of a replica that stopped before flushing); null if never.
    pub last_used_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl KeyInfo {
    /// Whether the key authenticates requests at `now`.
    pub fn is_valid_at(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

/// A key just made: its description and the secret, shown this once.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    pub key: KeyInfo,
    /// The bearer secret; only its hash is kept, so it cannot be shown again.
    pub api_key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("tenant not found")]
    TenantNotFound,
    #[error("key not found")]
    KeyNotFound,
    /// The tenant's erasure was requested: it gets no key any more.
    #[error("tenant {0} is erased")]
    TenantErased(Uuid),
    /// Rotating a revoked or expired key would bring a dead key's name back to life.
    #[error("key {0} is revoked or expired")]
    NotValid(Uuid),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for KeyError {
    fn from(e: sqlx::Error) -> KeyError {
        KeyError::Store(StoreError::Db(e))
    }
}

/// A tenant or key name: 1..=200 characters, not blank, no NUL (Postgres text holds none).
/// Says what is wrong, for the caller to name the field.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("must not be blank".to_owned());
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("must be at most {MAX_NAME_CHARS} characters"));
    }
    if name.contains('\0') {
        return Err("must not contain NUL".to_owned());
    }
    Ok(())
}

/// An expiry must lie after `now`: a key born expired is a mistake, not a request.
pub fn check_expiry(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> Result<(), String> {
    if expires_at <= now {
        return Err(format!(
            "must be in the future (now is {})",
            now.to_rfc3339()
        ));
    }
    Ok(())
}

const COLUMNS: &str = "id, tenant_id, name, created_at, last_used_at, expires_at, revoked_at";

/// Makes a key for `tenant`. The caller has checked `name` and `expires_at`.
pub async fn create(
    pool: &PgPool,
    tenant: Uuid,
    name: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<CreatedKey, KeyError> {
    let mut tx = pool.begin().await?;
    // Locked against a concurrent erasure, which revokes every key it finds.
    let exists: Option<(bool,)> =
        sqlx::query_as("SELECT erased_at IS NOT NULL FROM tenants WHERE id = $1 FOR SHARE")
            .bind(tenant)
            .fetch_optional(&mut *tx)
            .await?;
    match exists {
        None => return Err(KeyError::TenantNotFound),
        Some((true,)) => return Err(KeyError::TenantErased(tenant)),
        Some((false,)) => {}
    }
    let created = insert(&mut tx, tenant, name, expires_at).await?;
    tx.commit().await?;
    Ok(created)
}

/// Inserts a key inside the caller's transaction.
pub(crate) async fn insert(
    conn: &mut sqlx::PgConnection,
    tenant: Uuid,
    name: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<CreatedKey, sqlx::Error> {
    let api_key = generate_key();
    let key: KeyInfo = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO api_keys (id, tenant_id, key_hash, name, expires_at) \
         VALUES ($1, $2, $3, $4, $5) RETURNING {COLUMNS}"
    )))
    .bind(Uuid::now_v7())
    .bind(tenant)
    .bind(hash_key(&api_key))
    .bind(name)
    .bind(expires_at)
    .fetch_one(conn)
    .await?;
    Ok(CreatedKey { key, api_key })
}

/// Every key of `tenant`, newest first, revoked and expired ones included (an audit trail).
pub async fn list(pool: &PgPool, tenant: Uuid) -> Result<Vec<KeyInfo>, KeyError> {
    let exists: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM tenants WHERE id = $1")
        .bind(tenant)
        .fetch_optional(pool)
        .await?;
    if exists.is_none() {
        return Err(KeyError::TenantNotFound);
    }
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM api_keys WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC"
    )))
    .bind(tenant)
    .fetch_all(pool)
    .await?)
}

pub async fn get(pool: &PgPool, key: Uuid) -> Result<KeyInfo, KeyError> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM api_keys WHERE id = $1"
    )))
    .bind(key)
    .fetch_optional(pool)
    .await?
    .ok_or(KeyError::KeyNotFound)
}

/// Revokes `key` now. Revoking a revoked key is a no-op that keeps the first `revoked_at`.
/// Every replica refuses the key once its cached entry is older than `api.auth_cache_ttl_ms`.
pub async fn revoke(pool: &PgPool, key: Uuid) -> Result<KeyInfo, KeyError> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1 \
         RETURNING {COLUMNS}"
    )))
    .bind(key)
    .fetch_optional(pool)
    .await?
    .ok_or(KeyError::KeyNotFound)
}

/// What a rotation did: the new key (same tenant and name) and the old one as it now stands.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Rotated {
    #[serde(flatten)]
    pub new: CreatedKey,
    /// The rotated key: revoked, or expiring at the end of the grace period.
    pub previous: KeyInfo,
}

/// Replaces `key` by a new key of the same name. Without `grace` (or a zero one) the old key
/// is revoked at once; with one, it expires `grace` from now (or earlier, if it already
/// expired sooner), so clients can switch over. The new key expires at `expires_at`.
pub async fn rotate(
    pool: &PgPool,
    key: Uuid,
    grace: Option<chrono::Duration>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<Rotated, KeyError> {
    let mut tx = pool.begin().await?;
    // Locked so two rotations of one key cannot both make a successor.
    let old: KeyInfo = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM api_keys WHERE id = $1 FOR UPDATE"
    )))
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(KeyError::KeyNotFound)?;
    let now: (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(&mut *tx).await?;
    if !old.is_valid_at(now.0) {
        return Err(KeyError::NotValid(key));
    }
    let new = insert(&mut tx, old.tenant_id, &old.name, expires_at).await?;
    let grace = grace.filter(|g| *g > chrono::Duration::zero());
    let previous: KeyInfo = match grace {
        None => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "UPDATE api_keys SET revoked_at = now() WHERE id = $1 RETURNING {COLUMNS}"
            )))
            .bind(key)
            .fetch_one(&mut *tx)
            .await?
        }
        Some(grace) => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "UPDATE api_keys SET expires_at = LEAST(expires_at, now() + $2) WHERE id = $1 \
             RETURNING {COLUMNS}"
            )))
            .bind(key)
            .bind(grace)
            .fetch_one(&mut *tx)
            .await?
        }
    };
    tx.commit().await?;
    Ok(Rotated { new, previous })
}

/// Records when keys were last used: `(key id, time of its latest use)`, in one statement.
/// A time never moves backwards (two replicas may flush out of order).
pub async fn mark_used(pool: &PgPool, used: &[(Uuid, DateTime<Utc>)]) -> Result<(), StoreError> {
    if used.is_empty() {
        return Ok(());
    }
    let (ids, times): (Vec<Uuid>, Vec<DateTime<Utc>>) = used.iter().copied().unzip();
    sqlx::query(
        "UPDATE api_keys k SET last_used_at = GREATEST(k.last_used_at, u.at) \
         FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, at) WHERE k.id = u.id",
    )
    .bind(ids)
    .bind(times)
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_shape_of_a_generated_key_is_well_formed() {
        assert!(well_formed(&generate_key()));
        for bad in [
            "",
            "af_",
            "af_00",
            &format!("af_{}", "A".repeat(64)),
            &format!("af_{}", "0".repeat(65)),
            &format!("sk_{}", "0".repeat(64)),
            &format!("af_{}é", "0".repeat(62)),
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }

    #[test]
    fn names_are_bounded_and_not_blank() {
        assert!(check_name("ci").is_ok());
        assert!(
            check_name(&"é".repeat(200)).is_ok(),
            "characters, not bytes"
        );
        assert!(check_name(&"a".repeat(201)).unwrap_err().contains("200"));
        assert!(check_name("  ").unwrap_err().contains("blank"));
        assert!(check_name("").is_err());
        assert!(check_name("a\0b").unwrap_err().contains("NUL"));
    }

    #[test]
    fn an_expiry_must_be_in_the_future_and_validity_follows_it() {
        let now = Utc::now();
        assert!(check_expiry(now + chrono::Duration::seconds(1), now).is_ok());
        assert!(check_expiry(now, now).is_err());
        let key = KeyInfo {
            id: Uuid::nil(),
            tenant_id: Uuid::nil(),
            name: "k".into(),
            created_at: now,
            last_used_at: None,
            expires_at: Some(now + chrono::Duration::seconds(10)),
            revoked_at: None,
        };
        assert!(key.is_valid_at(now));
        assert!(!key.is_valid_at(now + chrono::Duration::seconds(10)));
        let revoked = KeyInfo {
            revoked_at: Some(now),
            expires_at: None,
            ..key
        };
        assert!(!revoked.is_valid_at(now));
    }
}
