//! Stand-alone HTTP tool server, for the demo and for benchmarks.

use std::net::SocketAddr;

use agentfleet_tests::tool_server::ToolServer;
use clap::Parser;

// The scripted model and tool server are counted in the benchmarks' CPU per run (the same
// code serves both sides of bench/compare): they allocate like the fleet's own processes do,
// with jemalloc, so glibc's malloc is not a third of the harness's cost (perf, bench e2e).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "tool-server",
    about = "HTTP tools (echo, add, fail, slow, side-effect) for agentfleet"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8091")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let server = ToolServer::start_on(args.listen).await?;
    println!("tool-server listening on {}", server.base_url());
    shutdown_signal().await;
    server.shutdown().await;
    Ok(())
}

/// Ctrl-C for a terminal, SIGTERM for containers and process supervisors.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
