use std::path::PathBuf;

use clap::Parser;

use agentfleet_shared::config::Settings;
use agentfleet_shared::telemetry;
use agentfleet_worker::Worker;

// glibc's malloc/free were about a fifth of the worker's CPU under load (perf, bench e2e);
// jemalloc cut that as much as mimalloc did and kept less memory (docs/benchmarks.md). The
// `system-allocator` feature leaves it out, for a heap profiler that hooks malloc.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "agentfleet-worker",
    about = "agentfleet worker: executes agent runs"
)]
struct Cli {
    /// Optional TOML configuration file (environment variables AGENTFLEET__… override it).
    #[arg(long, short, env = "AGENTFLEET_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!(
            "agentfleet-worker: {}",
            agentfleet_shared::report::one_line(&e)
        );
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = Settings::load(cli.config.as_deref())?;
    let _guard = telemetry::init(&settings.telemetry, "worker")?;
    let worker = Worker::build(settings).await?;
    worker
        .run_until_stopped(agentfleet_shared::signals::shutdown())
        .await
}
