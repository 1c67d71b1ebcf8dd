//! The `framework` section (`--only framework`).

use std::time::Duration;

use serde_json::json;

use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// The framework's own time per iteration (the iteration's wall time minus the model call and
/// the tool calls, as the worker records it), one run at a time so that nothing queues.
pub async fn framework_time(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 10 } else { 200 };
    let _worker = ctx.workers(1, &[]);
    let input = script(
        json!([{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}, {"content": "done"}]),
    );
    let body = json!({"input": input, "agent": ctx.agent()});
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let id = ctx.post("/v1/runs", &body).await?["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ctx.wait_completed(&id, Duration::from_secs(60)).await;
        ids.push(id);
    }
    // Two iterations per run: a tool call, then the answer.
    let expected = 2 * ids.len() as i64;
    crate::common::wait_for_timings(&ctx.env.pool, Some(&ids), expected, Duration::from_secs(10))
        .await;
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT total_us - model_us - tools_us, model_us, tools_us FROM iterations
         WHERE run_id = ANY($1::uuid[])",
    )
    .bind(&ids)
    .fetch_all(&ctx.env.pool)
    .await?;
    let fw = sorted(rows.iter().map(|r| r.0 as f64 / 1000.0).collect());
    let (p50, p99) = (percentile(&fw, 0.5), percentile(&fw, 0.99));
    report.add(
        "framework",
        &format!("framework time per iteration p50 ({} iterations)", fw.len()),
        p50,
        "ms",
        Some(("goal <= 1 ms", p50 <= 1.0)),
    );
    report.add(
        "framework",
        "framework time per iteration p99",
        p99,
        "ms",
        Some(("goal <= 5 ms", p99 <= 5.0)),
    );
    // A tool iteration commits twice (the turn, the outcome), a final one once: each commit
    // waits for a WAL flush, so the p50 above falls between the two kinds.
    for (tools, label) in [(true, "with tool calls"), (false, "without")] {
        let part = sorted(
            rows.iter()
                .filter(|r| (r.2 > 0) == tools)
                .map(|r| r.0 as f64 / 1000.0)
                .collect(),
        );
        report.add(
            "framework",
            &format!("framework time per iteration {label} p50"),
            percentile(&part, 0.5),
            "ms",
            None,
        );
    }
    let model = sorted(rows.iter().map(|r| r.1 as f64 / 1000.0).collect());
    report.add(
        "framework",
        "model call (scripted, zero delay) p50",
        percentile(&model, 0.5),
        "ms",
        None,
    );
    let tools = sorted(
        rows.iter()
            .filter(|r| r.2 > 0)
            .map(|r| r.2 as f64 / 1000.0)
            .collect(),
    );
    report.add(
        "framework",
        "tool call (local http) p50",
        percentile(&tools, 0.5),
        "ms",
        None,
    );
    Ok(())
}
