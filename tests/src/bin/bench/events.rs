//! The `events` section (`--only events`).

use std::collections::HashMap;
use std::time::Instant;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};

use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// From the worker's append (the envelope's `at`, millisecond resolution) to receipt by an SSE
/// client, with many clients.
pub async fn event_latency(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    // The goal's load: 1,000 clients receiving 20,000 events/s in all (50 runs streaming 20
    // events/s each, 20 clients per run).
    let (runs, clients, chunks) = if ctx.args.smoke {
        (4, 2, 20)
    } else {
        (50, 20, 100)
    };
    let _workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", "64"),
            ("events.delta_flush_bytes", "1"),
            ("events.delta_flush_ms", "1"),
        ],
    );
    let text = "abcdefghij".repeat(chunks / 10);
    let input = script(
        json!([{"content": text, "chunks": chunks, "chunk_delay_ms": 50, "delay_ms": 1500}]),
    );
    let body = json!({"input": input, "agent": {"model": "mock"}});
    let mut handles = Vec::new();
    let t = Instant::now();
    for _ in 0..runs {
        let run = ctx.post("/v1/runs", &body).await?;
        let id = run["id"].as_str().unwrap().to_string();
        for _ in 0..clients {
            let (http, url, key) = (
                ctx.http.clone(),
                format!("{}/v1/runs/{id}/events", ctx.base),
                ctx.key.clone(),
            );
            handles.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let Ok(resp) = http.get(url).bearer_auth(key).send().await else {
                    return (lat, 0);
                };
                let mut stream = resp.bytes_stream().eventsource();
                let mut n = 0;
                while let Some(Ok(ev)) = stream.next().await {
                    let now = chrono::Utc::now();
                    let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
                        continue;
                    };
                    n += 1;
                    if v["type"] == "message_delta"
                        && let Some(at) = v["at"]
                            .as_str()
                            .and_then(|a| chrono::DateTime::parse_from_rfc3339(a).ok())
                    {
                        lat.push(
                            (now - at.with_timezone(&chrono::Utc))
                                .num_microseconds()
                                .unwrap_or(0) as f64
                                / 1000.0,
                        );
                    }
                }
                (lat, n)
            }));
        }
    }
    let mut all = Vec::new();
    let mut events = 0usize;
    for h in handles {
        let (lat, n) = h.await?;
        events += n;
        all.extend(lat);
    }
    let secs = t.elapsed().as_secs_f64();
    let lat = sorted(all);
    let p99 = percentile(&lat, 0.99);
    report.add("events", "SSE clients", (runs * clients) as f64, "", None);
    report.add(
        "events",
        "events delivered to clients/s",
        events as f64 / secs,
        "/s",
        None,
    );
    report.add(
        "events",
        "append-to-client latency p50 (1 ms resolution)",
        percentile(&lat, 0.5),
        "ms",
        None,
    );
    report.add(
        "events",
        "append-to-client latency p99 (1 ms resolution)",
        p99,
        "ms",
        Some(("goal <= 10 ms", p99 <= 10.0)),
    );
    if let Some(redis) = limits.get("redis") {
        report.add(
            "events",
            "appended events/s / redis RPUSH/s",
            (events / clients.max(1)) as f64 / secs / redis,
            "ratio",
            None,
        );
    }
    Ok(())
}

/// Most API processes `--api-replicas` may ask for (each names its CPU group).
pub const MAX_API_REPLICAS: usize = 8;

const REPLICA_NAMES: [&str; MAX_API_REPLICAS] = [
    "api 1", "api 2", "api 3", "api 4", "api 5", "api 6", "api 7", "api 8",
];

/// `database.max_connections` of the API processes started for the fan-out (an SSE stream
/// reads Postgres only as it opens): four of them beside the workers stay well within the
/// server's 100 connections.
const REPLICA_DB_CONNECTIONS: &str = "6";

/// What one replica count's window measured.
struct FanOutRound {
    secs: f64,
    /// Events received by the clients inside the window.
    delivered: u64,
    /// Deltas received before the window opened (the model's wait was too short for every
    /// client to connect first).
    early_deltas: u64,
    /// Streams that ended without their run's `run_completed`, or never opened.
    cut: usize,
    redis_out_bytes: u64,
    publishes: u64,
    cpu: crate::cpu::CpuUsage,
    /// The API processes' CPU per second before any stream opened, all together.
    idle_api_ms_per_s: f64,
    /// The API processes' context switches in the window: (voluntary, involuntary).
    switches: (u64, u64),
}

