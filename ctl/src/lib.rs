//! `agentfleetctl`: the command line for agentfleet's users and operators. It speaks the public
//! HTTP API only (with a tenant's API key), so it can run anywhere the API is reachable.
//!
//! Library-first: `main.rs` parses and exits; each command lives in `commands/`.
//!
//! - `config`: where `--api` and `--key` come from (flags > env > config file)
//! - `client`: HTTP with timeouts, bounded reads and bounded retries
//! - `progress`: an indicatif bar on a terminal, plain lines otherwise
//! - `error`: the errors and the exit codes they mean

pub mod client;
pub mod commands;
pub mod config;
pub mod error;
pub mod progress;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::client::Client;
use crate::error::{CtlError, Result};

#[derive(Debug, Parser)]
#[command(
    name = "agentfleetctl",
    version,
    about = "Submit, follow and steer agentfleet runs and batches",
    after_help = "Exit codes: 0 ok; 1 the API refused, or a run/batch ended failed or cancelled; \
2 usage/config/input error; 3 API unreachable or 5xx/429 after retries; 4 `tail --until-pause` \
stopped at a pause; 130 interrupted."
)]
pub struct Cli {
    /// The API's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long, global = true, env = "AGENTFLEET_API")]
    pub api: Option<String>,
    /// The tenant's API key (never printed).
    #[arg(long, global = true, env = "AGENTFLEET_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// A TOML file with `api` and `key` [default: $XDG_CONFIG_HOME/agentfleet/ctl.toml].
    #[arg(long, global = true, env = "AGENTFLEETCTL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON documents on stdout (errors too), for scripts.
    #[arg(long, global = true)]
    pub json: bool,
    /// No progress output on stderr.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Seconds one request may take (streams excepted).
    #[arg(long, global = true, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Retries of a request on a network error, timeout, 429 or 5xx (with backoff, honouring
    /// Retry-After).
    #[arg(long, global = true, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub retries: u32,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a JSONL file of runs as batches (resumable: re-run the same command after an
    /// interruption; nothing is created twice).
    Submit(commands::submit::Args),
    /// Batches: status, results, cancel.
    #[command(subcommand)]
    Batch(commands::batch::BatchCommand),
    /// Runs: list, get, cancel.
    #[command(subcommand)]
    Runs(commands::runs::RunsCommand),
    /// Follow a run's events: text deltas inline, other events one line each.
    Tail(commands::tail::Args),
    /// Answer a run waiting for input.
    Answer(commands::answer::Args),
    /// Approve (or reject) a run's pending tool calls.
    Approve(commands::approve::Args),
}

/// What every command gets.
#[derive(Debug)]
pub struct Ctx {
    pub client: Client,
    pub json: bool,
    pub quiet: bool,
}

/// rustls needs one process-wide crypto provider; the workspace builds with ring only.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs the command; Ctrl-C ends it with `CtlError::Interrupted`.
pub async fn run(cli: Cli) -> Result<()> {
    let conn = config::resolve(&config::Given {
        api: cli.api.as_deref(),
        key: cli.key.as_deref(),
        config: cli.config.as_deref(),
    })?;
    let client = Client::new(conn, Duration::from_secs(cli.timeout), cli.retries)?;
    let ctx = Ctx {
        client,
        json: cli.json,
        quiet: cli.quiet,
    };
    let hint = match cli.command {
        Command::Submit(_) => {
            ": run the same command again to resume (batches already sent are not created twice)"
        }
        _ => "",
    };
    let work = async {
        match &cli.command {
            Command::Submit(a) => commands::submit::run(&ctx, a).await,
            Command::Batch(c) => commands::batch::run(&ctx, c).await,
            Command::Runs(c) => commands::runs::run(&ctx, c).await,
            Command::Tail(a) => commands::tail::run(&ctx, a).await,
            Command::Answer(a) => commands::answer::run(&ctx, a).await,
            Command::Approve(a) => commands::approve::run(&ctx, a).await,
        }
    };
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(CtlError::Interrupted(hint.to_owned())),
    }
}

/// Prints a JSON document on stdout (pretty: people read `--json` output too).
pub fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}
