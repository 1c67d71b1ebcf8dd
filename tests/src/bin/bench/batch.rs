//! The `batch` section (`--only batch`).

use std::time::Instant;

use serde_json::{Value, json};

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// Durable `POST /v1/runs/batch` throughput, no workers: one batch alone first (it also warms
/// the API's connections), then four at once; the throughput is the four concurrent
/// batches' runs over the time from the first request to the last answer.
pub async fn batch(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let (size, concurrent) = if ctx.args.smoke { (20, 2) } else { (1000, 4) };
    let one = json!({"input": "hello", "agent": {"model": "mock"}});
    let body = json!({"runs": vec![one; size]});
    let alone = submit(ctx, &body, size).await?;
    let t = Instant::now();
    let answers =
        futures_util::future::join_all((0..concurrent).map(|_| submit(ctx, &body, size))).await;
    let elapsed = t.elapsed().as_secs_f64();
    let mut lat = vec![alone];
    for answer in answers {
        lat.push(answer?);
    }
    let rate = (concurrent * size) as f64 / elapsed;
    report.add(
        "batch",
        &format!("batch submit runs/s ({concurrent} x {size} at once)"),
        rate,
        "/s",
        Some(("goal >= 5000/s", rate >= 5000.0)),
    );
    report.add(
        "batch",
        &format!("batch request latency alone ({size} runs)"),
        alone,
        "ms",
        None,
    );
    let lat = sorted(lat);
    report.add(
        "batch",
        &format!("batch request latency p50 ({} requests)", lat.len()),
        percentile(&lat, 0.5),
        "ms",
        None,
    );
    let (queued,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE status = 'queued'")
        .fetch_one(&ctx.env.pool)
        .await?;
    anyhow::ensure!(
        queued >= ((concurrent + 1) * size) as i64,
        "{queued} runs queued after {} batches of {size}",
        concurrent + 1
    );
    Ok(())
}

/// One batch; its latency in ms. Every run must be accepted.
async fn submit(ctx: &Ctx, body: &Value, size: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let answer = ctx.post("/v1/runs/batch", body).await?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    let accepted = answer["runs"].as_array().map_or(0, Vec::len);
    anyhow::ensure!(accepted == size, "{accepted} of {size} runs accepted");
    Ok(ms)
}
