//! The `memory` section (`--only memory`).

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use agentfleet_tests::harness::wait_for;
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::Ctx;

/// Worker RSS with many runs waiting on a slow model.
pub async fn memory(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 200 } else { 10_000 };
    let concurrency = n.to_string();
    let worker = ctx.env.spawn_worker_process(&[
        ("worker.concurrency", concurrency.as_str()),
        ("worker.lease_renew_ms", "5000"),
        ("database.max_connections", "20"),
    ]);
    // Let it connect and settle before the idle reading.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = rss_kib(worker.pid()).unwrap_or(0);
    let input = script(json!([{"content": "slow", "delay_ms": 600000}]));
    let one = json!({"input": input, "agent": {"model": "mock"}});
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let runs: Vec<Value> = chunk.iter().map(|_| one.clone()).collect();
        ctx.post("/v1/runs/batch", &json!({"runs": runs})).await?;
    }
    let started = Instant::now();
    wait_for(
        "all runs to be waiting on the model",
        Duration::from_secs(600),
        || async {
            (ctx.count("running").await >= n as i64 && ctx.env.llm.request_count() >= n)
                .then_some(())
        },
    )
    .await;
    let rss = rss_kib(worker.pid()).context("reading VmRSS")? as f64 / 1024.0;
    report.add(
        "memory",
        "runs waiting on the model in one worker",
        n as f64,
        "",
        None,
    );
    report.add(
        "memory",
        "time for all to start",
        started.elapsed().as_secs_f64(),
        "s",
        None,
    );
    report.add(
        "memory",
        "worker RSS idle",
        baseline as f64 / 1024.0,
        "MiB",
        None,
    );
    let goal = if n >= 10_000 {
        Some(("goal <= 1024 MiB", rss <= 1024.0))
    } else {
        None
    };
    report.add("memory", "worker RSS with them waiting", rss, "MiB", goal);
    report.add(
        "memory",
        "RSS per waiting run",
        (rss * 1024.0) / n as f64,
        "KiB",
        None,
    );
    drop(worker);
    Ok(())
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
