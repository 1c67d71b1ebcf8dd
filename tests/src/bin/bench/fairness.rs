//! The `fairness` section (`--only fairness`): what fair share costs and what it buys, with the
//! shipped configuration (no tenant has a limit).
//!
//! Cost: the same no-op runs (10,000), submitted as one tenant's backlog (batches of 1,000) and drained
//! by the same workers, through an API with the fair share (the shipped defaults: every batch
//! run created held and dispatched within its tenant's window) and through a second API with
//! it off (`fair_share.window_per_slot = 0`: published at once), in three adjacent pairs (the
//! middle one in the other order); the figure is the median of the pairs' ratios.
//!
//! What it buys: a big tenant's backlog drains while a small tenant submits one run at a time;
//! each small run's time to start (created to claimed), behind a backlog of N runs and of 10 N
//! runs with the fair share, and behind N runs without it, for contrast.

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

async fn tenant(ctx: &Ctx, name: &str) -> anyhow::Result<Tenant> {
    let created = tenants::create(&ctx.env.pool, name).await?;
    Ok(Tenant {
        id: created.tenant_id,
        key: created.api_key,
    })
}

/// Submits `n` copies of `run` for `tenant` in batches of at most 1,000, through the API at
/// `base`.
async fn submit(
    ctx: &Ctx,
    base: &str,
    tenant: &Tenant,
    run: &Value,
    n: usize,
) -> anyhow::Result<()> {
    let mut left = n;
    while left > 0 {
        let size = left.min(1000);
        let resp = ctx
            .http
            .post(format!("{base}/v1/runs/batch"))
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

/// Runs/s of `n` runs of a fresh tenant submitted through the API at `base`, from the first
/// POST to the last completion.
async fn drain_rate(
    ctx: &Ctx,
    base: &str,
    name: &str,
    run: &Value,
    n: usize,
) -> anyhow::Result<f64> {
    let t = tenant(ctx, name).await?;
    let start = Instant::now();
    submit(ctx, base, &t, run, n).await?;
    wait_for("the runs to complete", Duration::from_secs(600), || async {
        (completed(ctx, &t).await >= n as i64).then_some(())
    })
    .await;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// What the small tenant waited for while a big tenant's backlog drained, per small run, sorted:
/// milliseconds from its creation to its start, and the big tenant's runs that started in that
/// time (what it waited behind, in runs: the measure that does not depend on the drain's rate).
struct Waits {
    ms: Vec<f64>,
    runs_ahead: Vec<f64>,
}

/// The small tenant's waits while `big`'s backlog of `backlog` runs drains, both submitting
/// through the API at `base`.
async fn small_tenant_waits(
    ctx: &Ctx,
    base: &str,
    run: &Value,
    backlog: usize,
    small_runs: usize,
) -> anyhow::Result<Waits> {
    let big = tenant(ctx, "big").await?;
    let small = tenant(ctx, "small").await?;
    submit(ctx, base, &big, run, backlog).await?;
    for _ in 0..small_runs {
        submit(ctx, base, &small, run, 1).await?;
        // One at a time, a little apart, and all while the smaller backlog still drains (at
        // 1,500 runs/s, 3,000 runs last 2 s).
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    wait_for(
        "the small tenant's runs",
        Duration::from_secs(600),
        || async { (completed(ctx, &small).await >= small_runs as i64).then_some(()) },
    )
    .await;
    // The next measurement starts on an idle fleet.
    wait_for(
        "the big tenant's backlog",
        Duration::from_secs(1800),
        || async { (completed(ctx, &big).await >= backlog as i64).then_some(()) },
    )
    .await;
    let waits: Vec<(f64, i64)> = sqlx::query_as(
        "SELECT extract(epoch FROM s.started_at - s.created_at)::float8 * 1000,
                (SELECT count(*) FROM runs b WHERE b.tenant_id = $2
                   AND b.started_at > s.created_at AND b.started_at < s.started_at)
         FROM runs s WHERE s.tenant_id = $1",
    )
    .bind(small.id)
    .bind(big.id)
    .fetch_all(&ctx.env.pool)
    .await?;
    ctx.settle().await;
    Ok(Waits {
        ms: sorted(waits.iter().map(|(w, _)| *w).collect()),
        runs_ahead: sorted(waits.iter().map(|(_, n)| *n as f64).collect()),
    })
}

pub async fn fairness(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let (n, backlog, small_runs) = if ctx.args.smoke {
        (20, 100, 5)
    } else {
        (10_000, 3000, 50)
    };
    let workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", &SLOTS_PER_WORKER.to_string()),
            ("database.max_connections", "20"),
        ],
    );
    let slots = SLOTS_PER_WORKER * workers.len();
    // The same deployment with the fair share off: runs are published as they are created.
    let (plain_api, plain) = ctx
        .env
        .spawn_api_process(&[
            ("RUST_LOG", "error"),
            ("AGENTFLEET__FAIR_SHARE__WINDOW_PER_SLOT", "0"),
        ])
        .await;
    let shared = ctx.base.clone();
    let run = json!({"input": script(json!([{"content": "done"}])), "agent": {"model": "mock"}});
    // Warm-up: the workers connect and register their slots, and the first plans are made,
    // outside the measurement.
    drain_rate(ctx, &shared, "warm-up", &run, n.min(200)).await?;
    drain_rate(ctx, &plain, "warm-up", &run, n.min(200)).await?;

    // Three pairs, the order flipped in the middle one so a machine that slows down (or speeds
    // up) during the section favours neither side; each pair gives a ratio, and the median
    // ratio is the figure (on a shared machine the best of each side came from different
    // minutes of it).
    let (mut offs, mut ons, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let (off, on) = if round == 1 {
            let on = drain_rate(ctx, &shared, &format!("on {round}"), &run, n).await?;
            (
                drain_rate(ctx, &plain, &format!("off {round}"), &run, n).await?,
                on,
            )
        } else {
            let off = drain_rate(ctx, &plain, &format!("off {round}"), &run, n).await?;
            (
                off,
                drain_rate(ctx, &shared, &format!("on {round}"), &run, n).await?,
            )
        };
        println!("fairness: round {round}: {off:.0} runs/s off, {on:.0} on");
        offs.push(off);
        ons.push(on);
        ratios.push(on / off);
    }
    report.add(
        "fairness",
        &format!("runs/s of a {n}-run backlog, fair share off (median of 3)"),
        percentile(&sorted(offs), 0.5),
        "/s",
        None,
    );
    report.add(
        "fairness",
        &format!("runs/s of a {n}-run backlog, fair share ({slots} slots; median of 3)"),
        percentile(&sorted(ons), 0.5),
        "/s",
        None,
    );
    let share = percentile(&sorted(ratios), 0.5) * 100.0;
    report.add(
        "fairness",
        "a tenant alone with the fair share, of its throughput without",
        share,
        "%",
        Some(("goal >= 90 %", share >= 90.0)),
    );

    let near = small_tenant_waits(ctx, &shared, &run, backlog, small_runs).await?;
    let far = small_tenant_waits(ctx, &shared, &run, 10 * backlog, small_runs).await?;
    let unshared = small_tenant_waits(ctx, &plain, &run, backlog, small_runs).await?;
    for (label, waits) in [
        (format!("behind {backlog} runs"), &near),
        (format!("behind {} runs", 10 * backlog), &far),
        (format!("behind {backlog} runs, fair share off"), &unshared),
    ] {
        for (p, name) in [(0.5, "p50"), (0.99, "p99")] {
            report.add(
                "fairness",
                &format!("small tenant start {name}, {label}"),
                percentile(&waits.ms, p),
                "ms",
                None,
            );
            report.add(
                "fairness",
                &format!("big tenant's runs started ahead of a small one, {name}, {label}"),
                percentile(&waits.runs_ahead, p),
                "runs",
                None,
            );
        }
    }
    // "The same wait behind 10 times the backlog", counted in the runs that started ahead (the
    // fleet's window, whatever the backlog), at most 2 × the slots; in milliseconds it also
    // moves with the drain's rate, which a larger `runs` table lowers.
    let ahead = percentile(&far.runs_ahead, 0.99);
    report.add(
        "fairness",
        &format!(
            "big tenant's runs started ahead of a small one, p99, behind {} runs",
            10 * backlog
        ),
        ahead,
        "runs",
        Some((
            &format!("goal <= 2 × slots ({})", 2 * slots),
            ahead <= (2 * slots) as f64,
        )),
    );
    let ratio = percentile(&far.runs_ahead, 0.5) / percentile(&near.runs_ahead, 0.5).max(1.0);
    report.add(
        "fairness",
        "runs started ahead of a small one, p50, behind 10× the backlog / behind 1×",
        ratio,
        "×",
        Some(("goal <= 1.25×", ratio <= 1.25)),
    );
    drop(plain_api);
    drop(workers);
    Ok(())
}
