//! The `fairness` section (`--only fairness`): what fair dispatch costs and what it buys.
//!
//! Cost: the same no-op runs drained by the same workers for a tenant without a running limit
//! (the path without fair dispatch) and for one whose limit equals the workers' slots (every
//! run created held and dispatched in turn, but the window never binds), alternately, twice
//! each; the better of each pair is compared.
//!
//! What it buys: a big tenant's backlog drains while a small tenant submits one run at a
//! time; each small run's time to start (created to claimed, when `run_started` is its first
//! event after `run_queued`), with the big tenant limited and, for contrast, unlimited.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::store::tenants;
use agentfleet_tests::harness::wait_for;
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

const SLOTS_PER_WORKER: usize = 64;

struct Tenant {
    id: Uuid,
    key: String,
}

async fn tenant(ctx: &Ctx, name: &str, max_running_runs: Option<usize>) -> anyhow::Result<Tenant> {
    let created = tenants::create(&ctx.env.pool, name).await?;
    if let Some(limit) = max_running_runs {
        sqlx::query("UPDATE tenants SET limits = $2 WHERE id = $1")
            .bind(created.tenant_id)
            .bind(json!({ "max_running_runs": limit }))
            .execute(&ctx.env.pool)
            .await?;
    }
    Ok(Tenant {
        id: created.tenant_id,
        key: created.api_key,
    })
}

/// Submits `n` copies of `run` for `tenant` in batches of at most 1,000.
async fn submit(ctx: &Ctx, tenant: &Tenant, run: &Value, n: usize) -> anyhow::Result<()> {
    let mut left = n;
    while left > 0 {
        let size = left.min(1000);
        let resp = ctx
            .http
            .post(format!("{}/v1/runs/batch", ctx.base))
            .bearer_auth(&tenant.key)
            .json(&json!({ "runs": vec![run.clone(); size] }))
            .send()
            .await?;
        anyhow::ensure!(resp.status() == 202, "batch: {}", resp.text().await?);
        left -= size;
    }
    Ok(())
}

async fn completed(ctx: &Ctx, tenant: &Tenant) -> i64 {
    sqlx::query_as::<_, (i64,)>(
        "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status = 'completed'",
    )
    .bind(tenant.id)
    .fetch_one(&ctx.env.pool)
    .await
    .map_or(0, |(n,)| n)
}

/// Runs/s of `n` runs of a fresh tenant, from the first POST to the last completion.
async fn drain_rate(
    ctx: &Ctx,
    name: &str,
    limit: Option<usize>,
    run: &Value,
    n: usize,
) -> anyhow::Result<f64> {
    let t = tenant(ctx, name, limit).await?;
    let start = Instant::now();
    submit(ctx, &t, run, n).await?;
    wait_for("the runs to complete", Duration::from_secs(600), || async {
        (completed(ctx, &t).await >= n as i64).then_some(())
    })
    .await;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// The small tenant's times to start (ms) while `big`'s backlog of `backlog` runs drains.
async fn small_tenant_waits(
    ctx: &Ctx,
    big_limit: Option<usize>,
    run: &Value,
    backlog: usize,
    small_runs: usize,
) -> anyhow::Result<Vec<f64>> {
    let big = tenant(ctx, "big", big_limit).await?;
    let small = tenant(ctx, "small", None).await?;
    submit(ctx, &big, run, backlog).await?;
    for _ in 0..small_runs {
        submit(ctx, &small, run, 1).await?;
        // Spread over the drain rather than all at once.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(
        "the small tenant's runs",
        Duration::from_secs(600),
        || async { (completed(ctx, &small).await >= small_runs as i64).then_some(()) },
    )
    .await;
    let waits: Vec<(f64,)> = sqlx::query_as(
        "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000
         FROM runs WHERE tenant_id = $1",
    )
    .bind(small.id)
    .fetch_all(&ctx.env.pool)
    .await?;
    ctx.settle().await;
    Ok(sorted(waits.into_iter().map(|(w,)| w).collect()))
}

pub async fn fairness(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let (n, backlog, small_runs) = if ctx.args.smoke {
        (20, 100, 5)
    } else {
        (2000, 3000, 50)
    };
    let workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", &SLOTS_PER_WORKER.to_string()),
            ("database.max_connections", "20"),
        ],
    );
    let slots = SLOTS_PER_WORKER * workers.len();
    let run = json!({"input": script(json!([{"content": "done"}])), "agent": {"model": "mock"}});
    // Warm-up: the workers connect and the first plans are made outside the measurement.
    drain_rate(ctx, "warm-up", None, &run, n.min(200)).await?;

    let (mut plain, mut fair) = (0f64, 0f64);
    for round in 0..2 {
        plain = plain.max(drain_rate(ctx, &format!("plain {round}"), None, &run, n).await?);
        fair = fair.max(drain_rate(ctx, &format!("fair {round}"), Some(slots), &run, n).await?);
    }
    report.add(
        "fairness",
        "runs/s without a running limit",
        plain,
        "/s",
        None,
    );
    report.add(
        "fairness",
        &format!("runs/s, fair dispatch (limit {slots} = slots)"),
        fair,
        "/s",
        None,
    );
    let cost = (1.0 - fair / plain) * 100.0;
    report.add(
        "fairness",
        "throughput cost of fair dispatch",
        cost,
        "%",
        Some(("goal < 10 %", cost < 10.0)),
    );

    let window = slots / 4;
    let fair_waits = small_tenant_waits(ctx, Some(window), &run, backlog, small_runs).await?;
    let plain_waits = small_tenant_waits(ctx, None, &run, backlog, small_runs).await?;
    for (label, waits) in [
        (format!("big limited to {window}"), &fair_waits),
        ("big unlimited".to_owned(), &plain_waits),
    ] {
        report.add(
            "fairness",
            &format!("small tenant start p50, {label}"),
            percentile(waits, 0.5),
            "ms",
            None,
        );
        report.add(
            "fairness",
            &format!("small tenant start p99, {label}"),
            percentile(waits, 0.99),
            "ms",
            None,
        );
    }
    drop(workers);
    Ok(())
}
