use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use agentfleet_api::Application;
use agentfleet_shared::config::Settings;
use agentfleet_shared::{db, infra, store, telemetry};

mod cli;

// glibc's malloc/free were about a fifth of the worker's CPU under load (perf, bench e2e);
// jemalloc cut that as much as mimalloc did and kept less memory (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "agentfleet-api", about = "agentfleet HTTP API")]
struct Cli {
    /// Optional TOML configuration file (environment variables AGENTFLEET__… override it).
    #[arg(long, short, env = "AGENTFLEET_CONFIG")]
    config: Option<PathBuf>,
    /// Print JSON instead of a table (`tenants`, `keys` and `admin`).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Create a tenant and print its API key (shown only this once); as `tenants create`.
    CreateTenant {
        #[arg(long)]
        name: String,
    },
    /// Manage tenants: create, list, get, suspend, resume, limits.
    #[command(subcommand)]
    Tenants(cli::tenants::TenantsCommand),
    /// Manage a tenant's API keys: create, list, revoke, rotate.
    #[command(subcommand)]
    Keys(cli::keys::KeysCommand),
    /// Operate on work that stopped moving: dead letters (list, replay, purge), stuck runs.
    #[command(subcommand)]
    Admin(cli::admin::AdminCommand),
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!(
            "agentfleet-api: {}",
            agentfleet_shared::report::one_line(&e)
        );
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut settings = Settings::load(cli.config.as_deref())?;
    let command = cli.command.unwrap_or(Command::Serve);
    if !matches!(command, Command::Serve | Command::Migrate) {
        // An operator's command (a listing of stuck runs over a large table, a replay of
        // thousands, one waiting for a run's row) may take longer than a statement of the
        // API's own requests should; it is interrupted with Ctrl-C instead. (The migrations
        // set their own bounds, from the fleet's: `DatabaseSettings::migration_lock_timeout`.)
        settings.database.statement_timeout_ms = 0;
        settings.database.lock_timeout_ms = 0;
    }
    match command {
        Command::Migrate => {
            // The Job's log shows each retry (docs/operations.md, "Upgrade").
            let _guard = telemetry::init(&settings.telemetry, "api")?;
            let pool =
                infra::postgres(&settings.database, settings.startup.dependency_wait()).await?;
            let d = &settings.database;
            db::migrate(&pool, d).await.with_context(|| {
                format!(
                    "applying migrations ({} attempts, each waiting at most {} ms for a lock: \
                     database.migration_lock_timeout_ms)",
                    d.migration_attempts,
                    d.migration_lock_timeout()
                )
            })?;
            println!("migrations applied");
        }
        Command::CreateTenant { name } => {
            let pool =
                infra::postgres(&settings.database, settings.startup.dependency_wait()).await?;
            store::keys::check_name(&name).map_err(|m| anyhow::anyhow!("--name: {m}"))?;
            let created = store::tenants::create(&pool, &name).await?;
            println!("tenant_id={}", created.tenant_id);
            println!("api_key={}", created.api_key);
        }
        Command::Tenants(command) => {
            let pool =
                infra::postgres(&settings.database, settings.startup.dependency_wait()).await?;
            let announcer = cli::announcer(&settings)?;
            cli::tenants::run(&pool, &settings, &announcer, command, cli.json).await?;
        }
        Command::Keys(command) => {
            let pool =
                infra::postgres(&settings.database, settings.startup.dependency_wait()).await?;
            let announcer = cli::announcer(&settings)?;
            cli::keys::run(&pool, &announcer, command, cli.json).await?;
        }
        Command::Admin(command) => {
            let pool =
                infra::postgres(&settings.database, settings.startup.dependency_wait()).await?;
            cli::admin::run(&pool, &settings, command, cli.json).await?;
        }
        Command::Serve => {
            let _guard = telemetry::init(&settings.telemetry, "api")?;
            let app = Application::build(settings).await?;
            tracing::info!(
                port = app.port(),
                metrics_port = ?app.metrics_port(),
                "agentfleet-api listening"
            );
            app.run_until_stopped(agentfleet_shared::signals::shutdown())
                .await?;
        }
    }
    Ok(())
}
