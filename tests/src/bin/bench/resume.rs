//! The `resume` section (`--only resume`).

use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::json;

use agentfleet_tests::harness::wait_for;
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// `POST /resume` to the `run_resumed` event on an open SSE stream.
pub async fn resume_latency(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 5 } else { 300 };
    let _workers = ctx.workers(ctx.args.workers(), &[("worker.concurrency", "64")]);
    let input = script(
        json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "?"}}]}, {"content": "ok"}]),
    );
    let body = json!({"input": input, "agent": {"model": "mock"}});
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            ctx.post("/v1/runs", &body).await?["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    wait_for(
        "runs to wait for input",
        Duration::from_secs(120),
        || async { (ctx.count("waiting_for_input").await >= n as i64).then_some(()) },
    )
    .await;
    let mut lat = Vec::new();
    for id in &ids {
        // Reconnect after the pausing event (its id is recorded in Postgres), as a client that
        // saw `input_required` would, so the stream stays open for what follows.
        let (paused_at,): (i64,) =
            sqlx::query_as("SELECT last_event_id FROM runs WHERE id = $1::uuid")
                .bind(id)
                .fetch_one(&ctx.env.pool)
                .await?;
        let resp = ctx
            .http
            .get(format!("{}/v1/runs/{id}/events", ctx.base))
            .bearer_auth(&ctx.key)
            .header("Last-Event-ID", paused_at.to_string())
            .send()
            .await?;
        let mut stream = resp.bytes_stream().eventsource();
        let start = Instant::now();
        ctx.post(&format!("/v1/runs/{id}/resume"), &json!({"input": "yes"}))
            .await?;
        while let Some(Ok(ev)) = stream.next().await {
            if ev.event == "run_resumed" {
                lat.push(start.elapsed().as_secs_f64() * 1000.0);
                break;
            }
        }
    }
    let lat = sorted(lat);
    let p99 = percentile(&lat, 0.99);
    report.add(
        "resume",
        "resume to run_resumed p50",
        percentile(&lat, 0.5),
        "ms",
        None,
    );
    report.add(
        "resume",
        "resume to run_resumed p99",
        p99,
        "ms",
        Some(("goal <= 50 ms", p99 <= 50.0)),
    );
    Ok(())
}
