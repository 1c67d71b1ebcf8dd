//! Tenants and API keys. Only a SHA-256 of a key is stored.

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use crate::domain::LimitOverrides;

pub const KEY_PREFIX: &str = "af_";

pub fn hash_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// A fresh key: `af_` and 32 random bytes in hex.
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", hex::encode(bytes))
}

pub struct CreatedTenant {
    pub tenant_id: Uuid,
    pub key_id: Uuid,
    /// Shown once; only its hash is kept.
    pub api_key: String,
}

pub async fn create(pool: &PgPool, name: &str) -> Result<CreatedTenant, StoreError> {
    let tenant_id = Uuid::now_v7();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2)")
        .bind(tenant_id)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    let (key_id, api_key) = insert_key(&mut tx, tenant_id, "default").await?;
    tx.commit().await?;
    Ok(CreatedTenant {
        tenant_id,
        key_id,
        api_key,
    })
}

async fn insert_key(
    conn: &mut sqlx::PgConnection,
    tenant: Uuid,
    label: &str,
) -> Result<(Uuid, String), StoreError> {
    let key = generate_key();
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO api_keys (id, tenant_id, key_hash, label) VALUES ($1, $2, $3, $4)")
        .bind(id)
        .bind(tenant)
        .bind(hash_key(&key))
        .bind(label)
        .execute(conn)
        .await?;
    Ok((id, key))
}

/// The caller behind a key, with what its tenant may do (cached with the key, so a change of
/// limits or a suspension reaches every API replica within `api.auth_cache_ttl_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Principal {
    pub tenant_id: Uuid,
    pub key_id: Uuid,
    /// The tenant's own limits; [`LimitOverrides::over`] the configured defaults.
    pub limits: LimitOverrides,
    pub suspended: bool,
}

pub async fn authenticate(pool: &PgPool, key: &str) -> Result<Option<Principal>, StoreError> {
    authenticate_hash(pool, &hash_key(key)).await
}

/// The principal of a key given its hash (see `hash_key`).
pub async fn authenticate_hash(
    pool: &PgPool,
    key_hash: &[u8],
) -> Result<Option<Principal>, StoreError> {
    let row: Option<(Uuid, Uuid, sqlx::types::Json<LimitOverrides>, bool)> = sqlx::query_as(
        "SELECT k.tenant_id, k.id, t.limits, t.suspended_at IS NOT NULL \
         FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
         WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
    )
    .bind(key_hash)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(tenant_id, key_id, limits, suspended)| Principal {
        tenant_id,
        key_id,
        limits: limits.0,
        suspended,
    }))
}
