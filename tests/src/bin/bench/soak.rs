//! The storage section's soak (`--soak-secs`): does retention hold the database's size level
//! under a steady load, and what does it cost the fleet's throughput?
//!
//! 1. **Capacity before**: a probe of no-op runs submitted as fast as 32 requests in flight are
//!    answered (the e2e section's way), with retention at the configured 30 days (nothing due):
//!    runs from the first POST to the last completion, per second.
//! 2. **Soak**: the bench tenant's finished runs are kept 60 s (`finished_runs_secs`, the
//!    workers pass every second), and no-op runs are offered at half the capacity measured, at
//!    a steady pace, for `--soak-secs`. Every 10 s the database's size is sampled
//!    (`pg_database_size`, the tables' heap, TOAST and indexes, `runs` alone).
//! 3. **Capacity during**: at the soak's end, on the database as the soak left it and with
//!    removal still at 60 s (the soak's last minute of runs comes due while it runs), the same
//!    probe again. The "no-op e2e throughput during the soak" is this probe against
//!    the first; the soak's own completion rate is reported too (it can only match the offer).
//!
//! "Levels off" is judged on `pg_database_size` over the soak's paced part, split in thirds by
//! time: the growth over the last third must be at most 10 % of the growth over the first
//! (the first third holds the fill-up to a minute of runs; if it did not grow, neither may the
//! last).
//!
//! Removal deletes rows; a vacuum makes their space reusable. When the server runs with
//! autovacuum off (the project's CI server does), the soak vacuums the tables every sample, as
//! autovacuum would: without that the database grows whatever removal does.
//!
//! Completions are counted by `finished_at` rather than by rows left, because removal deletes
//! completed runs: [`Completions`] advances a cursor one second behind the database's clock (a
//! run's `finished_at` is its transaction's start, committed a little later), and a run is
//! removed only a minute after it ended, long after the cursor passed it.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::domain::RetentionOverrides;
use agentfleet_shared::store::tenants;

use crate::Report;
use crate::common::Ctx;
use crate::storage::pg_bytes;

/// The share of the capacity offered during the soak.
const OFFERED_SHARE: f64 = 0.5;
/// The most the last third may grow, as a share of the first third's growth.
const LEVEL_SHARE: f64 = 0.1;
/// The most the throughput during the soak may lose against before it.
const THROUGHPUT_LOSS: f64 = 0.1;

/// Runs completed so far, counted by their end.
struct Completions {
    tenant: Uuid,
    /// Every completed run that ended at or before it is in `counted`.
    cursor: DateTime<Utc>,
    counted: i64,
}

impl Completions {
    async fn start(pool: &sqlx::PgPool, tenant: Uuid) -> anyhow::Result<Completions> {
        let cursor: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
        Ok(Completions {
            tenant,
            cursor,
            counted: 0,
        })
    }

    /// Runs completed since the start, including the last second's (not yet behind the cursor).
    async fn poll(&mut self, pool: &sqlx::PgPool) -> anyhow::Result<i64> {
        let (settled, all, cursor): (i64, i64, DateTime<Utc>) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE finished_at <= now() - interval '1 second'),
                    count(*), now() - interval '1 second'
             FROM runs WHERE tenant_id = $1 AND finished_at > $2 AND status = 'completed'",
        )
        .bind(self.tenant)
        .bind(self.cursor)
        .fetch_one(pool)
        .await?;
        let seen = self.counted + all;
        if cursor > self.cursor {
            self.counted += settled;
            self.cursor = cursor;
        }
        Ok(seen)
    }

    /// Polls until `n` runs completed, within `limit`.
    async fn wait(&mut self, pool: &sqlx::PgPool, n: i64, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let seen = self.poll(pool).await?;
            if seen >= n {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{seen} of {n} runs completed after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One sample of the database's size.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Seconds since the soak began.
    at: f64,
    database: i64,
    heap: i64,
    toast: i64,
    indexes: i64,
    runs_table: i64,
    runs_live: i64,
    runs_dead: i64,
    completed: i64,
}

async fn sample(
    ctx: &Ctx,
    started: Instant,
    completions: &mut Completions,
) -> anyhow::Result<Sample> {
    let pool = &ctx.env.pool;
    let completed = completions.poll(pool).await?;
    let b = pg_bytes(pool).await?;
    let (database, runs_table, runs_live, runs_dead): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT pg_database_size(current_database()),
                pg_total_relation_size('runs'),
                (SELECT count(*) FROM runs),
                coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'runs'), 0)",
    )
    .fetch_one(pool)
    .await?;
    let s = Sample {
        at: started.elapsed().as_secs_f64(),
        database,
        heap: b.heap,
        toast: b.toast,
        indexes: b.indexes,
        runs_table,
        runs_live,
        runs_dead,
        completed,
    };
    println!(
        "soak {:>5.0} s: database {:.1} MB (heap {:.1}, TOAST {:.1}, indexes {:.1}; runs {:.1} MB, \
         {} rows, {} dead) · {} runs completed",
        s.at,
        mb(s.database),
        mb(s.heap),
        mb(s.toast),
        mb(s.indexes),
        mb(s.runs_table),
        s.runs_live,
        s.runs_dead,
        s.completed
    );
    Ok(s)
}

