//! The `auth` section (`--only auth`): what a flood of made-up API keys costs a real key's
//! requests. A real key's `GET /v1/runs?limit=1` is timed alone, then again while 20,000
//! requests with random well-formed keys (`af_` and 64 hex digits, each new, so no cache
//! knows them) arrive at once, 64 in flight, from the benchmark's one address. The goal: the
//! real key's p99 within twice its value without the flood (api.auth_max_failures,
//! api.auth_negative_ttl_ms at their defaults). Then the same against a second API process
//! with the per-source limit off (`api.auth_max_failures = 0`), where every made-up key is a
//! Postgres lookup: what that limit is worth.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// Requests of made-up keys in flight at once.
const FLOOD_IN_FLIGHT: usize = 64;
/// Clients of the real key, each sending one request after another.
const REAL_CLIENTS: usize = 4;

pub async fn flood(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    measure(ctx, &ctx.base, report, "").await?;
    // The same against an API process with the per-source limit off: every made-up key is a
    // Postgres lookup, as before that limit existed.
    let (mut api, base) = ctx
        .env
        .spawn_api_process(&[
            ("RUST_LOG", "error"),
            ("AGENTFLEET__API__AUTH_MAX_FAILURES", "0"),
        ])
        .await;
    let measured = measure(ctx, &base, report, ", per-source limit off").await;
    api.kill();
    measured
}

/// The real key alone, then during the flood, against the API at `base`; `label` ends each
/// figure's name.
async fn measure(ctx: &Ctx, base: &str, report: &mut Report, label: &str) -> anyhow::Result<()> {
    let (flood_n, real_n) = if ctx.args.smoke {
        (300, 100)
    } else {
        (20_000, 2_000)
    };
    // Warm: the key is cached, connections are open.
    real_key_latencies(ctx, base, 50, None).await?;
    let alone = sorted(real_key_latencies(ctx, base, real_n, None).await?);
    let started = Instant::now();
    let flooding = tokio::spawn(made_up_keys(ctx.http.clone(), base.to_owned(), flood_n));
    // The real key's requests go on for as long as the flood lasts.
    let during = real_key_latencies(ctx, base, usize::MAX, Some(&flooding));
    let during = sorted(during.await?);
    let (refused_401, refused_429, other) = flooding.await??;
    let flood_secs = started.elapsed().as_secs_f64();
    let (p99_alone, p99_during) = (percentile(&alone, 0.99), percentile(&during, 0.99));
    let mut add = |metric: &str, value: f64, unit: &str, goal: Option<(&str, bool)>| {
        report.add("auth", &format!("{metric}{label}"), value, unit, goal);
    };
    add("real key p50, alone", percentile(&alone, 0.5), "ms", None);
    add("real key p99, alone", p99_alone, "ms", None);
    add("real key p50, flood", percentile(&during, 0.5), "ms", None);
    add("real key p99, flood", p99_during, "ms", None);
    let ratio = p99_during / p99_alone;
    add(
        "real key p99 flood / alone",
        ratio,
        "x",
        Some(("(goal ≤ 2)", ratio <= 2.0)),
    );
    add(
        "made-up keys answered/s",
        flood_n as f64 / flood_secs,
        "/s",
        None,
    );
    add("made-up keys answered 401", refused_401 as f64, "", None);
    add("made-up keys answered 429", refused_429 as f64, "", None);
    anyhow::ensure!(
        other.is_empty(),
        "{} made-up keys were answered neither 401 nor 429: {other:?}",
        other.len()
    );
    Ok(())
}

/// `n` requests of the real key from [`REAL_CLIENTS`] clients, or as many as are sent until
/// `until` has finished; each one's latency in ms.
async fn real_key_latencies(
    ctx: &Ctx,
    base: &str,
    n: usize,
    until: Option<&tokio::task::JoinHandle<Flooded>>,
) -> anyhow::Result<Vec<f64>> {
    let url = format!("{base}/v1/runs?limit=1");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = (0..REAL_CLIENTS).map(|c| {
        let (http, url, key) = (ctx.http.clone(), url.clone(), ctx.key.clone());
        let mine = n / REAL_CLIENTS + usize::from(c < n % REAL_CLIENTS);
        let done = done.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..mine {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let t = Instant::now();
                let resp = http.get(&url).bearer_auth(&key).send().await?;
                if resp.status() != 200 {
                    let status = resp.status();
                    anyhow::bail!("real key answered {status}: {}", resp.text().await?);
                }
                resp.bytes().await?;
                out.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok(out)
        })
    });
    let clients: Vec<_> = clients.collect();
    if let Some(until) = until {
        while !until.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let mut all = Vec::new();
    for client in futures_util::future::join_all(clients).await {
        all.extend(client??);
    }
    Ok(all)
}

/// How many made-up keys were answered 401 and 429, and the other answers.
type Flooded = anyhow::Result<(usize, usize, Vec<u16>)>;

/// `n` requests, each with a new random key.
async fn made_up_keys(http: reqwest::Client, base: String, n: usize) -> Flooded {
    let slots = Arc::new(Semaphore::new(FLOOD_IN_FLIGHT));
    let url = format!("{base}/v1/runs?limit=1");
    let mut sent = Vec::with_capacity(n);
    for _ in 0..n {
        let slot = slots.clone().acquire_owned().await?;
        let req = http
            .get(&url)
            .bearer_auth(agentfleet_shared::store::keys::generate_key())
            .send();
        sent.push(tokio::spawn(async move {
            let status = req.await.map(|r| r.status().as_u16());
            drop(slot);
            status
        }));
    }
    let (mut unauthorized, mut limited, mut other) = (0, 0, Vec::new());
    for answer in futures_util::future::join_all(sent).await {
        match answer?? {
            401 => unauthorized += 1,
            429 => limited += 1,
            status => other.push(status),
        }
    }
    Ok((unauthorized, limited, other))
}
