//! The `faults` section (`--only faults`).

use std::time::Duration;

use serde_json::json;

use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::Ctx;

/// Throughput before and after a fault: a worker killed with `kill -9` in the middle of a
/// batch (and replaced, as Kubernetes would), and, outside smoke mode, RabbitMQ restarted in
/// the middle of one. The fault's own batch pays the recovery; the one after must run at
/// least 90 % as fast as the one before.
pub async fn fault_throughput(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 20 } else { 600 };
    let extra = [
        ("worker.concurrency", "32"),
        ("database.max_connections", "20"),
        ("worker.lease_ms", "3000"),
        ("worker.lease_renew_ms", "1000"),
        ("worker.sweep_interval_ms", "500"),
        ("database.idle_in_transaction_timeout_ms", "1000"),
    ];
    let mut workers = ctx.workers(2, &extra);
    let input = script(
        json!([{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}, {"content": "done"}]),
    );
    let body = json!({"input": input, "agent": ctx.agent()});
    let limit = Duration::from_secs(if ctx.args.smoke { 60 } else { 300 });
    // Warm-up, so the first measured batch does not pay for connections.
    ctx.run_batch(n / 4, &body, limit).await?;
    let faults: &[&str] = if ctx.args.smoke {
        &["kill -9 of a worker"]
    } else {
        &["kill -9 of a worker", "RabbitMQ restart"]
    };
    for &name in faults {
        let before = n as f64 / ctx.run_batch(n, &body, limit).await?;
        let during = {
            let batch = ctx.run_batch(n, &body, limit);
            let strike = async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if name == "RabbitMQ restart" {
                    let sh = |c: &str| {
                        std::process::Command::new("bash")
                            .args(["-c", c])
                            .status()
                            .is_ok_and(|s| s.success())
                    };
                    anyhow::ensure!(
                        sh("rabbitmqctl -q stop_app && rabbitmqctl -q start_app"),
                        "restarting RabbitMQ failed"
                    );
                } else {
                    workers[0].kill();
                    workers[0] = ctx.env.spawn_worker_process(&extra);
                }
                Ok(())
            };
            let (elapsed, struck) = tokio::join!(batch, strike);
            struck?;
            n as f64 / elapsed?
        };
        let after = n as f64 / ctx.run_batch(n, &body, limit).await?;
        let ratio = after / before;
        report.add(
            "faults",
            &format!("{name}: runs/s before"),
            before,
            "/s",
            None,
        );
        report.add(
            "faults",
            &format!("{name}: runs/s of the batch it hit"),
            during,
            "/s",
            None,
        );
        report.add(
            "faults",
            &format!("{name}: runs/s after / before"),
            ratio,
            "ratio",
            Some(("goal >= 0.9", ratio >= 0.9)),
        );
    }
    Ok(())
}
