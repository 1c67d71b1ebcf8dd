//! What the section reads off the machine: samples of the processes, Redis and Postgres, and
//! the tally of the clients' counts.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use agentfleet_tests::harness::{binary, wait_for};

use super::client::{Shared, get};

/// One reading of the sampler.
#[derive(Clone, Debug)]
pub(super) struct Sample {
    /// Seconds since the first submission.
    pub(super) at: f64,
    pub(super) in_flight: usize,
    /// Runs held by a worker (`running`).
    pub(super) running: i64,
    pub(super) worker_rss_kib: u64,
    pub(super) model_connections: usize,
}

/// A helper process of this section (the scripted model, the tool server), killed when
/// dropped.
pub(super) struct Helper(pub(super) Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) async fn spawn_helper(name: &str, listen: &str) -> anyhow::Result<Helper> {
    let child = Command::new(binary(name))
        .args(["--listen", listen])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {name}"))?;
    let helper = Helper(child);
    let http = reqwest::Client::new();
    wait_for(
        &format!("{name} to answer"),
        Duration::from_secs(30),
        || {
            let req = http.get(format!("http://{listen}/health")).send();
            async move { req.await.ok().filter(|r| r.status().is_success()) }
        },
    )
    .await;
    Ok(helper)
}

pub(super) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Established TCP connections whose local port is `port` (the server's side of each).
pub(super) fn connections_to(port: u16) -> usize {
    established_on(
        &std::fs::read_to_string("/proc/net/tcp").unwrap_or_default(),
        port,
    )
}

/// The connections of a `/proc/net/tcp` text in state ESTABLISHED (`01`) whose local port is
/// `port`.
pub(super) fn established_on(proc_net_tcp: &str, port: u16) -> usize {
    let local = format!(":{port:04X}");
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let (Some(local_address), Some(_), Some(state)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return false;
            };
            local_address.ends_with(&local) && state == "01"
        })
        .count()
}

pub(super) async fn redis_used_memory(
    conn: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// A run's Redis keys (its event list, fence and id base): the bytes of the list's elements,
/// and what `MEMORY USAGE` says all of them take.
pub(super) async fn run_keys(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    id: &str,
) -> anyhow::Result<(usize, i64)> {
    let key = |name: &str| format!("{prefix}:run:{{{id}}}:{name}");
    let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(key("events"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    let mut usage = 0;
    for name in ["events", "fence", "base"] {
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key(name))
            .arg("SAMPLES")
            .arg(0)
            .query_async(conn)
            .await?;
        usage += bytes.unwrap_or(0);
    }
    Ok((items.iter().map(Vec::len).sum(), usage))
}

/// Reads the in-flight count, the held runs, the workers' memory and the model's connections
/// every `every`, until `stop`.
pub(super) fn sample(
    shared: Arc<Shared>,
    pool: sqlx::PgPool,
    workers: Vec<u32>,
    model_port: u16,
    t0: Instant,
    every: Duration,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return samples,
            }
            let (running,): (i64,) =
                sqlx::query_as("SELECT count(*) FROM runs WHERE status = 'running'")
                    .fetch_one(&pool)
                    .await
                    .unwrap_or((0,));
            samples.push(Sample {
                at: t0.elapsed().as_secs_f64(),
                in_flight: shared.in_flight.load(Ordering::Relaxed),
                running,
                worker_rss_kib: workers.iter().map(|pid| rss_kib(*pid)).sum(),
                model_connections: connections_to(model_port),
            });
        }
    })
}

/// What the clients had counted at one moment.
pub(super) struct Tally {
    pub(super) at: Instant,
    pub(super) utc: chrono::DateTime<chrono::Utc>,
    pub(super) completed: u64,
    pub(super) finished: u64,
    pub(super) tokens: u64,
    pub(super) latency: Vec<u64>,
}

impl Tally {
    pub(super) fn now(shared: &Shared) -> Tally {
        let c = &shared.counters;
        Tally {
            at: Instant::now(),
            utc: chrono::Utc::now(),
            completed: get(&c.completed),
            finished: get(&c.completed) + get(&c.not_completed),
            tokens: get(&c.tokens),
            latency: shared.latency.snapshot(),
        }
    }
}

/// The CPU, the clients' counts, Redis's used_memory and command counts at the start of the
/// sustained window.
pub(super) type WindowStart = (
    crate::cpu::CpuSnapshot,
    Tally,
    u64,
    Option<std::collections::HashMap<String, u64>>,
);
