//! The `e2e` section (`--only e2e`).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use agentfleet_tests::harness::ChildProcess;
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted, words};
use crate::cpu::{CpuSampler, Group};
use crate::profile::Window;

/// No-op runs (one http tool call, then a final answer) from POST to run_completed, and
/// what they cost: CPU per run for the machine and per process group, and the servers'
/// operations per run, over exactly the batch (first POST to last completion). With
/// `--repeat N`, N rounds (fresh workers each) and the median of each figure.
pub async fn end_to_end(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    if ctx.args.repeat <= 1 {
        return round(ctx, report, limits).await;
    }
    let mut rounds = Vec::new();
    for r in 1..=ctx.args.repeat {
        if r > 1 {
            ctx.settle().await;
        }
        let mut one = Report::default();
        round(ctx, &mut one, limits).await?;
        let figure = |metric: &str| one.value("e2e", metric).unwrap_or(f64::NAN);
        println!(
            "e2e round {r}: {:.1} runs/s · {:.2} ms machine CPU per run (postgres {:.2}) · framework p50 {:.2} ms",
            figure("no-op runs/s (POST to run_completed)"),
            figure("machine CPU per run"),
            figure("postgres CPU per run"),
            figure("framework time per iteration under load p50"),
        );
        rounds.push(one);
    }
    report.add_medians(&rounds);
    Ok(())
}

