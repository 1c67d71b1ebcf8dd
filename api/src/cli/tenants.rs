//! `agentfleet-api tenants create|list|get|suspend|resume|limits|retention|erase|erasure`.

use anyhow::Context;
use clap::{Args, Subcommand};
use sqlx::PgPool;
use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::domain::{LimitOverrides, RetentionOverrides, SECS_PER_DAY};
use agentfleet_shared::events::EventBus;
use agentfleet_shared::store::erasure::{self, Erasure};
use agentfleet_shared::store::keys;
use agentfleet_shared::store::tenants::{self, TenantInfo};

use agentfleet_api::auth::invalidation::{Announcer, Invalidation};
use agentfleet_api::erasure::Eraser;

use super::{announce, print, when};

#[derive(Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant and print its first API key (shown only this once).
    Create {
        #[arg(long)]
        name: String,
    },
    /// List tenants (oldest first).
    List {
        /// Most tenants listed.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// Show one tenant with its limits.
    Get {
        #[arg(long)]
        tenant: Uuid,
    },
    /// Suspend a tenant: its queued runs stay, nothing new starts; its keys may still read
    /// and cancel (every API replica within `api.auth_cache_ttl_ms`).
    Suspend {
        #[arg(long)]
        tenant: Uuid,
    },
    /// Resume a suspended tenant.
    Resume {
        #[arg(long)]
        tenant: Uuid,
    },
    /// Set or clear the tenant's own limits (absent ones are the configured `[limits]`; 0 is
    /// no limit). With no option, shows them.
    Limits(LimitsArgs),
    /// Set or clear the tenant's own retention windows in seconds (absent ones are the
    /// configured `[retention]`; 0 keeps for ever). With no option, shows them.
    Retention(RetentionArgs),
    /// Erase a tenant: its keys are refused at once (every API replica within
    /// `api.auth_cache_ttl_ms`), its runs cancelled, then every row and Redis key of it removed
    /// by the API replicas in the background (or by this command with `--wait`). Its row stays
    /// as a tombstone. Cannot be undone.
    Erase {
        #[arg(long)]
        tenant: Uuid,
        /// Drive the erasure here until it is done (API replicas may share the work), then
        /// print its proof.
        #[arg(long)]
        wait: bool,
    },
    /// Show a tenant's erasure: status, phase, what it deleted, and what its last verification
    /// found left (every table at 0 once done).
    Erasure {
        #[arg(long)]
        tenant: Uuid,
    },
}

#[derive(Args)]
pub struct RetentionArgs {
    #[arg(long)]
    tenant: Uuid,
    /// Seconds a finished run is kept (0: for ever).
    #[arg(long)]
    finished_runs_secs: Option<u64>,
    /// Seconds a run may wait for input or approval before it is removed (0: never removed).
    #[arg(long)]
    waiting_runs_secs: Option<u64>,
    /// Deprecated: --finished-runs-secs in whole days.
    #[arg(long, conflicts_with = "finished_runs_secs")]
    finished_runs_days: Option<u32>,
    /// Deprecated: --waiting-runs-secs in whole days.
    #[arg(long, conflicts_with = "waiting_runs_secs")]
    waiting_runs_days: Option<u32>,
    /// Clear a window back to the configured default (repeatable; `all` clears both).
    #[arg(long, value_name = "FIELD")]
    clear: Vec<String>,
}

#[derive(Args)]
pub struct LimitsArgs {
    #[arg(long)]
    tenant: Uuid,
    #[arg(long)]
    requests_per_second: Option<u32>,
    #[arg(long)]
    request_burst: Option<u32>,
    #[arg(long)]
    max_active_runs: Option<u32>,
    #[arg(long)]
    max_running_runs: Option<u32>,
    #[arg(long)]
    max_batch_size: Option<u32>,
    #[arg(long)]
    tokens_per_day: Option<u64>,
    /// Clear a limit back to the configured default (repeatable; `all` clears every one).
    #[arg(long, value_name = "FIELD")]
    clear: Vec<String>,
}

impl LimitsArgs {
    fn set(&self) -> LimitOverrides {
        LimitOverrides {
            requests_per_second: self.requests_per_second,
            request_burst: self.request_burst,
            max_active_runs: self.max_active_runs,
            max_running_runs: self.max_running_runs,
            max_batch_size: self.max_batch_size,
            tokens_per_day: self.tokens_per_day,
        }
    }