fn mb(bytes: i64) -> f64 {
    bytes as f64 / 1e6
}

/// What autovacuum would do for the tables removal deletes from (and those the runs update, and
/// the active-run deltas the sweeper folds).
async fn vacuum_now(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query(
        "VACUUM (ANALYZE) runs, threads, messages, tool_calls, iterations, usage_shards, \
         webhook_deliveries, retention_state, tenant_active_deltas",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The sample nearest `at` seconds.
fn nearest(samples: &[Sample], at: f64) -> Sample {
    *samples
        .iter()
        .min_by(|a, b| (a.at - at).abs().total_cmp(&(b.at - at).abs()))
        .expect("at least one sample")
}

/// `n` no-op runs as fast as 32 requests in flight are answered: runs per second from the
/// first POST to the last completion.
async fn probe(
    ctx: &Ctx,
    tenant: Uuid,
    n: usize,
    body: &Value,
    limit: Duration,
) -> anyhow::Result<f64> {
    let mut completions = Completions::start(&ctx.env.pool, tenant).await?;
    let t = Instant::now();
    ctx.submit(n, body, 1, None).await?;
    completions.wait(&ctx.env.pool, n as i64, limit).await?;
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

pub async fn soak(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let smoke = ctx.args.smoke;
    let secs = ctx.args.soak_secs.unwrap_or(if smoke { 6 } else { 600 });
    if secs == 0 {
        return Ok(());
    }
    // A smoke run keeps every proportion but lasts seconds.
    let (window, every, interval_ms) = if smoke {
        (2, 1, "200")
    } else {
        (60, 10, "1000")
    };
    let pool = &ctx.env.pool;
    let tenant: Uuid = sqlx::query_scalar("SELECT id FROM tenants WHERE name = 'bench'")
        .fetch_one(pool)
        .await?;
    let slots = ctx.args.slots().to_string();
    let _workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", slots.as_str()),
            // Fewer than the e2e section's 20: the soak runs for minutes on a server that other
            // work shares (`max_connections` 100), and its own pool must get a connection.
            ("database.max_connections", "10"),
            ("retention.interval_ms", interval_ms),
        ],
    );
    tokio::time::sleep(Duration::from_millis(if smoke { 300 } else { 1500 })).await;
    let body = json!({
        "input": agentfleet_tests::mock_llm::script(
            json!([{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}, {"content": "done"}])),
        "agent": ctx.agent(),
    });
    let n = ctx.args.runs.unwrap_or(if smoke { 20 } else { 3000 });
    let limit = Duration::from_secs(if smoke { 60 } else { 600 });

    // A tenth first, unmeasured: the workers' connections and caches warm up before the
    // figure that the soak's end is compared with, not during it.
    probe(ctx, tenant, (n / 10).max(1), &body, limit).await?;
    let before = probe(ctx, tenant, n, &body, limit).await?;
    println!("soak: capacity before, {n} no-op runs: {before:.1} runs/s");

    // Removal frees rows; only a vacuum makes their space reusable. A server with autovacuum
    // off (CI's, for speed) would grow whatever removal does: the soak vacuums then, every
    // sample, as autovacuum would (PostgreSQL's default is on).
    let vacuum = sqlx::query_scalar::<_, String>("SHOW autovacuum")
        .fetch_one(pool)
        .await?
        == "off";
    if vacuum {
        println!("soak: the server's autovacuum is off; the soak vacuums every {every} s");
    }
    let set = RetentionOverrides {
        finished_runs_secs: Some(window),
        ..Default::default()
    };
    tenants::update_retention(pool, tenant, &set, &[]).await?;
    // The earlier sections' workers scheduled the next pass `retention.interval_ms` (60 s) out
    // in the fleet's shared schedule: the soak's workers start now.
    sqlx::query("UPDATE retention_state SET next_batch_at = now()")
        .execute(pool)
        .await?;
    let rate = (before * OFFERED_SHARE).max(1.0);
    let total = (rate * secs as f64).round().max(1.0) as usize;
    println!("soak: {total} runs at {rate:.1}/s for {secs} s, finished runs kept {window} s");
    let mut completions = Completions::start(pool, tenant).await?;
    let started = Instant::now();
    let mut samples = vec![sample(ctx, started, &mut completions).await?];
    // Sampled beside the submissions, not between them: a paced stream must not wait for a
    // sample (or a vacuum).
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let submitting = async {
        let late = ctx.submit(total, &body, 1, Some(rate)).await;
        let _ = done_tx.send(true);
        late
    };
    let sampling = async {
        let mut ticker = tokio::time::interval(Duration::from_secs(every));
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = done_rx.changed() => return anyhow::Ok(()),
                _ = ticker.tick() => {
                    samples.push(sample(ctx, started, &mut completions).await?);
                    if vacuum {
                        vacuum_now(pool).await?;
                    }
                }
            }
        }
    };
    let (late, sampled) = tokio::join!(submitting, sampling);
    let late = late?;
    sampled?;
    let deadline = Instant::now() + limit;
    while completions.poll(pool).await? < total as i64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the soak's runs did not complete within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let soak_secs = started.elapsed().as_secs_f64();
    samples.push(sample(ctx, started, &mut completions).await?);

    let during = probe(ctx, tenant, n, &body, limit).await?;
    println!("soak: capacity at the soak's end, {n} no-op runs: {during:.1} runs/s");
    samples.push(sample(ctx, started, &mut completions).await?);
    tenants::update_retention(
        pool,
        tenant,
        &RetentionOverrides::default(),
        &["finished_runs_secs".to_owned()],
    )
    .await?;

    let span = secs as f64;
    let paced: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.at <= span + 1.0)
        .collect();
    let growth = |from: f64, to: f64| {
        let (a, b) = (nearest(&paced, from), nearest(&paced, to));
        (b.database - a.database, b.completed - a.completed)
    };
    let (first, _) = growth(0.0, span / 3.0);
    let (last, last_runs) = growth(span * 2.0 / 3.0, span);
    // A first third that did not grow (removal caught up at once) asks the last not to either.
    let level = (last as f64) <= LEVEL_SHARE * first.max(0) as f64;
    let peak = samples.iter().map(|s| s.database).max().unwrap_or(0);
    let ratio = during / before;
    let s = "storage";
    report.add(
        s,
        "soak: offered runs/s (half the capacity)",
        rate,
        "/s",
        None,
    );
    report.add(
        s,
        "soak: completed runs/s",
        total as f64 / soak_secs,
        "/s (first POST to last completion)",
        None,
    );
    report.add(
        s,
        "soak: latest submission behind its moment",
        late.as_secs_f64() * 1000.0,
        "ms",
        None,
    );
    report.add(
        s,
        "soak: database size at start",
        mb(samples[0].database),
        "MB",
        None,
    );
    report.add(s, "soak: database size, peak", mb(peak), "MB", None);
    report.add(
        s,
        "soak: database growth, first third",
        mb(first),
        "MB",
        None,
    );
    report.add(
        s,
        "soak: database growth, last third",
        mb(last),
        &format!(
            "MB ({:.0} B per run completed in it)",
            last as f64 / last_runs.max(1) as f64
        ),
        Some(("goal <= 10 % of the first third's", level)),
    );
    report.add(
        s,
        "soak: no-op runs/s before (retention idle)",
        before,
        "/s",
        None,
    );
    report.add(
        s,
        "soak: no-op runs/s at the soak's end (removal on)",
        during,
        "/s",
        None,
    );
    report.add(
        s,
        "soak: no-op throughput, end against before",
        ratio,
        "ratio",
        Some(("goal >= 0.9", ratio >= 1.0 - THROUGHPUT_LOSS)),
    );
    report.json.insert(
        "storage.soak samples".into(),
        Value::Array(
            samples
                .iter()
                .map(|s| {
                    json!({"at_s": s.at, "database_bytes": s.database, "heap_bytes": s.heap,
                           "toast_bytes": s.toast, "index_bytes": s.indexes,
                           "runs_table_bytes": s.runs_table, "runs_live": s.runs_live,
                           "runs_dead": s.runs_dead, "completed": s.completed})
                })
                .collect(),
        ),
    );
    Ok(())
}