/// One round of the section: its figures count only its own runs and iterations.
async fn round(ctx: &Ctx, report: &mut Report, limits: &HashMap<&str, f64>) -> anyhow::Result<()> {
    let since = chrono::Utc::now();
    let (iterations_before,): (i64,) = sqlx::query_as("SELECT count(*) FROM iterations")
        .fetch_one(&ctx.env.pool)
        .await?;
    let n = ctx
        .args
        .runs
        .unwrap_or(if ctx.args.smoke { 20 } else { 3000 });
    let slots = ctx.args.slots().to_string();
    let workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", slots.as_str()),
            ("database.max_connections", "20"),
        ],
    );
    let input = script(turns(ctx.args.tool_turns, ctx.args.tool_result_bytes));
    let body = json!({"input": input, "agent": ctx.agent()});
    // Let the workers connect before the clock starts.
    tokio::time::sleep(Duration::from_millis(if ctx.args.smoke {
        300
    } else {
        1500
    }))
    .await;
    let limit = Duration::from_secs(if ctx.args.smoke { 60 } else { 600 });
    let done_before = ctx.count("completed").await;
    let postmaster = crate::cpu::postmaster(&ctx.env.pool).await;
    let sampler = CpuSampler::new(groups(ctx, &workers, postmaster));
    let window = Window::open(ctx, sampler).await?;
    let batch = ctx
        .submit_and_wait(
            n,
            &body,
            ctx.args.submit_batch,
            ctx.args.rate,
            limit,
            done_before,
        )
        .await?;
    let profile = window.close(ctx, n, batch.polls).await?;
    let rate = n as f64 / batch.secs;
    // Paced, the completion rate cannot pass the offered one: its goal says nothing then.
    let goal = ctx
        .args
        .rate
        .is_none()
        .then_some(("goal >= 700/s", rate >= 700.0));
    report.add(
        "e2e",
        "no-op runs/s (POST to run_completed)",
        rate,
        "/s",
        goal,
    );
    if let Some(pg) = limits.get("pg") {
        report.add(
            "e2e",
            "runs/s / postgres commits/s",
            rate / pg,
            "ratio",
            None,
        );
    }
    if let Some(offered) = ctx.args.rate {
        report.add("e2e", "offered runs/s (--rate)", offered, "/s", None);
        // Over a few ms, the offer was not kept: the requests in flight reached their bound.
        report.add(
            "e2e",
            "latest submission behind its moment (--rate)",
            batch.late.as_secs_f64() * 1000.0,
            "ms",
            None,
        );
    }
    report.add(
        "e2e",
        "runs per submission request (--submit-batch)",
        ctx.args.submit_batch as f64,
        "runs",
        None,
    );
    profile.report("e2e", report);
    let lat: Vec<(f64,)> = sqlx::query_as(
        "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 FROM runs
          WHERE status = 'completed' AND created_at >= $1",
    )
    .bind(since)
    .fetch_all(&ctx.env.pool)
    .await?;
    let lat = sorted(lat.into_iter().map(|(v,)| v).collect());
    report.add(
        "e2e",
        "run latency p50 (created to finished)",
        percentile(&lat, 0.5),
        "ms",
        None,
    );
    report.add("e2e", "run latency p99", percentile(&lat, 0.99), "ms", None);
    // An iteration per tool turn, then the answer.
    crate::common::wait_for_timings(
        &ctx.env.pool,
        None,
        iterations_before + (ctx.args.tool_turns as i64 + 1) * n as i64,
        Duration::from_secs(10),
    )
    .await;
    // Framework time per iteration under this load: mostly queueing for the two cores and
    // the connection pools (the intrinsic figure is the `framework` section's).
    // This round's iterations only (not an earlier section's or round's).
    let fw: Vec<(i64,)> = sqlx::query_as(
        "SELECT total_us - model_us - tools_us FROM iterations WHERE started_at >= $1",
    )
    .bind(since)
    .fetch_all(&ctx.env.pool)
    .await?;
    let fw = sorted(fw.into_iter().map(|(v,)| v as f64 / 1000.0).collect());
    let fw_p50 = percentile(&fw, 0.5);
    report.add(
        "e2e",
        "framework time per iteration under load p50",
        fw_p50,
        "ms",
        Some(("goal <= 5 ms", fw_p50 <= 5.0)),
    );
    report.add(
        "e2e",
        "framework time per iteration under load p99",
        percentile(&fw, 0.99),
        "ms",
        None,
    );
    // The two kinds of iteration apart: one with a tool call (a turn commit, the message's
    // append, the outcome's commit) and the final one (a turn commit that ends the run).
    let split: Vec<(bool, i64)> = sqlx::query_as(
        "SELECT tools_us > 0, total_us - model_us - tools_us FROM iterations WHERE started_at >= $1",
    )
    .bind(since)
    .fetch_all(&ctx.env.pool)
    .await?;
    for (tools, label) in [(true, "with tool calls"), (false, "without")] {
        let part = sorted(
            split
                .iter()
                .filter(|(t, _)| *t == tools)
                .map(|(_, v)| *v as f64 / 1000.0)
                .collect(),
        );
        report.add(
            "e2e",
            &format!("framework time per iteration {label} under load p50"),
            percentile(&part, 0.5),
            "ms",
            None,
        );
    }
    let model: Vec<(i64, i64)> =
        sqlx::query_as("SELECT model_us, tools_us FROM iterations WHERE started_at >= $1")
            .bind(since)
            .fetch_all(&ctx.env.pool)
            .await?;
    let m = sorted(model.iter().map(|(m, _)| *m as f64 / 1000.0).collect());
    report.add(
        "e2e",
        "model call (scripted, zero delay) under load p50",
        percentile(&m, 0.5),
        "ms",
        None,
    );
    let t = sorted(
        model
            .iter()
            .filter(|(_, t)| *t > 0)
            .map(|(_, t)| *t as f64 / 1000.0)
            .collect(),
    );
    report.add(
        "e2e",
        "tool call (scripted) under load p50",
        percentile(&t, 0.5),
        "ms",
        None,
    );
    Ok(())
}

/// The scripted model's turns: `tool_turns` calls of `echo`, one a turn, then "done". Each
/// call's arguments carry `result_bytes` of text (words, so that Postgres's compression and
/// the tokenizer see text rather than one repeated byte), which the tool returns.
fn turns(tool_turns: usize, result_bytes: usize) -> serde_json::Value {
    let arguments = if result_bytes == 0 {
        json!({"x": 1})
    } else {
        json!({"text": words(result_bytes)})
    };
    let mut call = json!({"tool_calls": [{"name": "echo", "arguments": arguments}]});
    if tool_turns > 1 {
        call["repeat"] = json!(tool_turns);
    }
    json!([call, {"content": "done"}])
}

/// Every process a run passes through; the client group is the benchmark process, which also
/// serves the scripted model and the tool.
fn groups(ctx: &Ctx, workers: &[ChildProcess], postmaster: Option<u32>) -> Vec<Group> {
    vec![
        Group::postgres(postmaster),
        Group::pids("api", vec![ctx.api.pid()]),
        Group::pids("workers", workers.iter().map(ChildProcess::pid).collect()),
        Group::redis(),
        Group::rabbitmq(),
        Group::this("client"),
    ]
}
