//! The `recovery` section (`--only recovery`).

use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::json;

use agentfleet_tests::harness::wait_for;
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, sorted};

/// From `kill -9` of a worker to its runs' next event (`run_recovered`) on another worker.
pub async fn recovery(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let lease = if ctx.args.smoke { "2000" } else { "10000" };
    let renew = if ctx.args.smoke { "500" } else { "3000" };
    let extra = [
        ("worker.lease_ms", lease),
        ("worker.lease_renew_ms", renew),
        ("worker.sweep_interval_ms", "500"),
        ("database.idle_in_transaction_timeout_ms", "1000"),
    ];
    let mut a = ctx.env.spawn_worker_process(&extra);
    let input = script(json!([{"content": "slow", "delay_ms": 60000}]));
    let body = json!({"input": input, "agent": {"model": "mock"}});
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            ctx.post("/v1/runs", &body).await?["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    wait_for("runs to be running", Duration::from_secs(60), || async {
        (ctx.count("running").await >= 5).then_some(())
    })
    .await;
    let mut watchers = Vec::new();
    for id in &ids {
        let resp = ctx
            .http
            .get(format!("{}/v1/runs/{id}/events", ctx.base))
            .bearer_auth(&ctx.key)
            .send()
            .await?;
        watchers.push(resp.bytes_stream().eventsource());
    }
    a.kill();
    let killed = Instant::now();
    let _b = ctx.env.spawn_worker_process(&extra);
    let mut times = Vec::new();
    for mut w in watchers {
        while let Some(Ok(ev)) = w.next().await {
            if ev.event == "run_recovered" {
                times.push(killed.elapsed().as_secs_f64());
                break;
            }
        }
    }
    let times = sorted(times);
    let worst = times.last().copied().unwrap_or(f64::NAN);
    report.add(
        "recovery",
        &format!("kill -9 to run_recovered, worst of 5 (lease {lease} ms)"),
        worst,
        "s",
        (!ctx.args.smoke).then_some(("goal <= 15 s", worst <= 15.0)),
    );
    Ok(())
}
