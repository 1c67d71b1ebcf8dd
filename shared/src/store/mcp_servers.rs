//! MCP servers a tenant registers (migration `0011_mcp_servers.sql`). Header values are
//! sealed (`crate::seal`) with the row's id as associated data; only their names are read
//! back for the tenant.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use crate::seal;

/// A server as its tenant sees it: header names, never their values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct McpServer {
    pub id: Uuid,
    pub name: String,
    pub url: String,
    pub description: String,
    /// Names of the headers sent with every request to the server (values are write-only).
    pub header_names: Vec<String>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, name, url, description, header_names, created_at";

pub struct NewMcpServer {
    pub tenant_id: Uuid,
    pub name: String,
    pub url: String,
    pub description: String,
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateMcpServerError {
    #[error("the tenant has {0} MCP servers already")]
    TooMany(i64),
    #[error("the tenant has an MCP server named `{0}` already")]
    Duplicate(String),
    #[error("headers cannot be stored: mcp.encryption_key is not configured")]
    NoKey,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CreateMcpServerError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(d) = &e
            && d.is_unique_violation()
        {
            return CreateMcpServerError::Duplicate(String::new());
        }
        CreateMcpServerError::Store(e.into())
    }
}

/// Registers a server unless its tenant has `max` already (the tenant row is locked so two
/// registrations at once count one after the other). Headers are sealed under `key`; the
/// caller refuses headers when there is no key.
pub async fn create(
    pool: &PgPool,
    new: NewMcpServer,
    key: Option<&[u8; 32]>,
    max: i64,
) -> Result<McpServer, CreateMcpServerError> {
    let id = Uuid::now_v7();
    let names: Vec<String> = new.headers.iter().map(|(n, _)| n.clone()).collect();
    let sealed = match (key, new.headers.is_empty()) {
        (_, true) => None,
        (Some(key), false) => {
            let plain = serde_json::to_vec(&new.headers).expect("pairs of strings serialize");
            Some(seal::seal(key, id.as_bytes(), &plain))
        }
        (None, false) => {
            return Err(CreateMcpServerError::NoKey);
        }
    };
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(new.tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM mcp_servers WHERE tenant_id = $1")
        .bind(new.tenant_id)
        .fetch_one(&mut *tx)
        .await?;
    if n >= max {
        return Err(CreateMcpServerError::TooMany(max));
    }
    let server = sqlx::query_as::<_, McpServer>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO mcp_servers (id, tenant_id, name, url, description, header_names, headers_sealed)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(new.tenant_id)
    .bind(&new.name)
    .bind(&new.url)
    .bind(&new.description)
    .bind(&names)
    .bind(&sealed)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| match CreateMcpServerError::from(e) {
        CreateMcpServerError::Duplicate(_) => CreateMcpServerError::Duplicate(new.name.clone()),
        other => other,
    })?;
    tx.commit().await?;
    Ok(server)
}

/// A tenant's servers, by name.
pub async fn list(pool: &PgPool, tenant: Uuid) -> Result<Vec<McpServer>, StoreError> {
    Ok(sqlx::query_as::<_, McpServer>(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM mcp_servers WHERE tenant_id = $1 ORDER BY name"
    )))
    .bind(tenant)
    .fetch_all(pool)
    .await?)
}

/// Which of `names` the tenant has registered.
pub async fn registered(
    pool: &PgPool,
    tenant: Uuid,
    names: &[String],
) -> Result<Vec<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT name FROM mcp_servers WHERE tenant_id = $1 AND name = ANY($2)")
            .bind(tenant)
            .bind(names)
            .fetch_all(pool)
            .await?,
    )
}

/// One server of a tenant, by name; another tenant's is simply not found.
pub async fn get(pool: &PgPool, tenant: Uuid, name: &str) -> Result<McpServer, StoreError> {
    sqlx::query_as::<_, McpServer>(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM mcp_servers WHERE tenant_id = $1 AND name = $2"
    )))
    .bind(tenant)
    .bind(name)
    .fetch_optional(pool)
    .await?
    .ok_or(StoreError::NotFound)
}

pub async fn delete(pool: &PgPool, tenant: Uuid, name: &str) -> Result<McpServer, StoreError> {
    sqlx::query_as::<_, McpServer>(sqlx::AssertSqlSafe(format!(
        "DELETE FROM mcp_servers WHERE tenant_id = $1 AND name = $2 RETURNING {COLUMNS}"
    )))
    .bind(tenant)
    .bind(name)
    .fetch_optional(pool)
    .await?
    .ok_or(StoreError::NotFound)
}

/// What the worker needs to reach a registered server: its URL and opened headers.
pub struct Resolved {
    pub url: String,
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no MCP server named `{0}` is registered")]
    NotFound(String),
    #[error("the server's headers cannot be opened (mcp.encryption_key missing or changed)")]
    Sealed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub async fn resolve(
    pool: &PgPool,
    tenant: Uuid,
    name: &str,
    key: Option<&[u8; 32]>,
) -> Result<Resolved, ResolveError> {
    let row: Option<(Uuid, String, Option<Vec<u8>>)> = sqlx::query_as(
        "SELECT id, url, headers_sealed FROM mcp_servers WHERE tenant_id = $1 AND name = $2",
    )
    .bind(tenant)
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(StoreError::from)?;
    let (id, url, sealed) = row.ok_or_else(|| ResolveError::NotFound(name.to_owned()))?;
    let headers = match sealed {
        None => Vec::new(),
        Some(sealed) => {
            let key = key.ok_or(ResolveError::Sealed)?;
            let plain =
                seal::open(key, id.as_bytes(), &sealed).map_err(|_| ResolveError::Sealed)?;
            serde_json::from_slice(&plain).map_err(|_| ResolveError::Sealed)?
        }
    };
    Ok(Resolved { url, headers })
}