    /// The fields to clear, checked against the known ones.
    fn clear(&self) -> anyhow::Result<Vec<String>> {
        fields_to_clear(&self.clear, tenants::limit_fields(), "limit")
    }
}

/// `--clear` values checked against the `known` fields (`all`: every one).
fn fields_to_clear(
    clear: &[String],
    known: Vec<String>,
    what: &str,
) -> anyhow::Result<Vec<String>> {
    if clear.iter().any(|c| c == "all") {
        return Ok(known);
    }
    for field in clear {
        anyhow::ensure!(
            known.contains(field),
            "--clear {field}: unknown {what}; known: {} (or all)",
            known.join(", ")
        );
    }
    Ok(clear.to_vec())
}

pub async fn run(
    pool: &PgPool,
    settings: &Settings,
    announcer: &Announcer,
    command: TenantsCommand,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        TenantsCommand::Create { name } => {
            keys::check_name(&name).map_err(|m| anyhow::anyhow!("--name: {m}"))?;
            let created = tenants::create(pool, &name).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"tenant_id": created.tenant_id,
                        "key_id": created.key_id, "api_key": created.api_key})
                );
            } else {
                println!("tenant_id={}", created.tenant_id);
                println!("key_id={}", created.key_id);
                println!("api_key={}", created.api_key);
            }
        }
        TenantsCommand::List { limit } => {
            let all = tenants::list(pool, None, limit).await?;
            show(json, &all, settings);
        }
        TenantsCommand::Get { tenant } => show_one(
            json,
            found(tenants::get(pool, tenant).await, tenant)?,
            settings,
        ),
        TenantsCommand::Suspend { tenant } | TenantsCommand::Resume { tenant } => {
            let suspend = matches!(command, TenantsCommand::Suspend { .. });
            let t = found(tenants::set_suspended(pool, tenant, suspend).await, tenant)?;
            announce(announcer, Invalidation::Tenant(tenant)).await;
            show_one(json, t, settings);
        }
        TenantsCommand::Limits(args) => {
            let (set, clear) = (args.set(), args.clear()?);
            let t = if set == LimitOverrides::default() && clear.is_empty() {
                found(tenants::get(pool, args.tenant).await, args.tenant)?
            } else {
                let t = found(
                    tenants::update_limits(pool, args.tenant, &set, &clear).await,
                    args.tenant,
                )?;
                announce(announcer, Invalidation::Tenant(args.tenant)).await;
                t
            };
            show_one(json, t, settings);
        }
        TenantsCommand::Retention(args) => {
            let days = |d: Option<u32>| d.map(|d| u64::from(d) * SECS_PER_DAY);
            let set = RetentionOverrides {
                finished_runs_secs: days(args.finished_runs_days).or(args.finished_runs_secs),
                waiting_runs_secs: days(args.waiting_runs_days).or(args.waiting_runs_secs),
            };
            let clear = fields_to_clear(&args.clear, RetentionOverrides::fields(), "window")?;
            if let Err(e) = set.over(&settings.retention.windows()).check() {
                anyhow::bail!("--{}: {}", e.field.replace('_', "-"), e.message);
            }
            let t = if set == RetentionOverrides::default() && clear.is_empty() {
                found(tenants::get(pool, args.tenant).await, args.tenant)?
            } else {
                found(
                    tenants::update_retention(pool, args.tenant, &set, &clear).await,
                    args.tenant,
                )?
            };
            show_one(json, t, settings);
        }
        TenantsCommand::Erase { tenant, wait } => {
            let requested = match erasure::request(pool, tenant).await {
                Err(agentfleet_shared::store::StoreError::NotFound) => {
                    anyhow::bail!("--tenant {tenant}: no such tenant")
                }
                other => other.context("requesting the erasure")?,
            };
            announce(announcer, Invalidation::Tenant(tenant)).await;
            let mut current = requested.erasure;
            if wait && current.status != "done" {
                let redis = agentfleet_shared::events::redis_connection(&settings.redis)
                    .context("redis.url")?;
                let bus = EventBus::new(
                    redis,
                    &settings.redis.prefix,
                    settings.events.retention_secs,
                )
                .with_lost_id_margin(settings.events.lost_id_margin)
                .with_timeout(settings.redis.timeout());
                let stop = tokio_util::sync::CancellationToken::new();
                let eraser = Eraser::new(
                    pool.clone(),
                    bus,
                    std::sync::Arc::new(settings.clone()),
                    stop.clone(),
                );
                let poll = std::time::Duration::from_millis(settings.erasure.interval_ms.get());
                tokio::select! {
                    done = eraser.until_done(tenant, poll) => done?,
                    _ = tokio::signal::ctrl_c() => {
                        stop.cancel();
                        anyhow::bail!("interrupted: the erasure goes on in the API replicas (`tenants erasure --tenant {tenant}`)");
                    }
                }
                current = erasure::get(pool, tenant)
                    .await?
                    .context("the erasure vanished")?;
            }
            show_erasure(json, &current);
        }
        TenantsCommand::Erasure { tenant } => {
            let current = erasure::get(pool, tenant).await?.with_context(|| {
                format!("--tenant {tenant}: no erasure of this tenant was requested")
            })?;
            show_erasure(json, &current);
        }
    }
    Ok(())
}

