//! `agentfleet-api keys create|list|revoke|rotate`. Secrets are printed once, at creation;
//! `list` never shows them.

use chrono::{DateTime, Utc};
use clap::Subcommand;
use sqlx::PgPool;
use uuid::Uuid;

use agentfleet_shared::store::keys::{self, KeyError, KeyInfo};

use agentfleet_api::auth::invalidation::{Announcer, Invalidation};

use super::{announce, parse_duration, print, when};

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create a key and print it (shown only this once).
    Create {
        #[arg(long)]
        tenant: Uuid,
        #[arg(long)]
        name: String,
        /// Expire after this long: `90s`, `15m`, `12h`, `30d`, `2w`.
        #[arg(long, conflicts_with = "expires_at")]
        expires_in: Option<String>,
        /// Expire at this instant (RFC 3339, e.g. 2027-01-01T00:00:00Z).
        #[arg(long)]
        expires_at: Option<DateTime<Utc>>,
    },
    /// List a tenant's keys (never their secrets).
    List {
        #[arg(long)]
        tenant: Uuid,
    },
    /// Revoke a key: every API replica refuses it within `api.auth_cache_ttl_ms`.
    Revoke {
        #[arg(long)]
        key: Uuid,
    },
    /// Replace a key by a new one of the same name and print it; the old key is revoked, or
    /// expires after `--grace`.
    Rotate {
        #[arg(long)]
        key: Uuid,
        /// Keep the old key working this long (`90s`, `15m`, `12h`, `30d`).
        #[arg(long)]
        grace: Option<String>,
        #[arg(long, conflicts_with = "expires_at")]
        expires_in: Option<String>,
        #[arg(long)]
        expires_at: Option<DateTime<Utc>>,
    },
}

pub async fn run(
    pool: &PgPool,
    announcer: &Announcer,
    command: KeysCommand,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create {
            tenant,
            name,
            expires_in,
            expires_at,
        } => {
            keys::check_name(&name).map_err(|m| anyhow::anyhow!("--name: {m}"))?;
            let expires_at = expiry(expires_in.as_deref(), expires_at)?;
            let created = keys::create(pool, tenant, &name, expires_at)
                .await
                .map_err(|e| explain(e, "--tenant", tenant))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&created)?);
            } else {
                show(false, std::slice::from_ref(&created.key));
                println!("api_key={}", created.api_key);
            }
        }
        KeysCommand::List { tenant } => {
            let all = keys::list(pool, tenant)
                .await
                .map_err(|e| explain(e, "--tenant", tenant))?;
            show(json, &all);
        }
        KeysCommand::Revoke { key } => {
            let revoked = keys::revoke(pool, key)
                .await
                .map_err(|e| explain(e, "--key", key))?;
            announce(announcer, Invalidation::Key(key)).await;
            show(json, std::slice::from_ref(&revoked));
        }
        KeysCommand::Rotate {
            key,
            grace,
            expires_in,
            expires_at,
        } => {
            let grace = grace.as_deref().map(parse_duration).transpose()?;
            let expires_at = expiry(expires_in.as_deref(), expires_at)?;
            let rotated = keys::rotate(pool, key, grace, expires_at)
                .await
                .map_err(|e| explain(e, "--key", key))?;
            announce(announcer, Invalidation::Key(key)).await;
            if json {
                println!("{}", serde_json::to_string_pretty(&rotated)?);
            } else {
                show(false, &[rotated.new.key.clone(), rotated.previous.clone()]);
                println!("api_key={}", rotated.new.api_key);
            }
        }
    }
    Ok(())
}

fn expiry(
    expires_in: Option<&str>,
    expires_at: Option<DateTime<Utc>>,
) -> anyhow::Result<Option<DateTime<Utc>>> {
    let now = Utc::now();
    if let Some(at) = expires_at {
        keys::check_expiry(at, now).map_err(|m| anyhow::anyhow!("--expires-at: {m}"))?;
        return Ok(Some(at));
    }
    Ok(expires_in
        .map(parse_duration)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--expires-in: {e}"))?
        .map(|d| now + d))
}

fn explain(e: KeyError, flag: &str, id: Uuid) -> anyhow::Error {
    match e {
        KeyError::TenantNotFound | KeyError::KeyNotFound => {
            anyhow::anyhow!("{flag} {id}: {e}")
        }
        e => anyhow::Error::from(e),
    }
}

fn show(json: bool, all: &[KeyInfo]) {
    let rows = all
        .iter()
        .map(|k| {
            vec![
                k.id.to_string(),
                k.name.clone(),
                when(Some(k.created_at)),
                when(k.last_used_at),
                when(k.expires_at),
                when(k.revoked_at),
            ]
        })
        .collect();
    print(
        json,
        &all,
        &["ID", "NAME", "CREATED", "LAST USED", "EXPIRES", "REVOKED"],
        rows,
    );
}