/// CPU of the API processes' groups ("api 1", "api 2", …) together, in ms.
fn api_cpu_ms(usage: &crate::cpu::CpuUsage) -> f64 {
    usage
        .groups
        .iter()
        .filter(|(name, _)| name.starts_with("api "))
        .map(|(_, ms)| *ms)
        .sum()
}

/// `--api-replicas`: Redis output and API CPU per delivered event as the API processes are
/// multiplied, each serving its share of the streams. 2,000 SSE clients (100 runs streaming 10
/// deltas a second each, 20 clients per run: 1,000 appends/s, 20,000 deliveries/s) are spread
/// evenly over N API processes on the same database, Redis and RabbitMQ, every client of a
/// run on the same one (run `i` on replica `i mod N`). That is a run's viewers sent to one
/// replica, as a load balancer does with one viewer per run (most agent runs have one: the
/// user who started it) or with sticky routing; a run watched from every replica would make
/// every replica want every event whatever the hub does. The window opens once every client
/// has its response and closes when the last stream ends.
pub async fn fan_out(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    use crate::cpu::{CpuSampler, Group};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    use agentfleet_tests::harness::{ChildProcess, redis_url};

    let replicas = ctx.args.api_replicas();
    let (total_runs, clients, chunks, chunk_ms, wait_ms) = if ctx.args.smoke {
        (4, 5, 20, 20, 1000)
    } else {
        (100, 20, 100, 100, 3000)
    };
    let workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", "64"),
            ("database.max_connections", "12"),
            ("events.delta_flush_bytes", "1"),
            ("events.delta_flush_ms", "1"),
        ],
    );
    tokio::time::sleep(Duration::from_millis(if ctx.args.smoke {
        300
    } else {
        1500
    }))
    .await;
    let text = "abcdefghij".repeat(chunks / 10);
    let input = script(json!([{"content": text, "chunks": chunks,
                               "chunk_delay_ms": chunk_ms, "delay_ms": wait_ms}]));
    let body = json!({"input": input, "agent": {"model": "mock"}});
    let postmaster = crate::cpu::postmaster(&ctx.env.pool).await;
    let mut redis = redis::Client::open(redis_url())?
        .get_multiplexed_async_connection()
        .await?;
    // The runs belong to ten tenants, so no tenant passes `api.max_streams_per_tenant` (1,000
    // per API process) with every stream on one replica.
    let mut keys = Vec::new();
    for _ in 0..10 {
        keys.push(
            agentfleet_shared::store::tenants::create(&ctx.env.pool, "bench fan-out")
                .await?
                .api_key,
        );
    }
    let mut figures = Vec::new();
    for &n in &replicas {
        // By default the same streams are spread over more processes; with
        // `--fan-out-runs-per-api` each process serves the same number of them, so the load
        // grows with the processes.
        let runs = ctx
            .args
            .fan_out_runs_per_api
            .map_or(total_runs, |per_api| per_api * n);
        // Replica 1 is the benchmark's own API process; the others are started for this round.
        let mut started: Vec<ChildProcess> = Vec::new();
        let mut bases = vec![ctx.base.clone()];
        let mut pids = vec![ctx.api.pid()];
        for _ in 1..n {
            let (api, base) = ctx
                .env
                .spawn_api_process(&[(
                    "AGENTFLEET__DATABASE__MAX_CONNECTIONS",
                    REPLICA_DB_CONNECTIONS,
                )])
                .await;
            pids.push(api.pid());
            bases.push(base);
            started.push(api);
        }
        let mut groups: Vec<Group> = pids
            .iter()
            .enumerate()
            .map(|(i, pid)| Group::pids(REPLICA_NAMES[i], vec![*pid]))
            .collect();
        groups.extend([
            Group::pids("workers", workers.iter().map(ChildProcess::pid).collect()),
            Group::redis(),
            Group::postgres(postmaster),
            Group::rabbitmq(),
            Group::this("client"),
        ]);
        let sampler = CpuSampler::new(groups);
        // What the processes use with nothing to serve: their background work (elections,
        // pings, pollers), a cost per process whatever the load.
        let idle_secs = if ctx.args.smoke { 0.3 } else { 3.0 };
        let idle_start = sampler.snapshot()?;
        tokio::time::sleep(Duration::from_secs_f64(idle_secs)).await;
        let idle = sampler.usage(&idle_start, &sampler.snapshot()?);
        let idle_api_ms_per_s = api_cpu_ms(&idle) / idle_secs;

        let connected = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicBool::new(false));
        let delivered = Arc::new(AtomicU64::new(0));
        let early = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for r in 0..runs {
            let (base, key) = (&bases[r % n], &keys[r % keys.len()]);
            let resp = ctx
                .http
                .post(format!("{base}/v1/runs"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await?;
            anyhow::ensure!(
                resp.status().is_success(),
                "POST /v1/runs: {}",
                resp.status()
            );
            let run: Value = resp.json().await?;
            let id = run["id"].as_str().unwrap_or_default().to_string();
            for _ in 0..clients {
                let (http, url, key) = (
                    ctx.http.clone(),
                    format!("{base}/v1/runs/{id}/events"),
                    key.clone(),
                );
                let (connected, failed, open, delivered, early) = (
                    connected.clone(),
                    failed.clone(),
                    open.clone(),
                    delivered.clone(),
                    early.clone(),
                );
                handles.push(tokio::spawn(async move {
                    let resp = match http.get(url).bearer_auth(key).send().await {
                        Ok(resp) if resp.status().is_success() => resp,
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            return false;
                        }
                    };
                    connected.fetch_add(1, Ordering::Relaxed);
                    let mut stream = resp.bytes_stream().eventsource();
                    let mut completed = false;
                    while let Some(Ok(ev)) = stream.next().await {
                        if open.load(Ordering::Relaxed) {
                            delivered.fetch_add(1, Ordering::Relaxed);
                        } else if ev.data.contains("\"message_delta\"") {
                            early.fetch_add(1, Ordering::Relaxed);
                        }
                        completed = ev.data.contains("\"type\":\"run_completed\"");
                    }
                    completed
                }));
            }
        }
        let total = runs * clients;
        agentfleet_tests::harness::wait_for(
            "every SSE client to connect",
            Duration::from_secs(60),
            || {
                let done = connected.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
                async move { (done >= total).then_some(()) }
            },
        )
        .await;
        let cpu_start = sampler.snapshot()?;
        let switches_start = crate::cpu::context_switches(&pids);
        let (out_start, cmds_start) = (
            net_output_bytes(&mut redis).await?,
            crate::ops::redis_commandstats().await?,
        );
        open.store(true, Ordering::Relaxed);
        let t = Instant::now();
        let mut cut = 0;
        for h in handles {
            if !h.await? {
                cut += 1;
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let cpu_end = sampler.snapshot()?;
        let switches_end = crate::cpu::context_switches(&pids);
        let (out_end, cmds_end) = (
            net_output_bytes(&mut redis).await?,
            crate::ops::redis_commandstats().await?,
        );
        let calls = |stats: &HashMap<String, u64>| {
            stats.get("publish").copied().unwrap_or(0) + stats.get("spublish").copied().unwrap_or(0)
        };
        let round = FanOutRound {
            secs,
            delivered: delivered.load(Ordering::Relaxed),
            early_deltas: early.load(Ordering::Relaxed),
            cut,
            redis_out_bytes: out_end.saturating_sub(out_start),
            publishes: calls(&cmds_end).saturating_sub(calls(&cmds_start)),
            cpu: sampler.usage(&cpu_start, &cpu_end),
            idle_api_ms_per_s,
            switches: (
                switches_end.0.saturating_sub(switches_start.0),
                switches_end.1.saturating_sub(switches_start.1),
            ),
        };
        drop(started);
        ctx.settle().await;
        figures.push((n, fan_out_figures(n, runs, clients, &round, report)));
    }
    // Flat: the largest replica count's figure within a quarter of the smallest's.
    if let (Some((first, a)), Some((last, b))) = (figures.first(), figures.last())
        && last > first
    {
        // API CPU per event falls as a process gets busier (a wake-up serves more events), so
        // it is held flat only with the load per process fixed: spreading a fixed total over
        // more processes measures their lighter load, not the replicas (docs/benchmarks.md).
        let per_api_fixed = ctx.args.fan_out_runs_per_api.is_some();
        for (i, what, goal) in [(0, "redis B", true), (1, "API CPU", per_api_fixed)] {
            let growth = b[i] / a[i];
            let scaling = if per_api_fixed {
                "load per API fixed"
            } else {
                "total fixed"
            };
            report.add(
                "events",
                &format!("fan-out: {what}/event, {last} / {first} API ({scaling})"),
                growth,
                "ratio",
                goal.then_some(("flat: goal <= 1.25", growth <= 1.25)),
            );
        }
    }
    Ok(())
}

/// Prints a round's line and adds its figures; returns Redis output bytes and API CPU µs per
/// delivered event.
fn fan_out_figures(
    n: usize,
    runs: usize,
    clients: usize,
    round: &FanOutRound,
    report: &mut Report,
) -> [f64; 2] {
    let events = round.delivered.max(1) as f64;
    let us = |ms: f64| ms * 1000.0 / events;
    let api: Vec<f64> = round
        .cpu
        .groups
        .iter()
        .filter(|(name, _)| name.starts_with("api "))
        .map(|(_, ms)| *ms)
        .collect();
    let api_ms: f64 = api.iter().sum();
    let group = |name: &str| {
        round
            .cpu
            .groups
            .iter()
            .find(|(g, _)| *g == name)
            .map_or(0.0, |(_, ms)| *ms)
    };
    println!(
        "fan-out {n} API: {} clients over {runs} runs, {} events delivered in {:.1} s ({:.0}/s), \
         {} streams cut, {} deltas before the window; redis out {:.1} MB ({:.1} B/event, {} \
         publishes, {:.0} B/publish)",
        runs * clients,
        round.delivered,
        round.secs,
        events / round.secs,
        round.cut,
        round.early_deltas,
        round.redis_out_bytes as f64 / 1e6,
        round.redis_out_bytes as f64 / events,
        round.publishes,
        round.redis_out_bytes as f64 / round.publishes.max(1) as f64,
    );
    let busy_ms = api_ms - round.idle_api_ms_per_s * round.secs;
    println!(
        "  api per delivered event: {:.2} µs less the processes' idle CPU ({:.1} ms/s idle in \
         all), {:.3} voluntary and {:.3} involuntary context switches",
        us(busy_ms),
        round.idle_api_ms_per_s,
        round.switches.0 as f64 / events,
        round.switches.1 as f64 / events,
    );
    println!(
        "  cpu per delivered event: api {:.2} µs ({}) · workers {:.2} · redis {:.2} · postgres \
         {:.2} · rabbitmq {:.2} · client {:.2} · machine {:.2} µs; load average {}",
        us(api_ms),
        api.iter()
            .map(|ms| format!("{:.2}", us(*ms)))
            .collect::<Vec<_>>()
            .join(" · "),
        us(group("workers")),
        us(group("redis")),
        us(group("postgres")),
        us(group("rabbitmq")),
        us(group("client")),
        us(round.cpu.machine_ms),
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
    );
    let label = |what: &str| format!("fan-out, {n} API: {what}");
    report.add(
        "events",
        &label("events delivered/s"),
        events / round.secs,
        "/s",
        None,
    );
    let bytes = round.redis_out_bytes as f64 / events;
    report.add(
        "events",
        &label("redis output bytes per event"),
        bytes,
        "B",
        None,
    );
    report.add(
        "events",
        &label("API CPU per event"),
        us(api_ms),
        "µs",
        None,
    );
    report.add(
        "events",
        &label("API CPU per event less idle"),
        us(busy_ms),
        "µs",
        None,
    );
    report.add(
        "events",
        &label("API voluntary context switches per event"),
        round.switches.0 as f64 / events,
        "",
        None,
    );
    report.add(
        "events",
        &label("machine CPU per event"),
        us(round.cpu.machine_ms),
        "µs",
        None,
    );
    report.add("events", &label("streams cut"), round.cut as f64, "", None);
    [bytes, us(api_ms)]
}

/// Redis's `total_net_output_bytes` (`INFO stats`): everything the server has written to its
/// clients, pub/sub messages included.
async fn net_output_bytes(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("INFO stats has no total_net_output_bytes"))
}