fn show_erasure(json: bool, e: &Erasure) {
    if json {
        println!("{}", serde_json::to_string_pretty(e).expect("serializes"));
        return;
    }
    let rows = vec![vec![
        e.tenant_id.to_string(),
        e.status.clone(),
        e.phase.clone(),
        when(Some(e.requested_at)),
        when(e.finished_at),
        e.keys_revoked.to_string(),
        e.runs_cancelled.to_string(),
        e.redis_keys_deleted.to_string(),
    ]];
    print!(
        "{}",
        super::table(
            &[
                "TENANT",
                "STATUS",
                "PHASE",
                "REQUESTED",
                "FINISHED",
                "KEYS",
                "CANCELLED",
                "REDIS_KEYS",
            ],
            &rows,
        )
    );
    let mut tables = Vec::new();
    for table in erasure::TABLES {
        let of = |c: &Option<sqlx::types::Json<erasure::Counts>>| {
            c.as_ref()
                .and_then(|c| c.0.get(table).copied())
                .map_or_else(|| "-".to_owned(), |n| n.to_string())
        };
        let deleted = e.deleted.0.get(table).copied().unwrap_or(0).to_string();
        tables.push(vec![
            table.to_owned(),
            of(&e.counted),
            deleted,
            of(&e.remaining),
        ]);
    }
    print!(
        "{}",
        super::table(&["TABLE", "COUNTED", "DELETED", "REMAINING"], &tables)
    );
    match (&e.verified_at, &e.last_error) {
        (_, Some(error)) => println!("last error: {error}"),
        (Some(at), None) if e.status == "done" => {
            println!("verified {}: no row of the tenant is left", when(Some(*at)));
        }
        _ => {}
    }
}

fn found(
    t: Result<TenantInfo, agentfleet_shared::store::StoreError>,
    id: Uuid,
) -> anyhow::Result<TenantInfo> {
    match t {
        Err(agentfleet_shared::store::StoreError::NotFound) => {
            anyhow::bail!("--tenant {id}: no such tenant (or it is erased)")
        }
        other => other.context("reading the tenant"),
    }
}

fn show(json: bool, all: &[TenantInfo], _settings: &Settings) {
    let rows = all
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.name.clone(),
                when(Some(t.created_at)),
                when(t.suspended_at),
                when(t.erased_at),
                serde_json::to_string(&t.limits).unwrap_or_default(),
            ]
        })
        .collect();
    print(
        json,
        &all,
        &["ID", "NAME", "CREATED", "SUSPENDED", "ERASED", "LIMITS"],
        rows,
    );
}

fn show_one(json: bool, t: TenantInfo, settings: &Settings) {
    if json {
        let mut v = serde_json::to_value(&t).expect("serializes");
        v["effective_limits"] =
            serde_json::to_value(t.limits.over(&settings.limits)).expect("serializes");
        v["effective_retention"] =
            serde_json::to_value(t.retention.over(&settings.retention.windows()))
                .expect("serializes");
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
    } else {
        show(false, std::slice::from_ref(&t), settings);
        let effective = serde_json::to_string(&t.limits.over(&settings.limits)).unwrap_or_default();
        println!("effective limits (0 = none): {effective}");
        let retention = serde_json::to_string(&t.retention.over(&settings.retention.windows()))
            .unwrap_or_default();
        println!("effective retention in seconds (0 = kept for ever): {retention}");
    }
}
