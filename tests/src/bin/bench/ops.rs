//! What the servers did during a measured window, counted by the servers themselves:
//! Postgres statements (`pg_stat_statements`, when it is loaded) and commits
//! (`pg_stat_database`) of the benchmark's database, Redis commands (`INFO commandstats`) and
//! RabbitMQ messages (the management API, when it is enabled). Together with the CPU per
//! process they say whether a run costs much because it does many operations or because each
//! one is expensive.
//!
//! Redis and RabbitMQ count for the whole server: other users of a shared server are included.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use agentfleet_tests::harness::{amqp_url, redis_url};

use crate::common::Ctx;

/// Postgres keeps a backend's counters in the backend and publishes them to
/// `pg_stat_database` at most once a second while busy and, once it goes idle, only after
/// `PGSTAT_IDLE_INTERVAL` (10 s): the last second of a window shows up to 10 s late. The
/// end of the window's commit count is read after this long, so it also holds what the
/// workers commit in the background (sweeps) meanwhile; with the first preparation of each
/// statement on each connection (a transaction of its own) that is a fixed amount per window,
/// small against a long batch. RabbitMQ's management counters (sampled every 5 s by default)
/// are read after it too.
const STATS_PUBLISH_DELAY: Duration = Duration::from_secs(11);

/// How many statements of the benchmark's database are listed.
const TOP_STATEMENTS: usize = 12;

/// Counters read at the start of the window.
#[derive(Debug)]
pub struct OpsStart {
    statements: bool,
    commits: Option<i64>,
    redis: Option<HashMap<String, u64>>,
    rabbitmq: Option<RabbitCounts>,
}

/// What the servers did during the window.
#[derive(Debug)]
pub struct Ops {
    /// `pg_stat_statements` of the benchmark's database, most total time first.
    pub statements: Option<Vec<Statement>>,
    /// Commits in the benchmark's database (the benchmark's own queries included).
    pub commits: Option<i64>,
    /// Redis commands by name, most calls first.
    pub redis: Option<Vec<(String, u64)>>,
    pub rabbitmq: Option<RabbitCounts>,
}

#[derive(Debug)]
pub struct Statement {
    pub calls: i64,
    pub mean_ms: f64,
    pub total_ms: f64,
    pub query: String,
}

/// Message counters of the RabbitMQ management API's overview.
#[derive(Debug, Clone, Copy)]
pub struct RabbitCounts {
    pub published: u64,
    pub delivered: u64,
    pub acked: u64,
}

/// Resets and reads the counters at the start of a window; prints one line for each source
/// that is not available.
pub async fn start(ctx: &Ctx) -> OpsStart {
    let statements = match reset_statements(ctx).await {
        Ok(()) => true,
        Err(e) => {
            print_statements_unavailable(&e);
            false
        }
    };
    let redis = redis_commandstats()
        .await
        .map_err(|e| println!("redis commands: INFO commandstats failed: {e}"))
        .ok();
    let rabbitmq = match rabbitmq_counts(ctx).await {
        Ok(c) => Some(c),
        Err(e) => {
            println!("rabbitmq operations: management API not available ({e:#}); skipped");
            None
        }
    };
    OpsStart {
        statements,
        commits: commits(ctx).await.ok(),
        redis,
        rabbitmq,
    }
}

/// Reads the counters at the end of a window: the ones kept current at once, then, after
/// `STATS_PUBLISH_DELAY`, the ones published late.
pub async fn finish(ctx: &Ctx, start: OpsStart) -> Ops {
    let statements = if start.statements {
        read_statements(ctx)
            .await
            .map_err(|e| println!("postgres statements: reading failed: {e}"))
            .ok()
    } else {
        None
    };
    let redis = match (start.redis, redis_commandstats().await) {
        (Some(before), Ok(after)) => Some(commands_delta(&before, &after)),
        _ => None,
    };
    tokio::time::sleep(STATS_PUBLISH_DELAY).await;
    let commits = match (start.commits, commits(ctx).await) {
        (Some(before), Ok(after)) => Some(after - before),
        _ => None,
    };
    let rabbitmq = match (start.rabbitmq, rabbitmq_counts(ctx).await) {
        (Some(before), Ok(after)) => Some(RabbitCounts {
            published: after.published.saturating_sub(before.published),
            delivered: after.delivered.saturating_sub(before.delivered),
            acked: after.acked.saturating_sub(before.acked),
        }),
        _ => None,
    };
    Ops {
        statements,
        commits,
        redis,
        rabbitmq,
    }
}

// ---------------------------------------------------------------------------- Postgres

/// The benchmark's database, as `pg_stat_statements.dbid` names it.
const THIS_DB: &str = "(SELECT oid FROM pg_database WHERE datname = current_database())";

