//! The `enqueue` section (`--only enqueue`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tokio::sync::Semaphore;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};
use crate::cpu::CpuSampler;

/// Durable `POST /v1/runs` throughput, latency and machine CPU per run over a concurrency
/// sweep, no workers.
pub async fn enqueue(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    let (levels, n): (&[usize], usize) = if ctx.args.smoke {
        (&[1, 8], 40)
    } else {
        (&[1, 8, 32, 64], 3000)
    };
    let tools: Vec<_> = ctx.extra_tools().collect();
    let body = if tools.is_empty() {
        json!({"input": "hello", "agent": {"model": "mock"}})
    } else {
        json!({"input": "hello", "agent": {"model": "mock", "tools": tools}})
    };
    let mut best = 0.0f64;
    // The whole machine only: no workers run here, and the e2e section has the breakdown.
    let cpu = CpuSampler::new(Vec::new());
    for &c in levels {
        let sem = Arc::new(Semaphore::new(c));
        let cpu_start = cpu.snapshot()?;
        let t = Instant::now();
        let mut tasks = Vec::with_capacity(n);
        for _ in 0..n {
            let permit = sem.clone().acquire_owned().await?;
            let http = ctx.http.clone();
            let url = format!("{}/v1/runs", ctx.base);
            let key = ctx.key.clone();
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                let resp = http.post(url).bearer_auth(key).json(&body).send().await;
                drop(permit);
                let ok = resp.map(|r| r.status() == 202).unwrap_or(false);
                (start.elapsed().as_secs_f64() * 1000.0, ok)
            }));
        }
        let mut lat = Vec::with_capacity(n);
        let mut failures = 0;
        for task in tasks {
            let (ms, ok) = task.await?;
            if !ok {
                failures += 1;
            }
            lat.push(ms);
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        let used = cpu.usage(&cpu_start, &cpu.snapshot()?);
        let lat = sorted(lat);
        let p99 = percentile(&lat, 0.99);
        best = best.max(rate);
        report.add("enqueue", &format!("c={c} runs/s"), rate, "/s", None);
        report.add(
            "enqueue",
            &format!("c={c} p50 latency"),
            percentile(&lat, 0.5),
            "ms",
            None,
        );
        report.add(
            "enqueue",
            &format!("c={c} p99 latency"),
            p99,
            "ms",
            (c >= 32).then_some(("goal p99 <= 20 ms", p99 <= 20.0)),
        );
        report.add(
            "enqueue",
            &format!("c={c} machine CPU per run"),
            used.machine_ms / n as f64,
            "ms",
            None,
        );
        anyhow::ensure!(failures == 0, "{failures} enqueue requests failed at c={c}");
    }
    report.add(
        "enqueue",
        "best runs/s",
        best,
        "/s",
        Some(("goal >= 3000/s", best >= 3000.0)),
    );
    if let Some(pg) = limits.get("pg") {
        report.add(
            "enqueue",
            "best runs/s / postgres commits/s",
            best / pg,
            "ratio",
            None,
        );
    }
    if let Some(amqp) = limits.get("amqp") {
        report.add(
            "enqueue",
            "best runs/s / rabbitmq publishes/s",
            best / amqp,
            "ratio",
            None,
        );
    }
    Ok(())
}