/// Creates the extension in the benchmark's database and clears its figures for that
/// database only (other databases' figures are left alone). Fails when the server was not
/// started with the library preloaded.
async fn reset_statements(ctx: &Ctx) -> Result<(), sqlx::Error> {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&ctx.env.pool)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT pg_stat_statements_reset(0, {THIS_DB}, 0)"
    )))
    .execute(&ctx.env.pool)
    .await?;
    Ok(())
}

fn print_statements_unavailable(e: &sqlx::Error) {
    if e.to_string().contains("shared_preload_libraries") {
        println!(
            "postgres statements: pg_stat_statements not loaded (see docs/benchmarks.md, \"Reading the output\")"
        );
    } else {
        println!("postgres statements: pg_stat_statements not usable: {e}");
    }
}

async fn read_statements(ctx: &Ctx) -> Result<Vec<Statement>, sqlx::Error> {
    let rows: Vec<(i64, f64, f64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT calls, mean_exec_time, total_exec_time, query FROM pg_stat_statements
         WHERE dbid = {THIS_DB} ORDER BY total_exec_time DESC"
    )))
    .fetch_all(&ctx.env.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(calls, mean_ms, total_ms, query)| Statement {
            calls,
            mean_ms,
            total_ms,
            query,
        })
        .collect())
}

async fn commits(ctx: &Ctx) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&ctx.env.pool)
    .await?;
    Ok(n)
}

/// Prints the statements that took the most time, per run, with their share of the total.
pub fn print_statements(statements: &[Statement], runs: usize) {
    let total_ms: f64 = statements.iter().map(|s| s.total_ms).sum();
    println!(
        "postgres statements, top {TOP_STATEMENTS} by total time (calls/run, mean ms, share of time):"
    );
    for s in statements.iter().take(TOP_STATEMENTS) {
        println!(
            "  {:>8.2}  {:>8.3}  {:>5.1} %  {}",
            s.calls as f64 / runs as f64,
            s.mean_ms,
            100.0 * s.total_ms / total_ms.max(f64::MIN_POSITIVE),
            one_line(&s.query, 100)
        );
    }
}

/// The first `max` characters of `text` with every run of whitespace made one space.
fn one_line(text: &str, max: usize) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(max)
        .collect()
}

// ---------------------------------------------------------------------------- Redis

pub async fn redis_commandstats() -> anyhow::Result<HashMap<String, u64>> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    Ok(parse_commandstats(&info))
}

/// `cmdstat_<name>:calls=<n>,usec=...` lines to name and calls.
fn parse_commandstats(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// Calls per command during the window, most first; commands not called are left out.
pub fn commands_delta(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
) -> Vec<(String, u64)> {
    let mut delta: Vec<(String, u64)> = after
        .iter()
        .map(|(name, n)| {
            let was = before.get(name).copied().unwrap_or(0);
            (name.clone(), n.saturating_sub(was))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    delta.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    delta
}

// ---------------------------------------------------------------------------- RabbitMQ

/// The overview of the management API on the broker's host (port 15672), with the AMQP
/// URL's credentials. Fails when the management plugin is not enabled.
async fn rabbitmq_counts(ctx: &Ctx) -> anyhow::Result<RabbitCounts> {
    let amqp = reqwest::Url::parse(&amqp_url())?;
    let host = amqp.host_str().unwrap_or("127.0.0.1");
    let url = format!("http://{host}:15672/api/overview");
    let overview: Value = ctx
        .http
        .get(&url)
        .basic_auth(amqp.username(), amqp.password())
        .timeout(Duration::from_secs(2))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let count = |field: &str| overview["message_stats"][field].as_u64().unwrap_or(0);
    Ok(RabbitCounts {
        published: count("publish"),
        delivered: count("deliver_get"),
        acked: count("ack"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_give_calls_by_command() {
        let info = "# Commandstats\r\ncmdstat_rpush:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\ncmdstat_client|setname:calls=2,usec=1\r\n";
        let stats = parse_commandstats(info);
        assert_eq!(stats.get("rpush"), Some(&12));
        assert_eq!(stats.get("client|setname"), Some(&2));
    }

    #[test]
    fn command_deltas_leave_out_idle_commands() {
        let before = HashMap::from([("get".to_string(), 5), ("set".to_string(), 1)]);
        let after = HashMap::from([
            ("get".to_string(), 5),
            ("set".to_string(), 4),
            ("evalsha".to_string(), 9),
        ]);
        assert_eq!(
            commands_delta(&before, &after),
            vec![("evalsha".to_string(), 9), ("set".to_string(), 3)]
        );
    }

    #[test]
    fn queries_are_shown_on_one_line() {
        assert_eq!(
            one_line("SELECT a,\n       b\tFROM t", 14),
            "SELECT a, b FR"
        );
    }
}
