//! The `load` section (`--only load`): runs offered at a steady rate (open loop) with a
//! realistic script, sized to keep about `--in-flight` runs in flight, every run's SSE client
//! attached from submission to its end; what that costs the machine and how fast a token
//! travels from the model to the client.
//!
//! The scripted model (`mock-llm`) and the tool server (`tool-server`) run as processes of
//! their own, so the CPU split tells the fleet, the harness's clients and the scripted
//! services apart, and the model's connections are those to its port alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentfleet_tests::harness::{ChildProcess, free_address, redis_url, wait_for};
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};
use crate::cpu::{CpuSampler, Group};
use crate::storage::{PgBytes, pg_bytes};

/// The load section's knobs (`bench --only load --help`); unset ones take the issue's
/// defaults, or tiny ones with `--smoke`.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "load section")]
pub struct LoadArgs {
    /// Runs to keep in flight (submitted, not yet ended as seen by their SSE client): the
    /// offered rate is found from it (default 1000; 10 with --smoke).
    #[arg(long)]
    pub in_flight: Option<usize>,
    /// Seconds to sustain it, measured after the ramp (default 120; 3 with --smoke).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Runs per second to offer, instead of finding the rate that keeps --in-flight.
    #[arg(long)]
    pub offered_rate: Option<f64>,
    /// The model's wait before its first byte, per call (default 800; 40 with --smoke).
    #[arg(long)]
    pub first_byte_ms: Option<u64>,
    /// Model calls per run, the last one answering without tools.
    #[arg(long, default_value_t = 3)]
    pub model_turns: usize,
    /// Tokens the model streams per call, one chunk each (default 80; 10 with --smoke).
    #[arg(long)]
    pub tokens_per_turn: Option<usize>,
    /// The model's streaming rate (default 40; 400 with --smoke).
    #[arg(long)]
    pub tokens_per_s: Option<f64>,
    /// Tool calls per run, spread over the calls before the last.
    #[arg(long, default_value_t = 2)]
    pub tool_calls: usize,
    /// How long each tool call takes to answer (default 300; 30 with --smoke).
    #[arg(long)]
    pub tool_ms: Option<u64>,
    /// Share of runs that ask the user a question (the built-in `ask`).
    #[arg(long, default_value_t = 0.10)]
    pub question_share: f64,
    /// Share of runs whose last tool call needs a confirmation (`risk: high`).
    #[arg(long, default_value_t = 0.05)]
    pub confirm_share: f64,
    /// How long the user takes to answer a question or a confirmation, through
    /// `POST /v1/runs/{id}/resume` (default 2000; 100 with --smoke).
    #[arg(long)]
    pub answer_after_ms: Option<u64>,
    /// Share of SSE clients cut once on purpose mid-run, which reconnect with `Last-Event-ID`.
    #[arg(long, default_value_t = 0.10)]
    pub cut_share: f64,
    /// Speak HTTP/1.1 to the scripted model, a connection per model call in flight, instead of
    /// HTTP/2 (`models.<name>.http2`), many calls on one connection.
    #[arg(long)]
    pub model_http1: bool,
}

mod client;
mod measure;
mod plan;

use client::*;
use measure::*;
use plan::*;

/// Runs offered at a steady rate, sized for `--in-flight`, each with its SSE client, and what
/// the machine, the fleet and the servers spend on them.
pub async fn load(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let plan = Plan::of(ctx)?;
    let model_addr = free_address();
    let tools_addr = free_address();
    let model = spawn_helper("mock-llm", &model_addr).await?;
    let tools = spawn_helper("tool-server", &tools_addr).await?;
    let model_port: u16 = model_addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("the model's port")?;
    // The API of this section keeps the production defaults the shared one's test settings
    // change (keep-alives every 15 s, not every second), and lets the one tenant hold a stream
    // per run in flight: the default allows 1000 per tenant and API process.
    let streams = (plan.in_flight * 2).max(1000).to_string();
    let (api, base) = ctx
        .env
        .spawn_api_process(&[
            ("AGENTFLEET__EVENTS__KEEPALIVE_SECS", "15"),
            ("AGENTFLEET__API__MAX_STREAMS_PER_TENANT", streams.as_str()),
            // The API refuses an agent whose tool the workers could not call.
            ("AGENTFLEET__EGRESS__ALLOW", tools_addr.as_str()),
        ])
        .await;
    let slots = plan.slots.to_string();
    let model_url = format!("http://{model_addr}/v1");
    let http2 = if ctx.args.load.model_http1 {
        "false"
    } else {
        "true"
    };
    let workers = ctx.workers(
        plan.workers,
        &[
            ("worker.concurrency", slots.as_str()),
            ("database.max_connections", "20"),
            ("models.mock.base_url", model_url.as_str()),
            ("models.mock.http2", http2),
            ("egress.allow", tools_addr.as_str()),
        ],
    );
    let queue = format!("{}.runs", ctx.env.prefix);
    wait_for(
        "the workers to consume",
        Duration::from_secs(60),
        || async { (ctx.env.queue_stats(&queue).await.1 as usize >= plan.workers).then_some(()) },
    )
    .await;
    let worker_pids: Vec<u32> = workers.iter().map(ChildProcess::pid).collect();
    let tool = |name: &str, risky: bool| {
        let mut t = json!({"name": name, "kind": "http", "url": format!("http://{tools_addr}/slow"),
                           "parameters": {"type": "object"}});
        if risky {
            t["risk"] = json!("high");
        }
        t
    };
    let agent = json!({
        "model": "mock",
        "tools": [tool("slow", false), tool("slow_confirmed", true)],
        "max_iterations": plan.turns + 2,
    });
    let body = |kind: Kind| -> anyhow::Result<Arc<Vec<u8>>> {
        Ok(Arc::new(serde_json::to_vec(
            &json!({"input": script(plan.script(kind)), "agent": agent}),
        )?))
    };
    let bodies = [
        (Kind::Plain, body(Kind::Plain)?),
        (Kind::Question, body(Kind::Question)?),
        (Kind::Confirm, body(Kind::Confirm)?),
    ];

    let postmaster = crate::cpu::postmaster(&ctx.env.pool).await;
    let sampler = CpuSampler::new(vec![
        Group::postgres(postmaster),
        Group::pids("api", vec![api.pid()]),
        Group::pids("workers", worker_pids.clone()),
        Group::redis(),
        Group::rabbitmq(),
        Group::pids("model", vec![model.0.id()]),
        Group::pids("tools", vec![tools.0.id()]),
        Group::this("clients"),
    ]);
    let redis = redis::Client::open(redis_url())?;
    let mut rconn = redis.get_multiplexed_async_connection().await?;
    let rss_idle: u64 = worker_pids.iter().map(|pid| rss_kib(*pid)).sum();
    let redis_before = redis_used_memory(&mut rconn).await?;
    let pg_before = pg_bytes(&ctx.env.pool).await?;

    let shared = Arc::new(Shared {
        http: ctx.http.clone(),
        base: base.clone(),
        key: ctx.key.clone(),
        in_flight: AtomicUsize::new(0),
        counters: Counters::default(),
        latency: Histogram::new(),
        finished: std::sync::Mutex::new(Vec::new()),
        answer_after: plan.answer_after,
        stop: CancellationToken::new(),
        first_error: std::sync::Mutex::new(None),
        rebuilt: std::sync::Mutex::new(Vec::new()),
    });
    let t0 = Instant::now();
    let stop_sampling = CancellationToken::new();
    let sampling = sample(
        shared.clone(),
        ctx.env.pool.clone(),
        worker_pids.clone(),
        model_port,
        t0,
        plan.sample_every,
        stop_sampling.clone(),
    );

    // Little's law: L = λ·W. The first rate comes from the scripted duration. Once the longest
    // run could have ended, the in-flight count, averaged, says what W is at that load and the
    // rate is set from it; a second correction, one run's length later, catches the change of W
    // with the new rate (unless --offered-rate fixes the rate). At 1,000 in flight the first
    // lowered the rate by 6–11 % in trials, the second by about 2 %.
    let mean_secs = plan.mean_scripted_secs();
    let longest = plan.longest_scripted_secs();
    let n = plan.in_flight as f64;
    let mut rate = plan.offered_rate.unwrap_or(n / mean_secs);
    let mut rates = vec![rate];
    let mut corrections: std::collections::VecDeque<(f64, f64)> = if plan.offered_rate.is_none() {
        [(1.1, 1.6), (2.6, 3.1)]
            .into_iter()
            .map(|(from, to)| (from * longest, to * longest))
            .collect()
    } else {
        Default::default()
    };
    let mut measured: (f64, u64) = (0.0, 0);
    let sustain_from = if corrections.is_empty() {
        1.5 * longest
    } else {
        3.6 * longest
    };
    let sustain_to = sustain_from + plan.duration.as_secs_f64();
    let cap = plan.in_flight * 3 + 100;
    let mut window: Option<WindowStart> = None;
    let mut late = Duration::ZERO;
    let mut due = 0.0f64;
    let mut index = 0u64;
    loop {
        let now = t0.elapsed().as_secs_f64();
        if window.is_none() && now >= sustain_from {
            let used = redis_used_memory(&mut rconn).await.unwrap_or(0);
            let commands = crate::ops::redis_commandstats().await.ok();
            window = Some((sampler.snapshot()?, Tally::now(&shared), used, commands));
        }
        if now >= sustain_to {
            break;
        }
        if let Some(&(from, to)) = corrections.front() {
            let in_flight = shared.in_flight.load(Ordering::Relaxed) as f64;
            if now >= from && now < to {
                measured = (measured.0 + in_flight, measured.1 + 1);
            } else if now >= to {
                corrections.pop_front();
                if measured.1 > 0 {
                    let held = measured.0 / measured.1 as f64;
                    rate = (rate * n / held.max(1.0)).clamp(rate / 4.0, rate * 4.0);
                    rates.push(rate);
                }
                measured = (0.0, 0);
            }
        }
        let at = t0 + Duration::from_secs_f64(due);
        tokio::time::sleep_until(at.into()).await;
        while shared.in_flight.load(Ordering::Relaxed) >= cap {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        late = late.max(Instant::now().saturating_duration_since(at));
        let u = unit(index, 1);
        let kind = if u < plan.question_share {
            Kind::Question
        } else if u < plan.question_share + plan.confirm_share {
            Kind::Confirm
        } else {
            Kind::Plain
        };
        let cut = (unit(index, 2) < plan.cut_share)
            .then(|| Duration::from_secs_f64(mean_secs * (0.1 + 0.8 * unit(index, 3))));
        let body = bodies
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, b)| b.clone())
            .expect("a body per kind");
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        add(&shared.counters.submitted);
        tokio::spawn(one_run(shared.clone(), body, cut));
        index += 1;
        due += 1.0 / rate;
    }
    let end_cpu = sampler.snapshot()?;
    let end = Tally::now(&shared);
    let redis_at_end = redis_used_memory(&mut rconn).await.unwrap_or(0);
    let commands_at_end = crate::ops::redis_commandstats().await.ok();
    let in_flight_at_end = shared.in_flight.load(Ordering::Relaxed);
    // What the keys of runs in flight hold right now (a sample).
    let active: Vec<(String,)> = sqlx::query_as(
        "SELECT id::text FROM runs
          WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')
          ORDER BY random() LIMIT 200",
    )
    .fetch_all(&ctx.env.pool)
    .await?;
    let mut active_usage = (0i64, 0usize);
    for (id,) in &active {
        let (_, usage) = run_keys(&mut rconn, &ctx.env.prefix, id).await?;
        active_usage = (active_usage.0 + usage, active_usage.1 + 1);
    }
    let (start_cpu, start, redis_at_start, commands_at_start) =
        window.context("the sustained window never opened")?;
    let cpu = sampler.usage(&start_cpu, &end_cpu);
    let steps: Vec<String> = rates.iter().map(|r| format!("{r:.1}")).collect();
    println!(
        "load: runs/s offered {}; {} submitted, draining {in_flight_at_end} in flight",
        steps.join(" -> "),
        get(&shared.counters.submitted)
    );

    // Drain: every run still in flight gets to its end, or is counted as not completed.
    let drain = Duration::from_secs_f64(3.0 * longest + 60.0);
    let deadline = Instant::now() + drain;
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shared.stop.cancel();
    let deadline = Instant::now() + Duration::from_secs(10);
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_sampling.cancel();
    let samples = sampling.await?;
    let redis_after = redis_used_memory(&mut rconn).await.unwrap_or(0);
    // A final iteration's timing is written by the worker's next statement or sweep.
    tokio::time::sleep(Duration::from_secs(if ctx.args.smoke { 1 } else { 3 })).await;
    let pg_after = pg_bytes(&ctx.env.pool).await?;

    if let Some(error) = shared
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        println!("load: a submission failed: {error}");
    }

    for seen in shared
        .rebuilt
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        println!("load: stream_rebuilt seen: {seen}");
    }

    // ---- figures ----
    let section = "load";
    let secs = end.at.duration_since(start.at).as_secs_f64();
    let (from_s, to_s) = (
        start.at.duration_since(t0).as_secs_f64(),
        end.at.duration_since(t0).as_secs_f64(),
    );
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= from_s && s.at <= to_s)
        .collect();
    let mean = |f: &dyn Fn(&Sample) -> f64| {
        inside.iter().map(|s| f(s)).sum::<f64>() / inside.len().max(1) as f64
    };
    let in_flight_mean = mean(&|s| s.in_flight as f64);
    let in_flight_min = inside.iter().map(|s| s.in_flight).min().unwrap_or(0);
    let running_mean = mean(&|s| s.running as f64);
    let full = !ctx.args.smoke;
    report.add(
        section,
        "runs in flight, mean over the window",
        in_flight_mean,
        &format!("(asked {}; min {in_flight_min})", plan.in_flight),
        full.then_some(("goal >= 1000", in_flight_mean >= 1000.0)),
    );
    report.add(
        section,
        "runs held by a worker (running), mean",
        running_mean,
        &format!("({} x {} slots)", plan.workers, plan.slots),
        None,
    );
    report.add(section, "offered runs/s", rate, "/s", None);
    report.add(
        section,
        "latest submission behind its moment",
        late.as_secs_f64() * 1000.0,
        "ms",
        None,
    );
    let completed = (end.completed - start.completed) as f64;
    report.add(
        section,
        "completed runs/s over the window",
        completed / secs,
        &format!("/s ({secs:.0} s)"),
        None,
    );
    let durations = {
        let finished = shared.finished.lock().unwrap_or_else(|e| e.into_inner());
        sorted(finished.iter().map(|(_, _, ms)| *ms).collect())
    };
    report.add(
        section,
        "run duration p50 (POST to run_completed at the client)",
        percentile(&durations, 0.5),
        &format!("ms (scripted mean {:.0})", mean_secs * 1000.0),
        None,
    );
    report.add(
        section,
        "run duration p99",
        percentile(&durations, 0.99),
        "ms",
        None,
    );

    // CPU
    let busy = cpu.machine_ms / (secs * 1000.0);
    report.add(
        section,
        "machine cores busy over the window",
        busy,
        "cores",
        Some(("goal <= 1.6", busy <= 1.6)),
    );
    let tokens = (end.tokens - start.tokens) as f64;
    let per_run = |ms: f64| ms / completed.max(1.0);
    let per_k_tokens = |ms: f64| ms / (tokens / 1000.0).max(1e-9);
    report.add(
        section,
        "machine CPU per completed run",
        per_run(cpu.machine_ms),
        "ms",
        None,
    );
    report.add(
        section,
        "machine CPU per 1,000 streamed tokens",
        per_k_tokens(cpu.machine_ms),
        &format!("ms ({tokens:.0} tokens in the window)"),
        None,
    );
    let mut parts = Vec::new();
    let mut split = serde_json::Map::new();
    let mut groups: Vec<(&str, f64)> = cpu.groups.clone();
    groups.push(("other", cpu.other_ms()));
    for (name, ms) in &groups {
        report.add(
            section,
            &format!("{name} CPU per run"),
            per_run(*ms),
            &format!("ms ({:.2} ms per 1,000 tokens)", per_k_tokens(*ms)),
            None,
        );
        let cores = *ms / (secs * 1000.0);
        parts.push(format!("{name} {cores:.2}"));
        split.insert(
            (*name).to_owned(),
            json!({"ms_per_run": per_run(*ms), "ms_per_1000_tokens": per_k_tokens(*ms), "cores": cores}),
        );
    }
    println!(
        "load: cores busy: {} · machine {busy:.2}",
        parts.join(" · ")
    );
    report.json.insert("load.cpu".into(), Value::Object(split));
    let harness: f64 = groups
        .iter()
        .filter(|(name, _)| ["model", "tools", "clients"].contains(name))
        .map(|(_, ms)| ms)
        .sum::<f64>()
        / (secs * 1000.0);
    report.add(
        section,
        "cores busy less the harness (model, tools, clients)",
        busy - harness,
        &format!("cores (the harness {harness:.2})"),
        None,
    );
    if let (Some(before), Some(after)) = (&commands_at_start, &commands_at_end) {
        let commands = crate::ops::commands_delta(before, after);
        let total: u64 = commands.iter().map(|(_, n)| n).sum();
        report.add(
            section,
            "Redis commands per run",
            total as f64 / completed.max(1.0),
            "(whole server)",
            None,
        );
        let top: Vec<String> = commands
            .iter()
            .take(8)
            .map(|(name, n)| format!("{name} {:.1}", *n as f64 / completed.max(1.0)))
            .collect();
        println!("load: redis commands per run: {}", top.join(" · "));
    }

    // Token latency
    let p50 = histogram_percentile(&start.latency, &end.latency, 0.5);
    let p99 = histogram_percentile(&start.latency, &end.latency, 0.99);
    report.add(
        section,
        "token latency p50 (model write to SSE client read)",
        p50,
        "ms (1 ms resolution)",
        None,
    );
    report.add(
        section,
        "token latency p99",
        p99,
        "ms",
        Some(("goal <= 150 ms", p99 <= 150.0)),
    );
    let c = &shared.counters;
    report.add(
        section,
        "tokens replayed after a reconnect (not timed)",
        get(&c.tokens_replayed) as f64,
        &format!("(of {} tokens)", get(&c.tokens)),
        None,
    );

    // Framework time per iteration, as e2e reports it, of the window's iterations.
    let fw: Vec<(i64,)> = sqlx::query_as(
        "SELECT total_us - model_us - tools_us FROM iterations
          WHERE started_at >= $1 AND started_at < $2",
    )
    .bind(start.utc)
    .bind(end.utc)
    .fetch_all(&ctx.env.pool)
    .await?;
    let fw = sorted(fw.into_iter().map(|(v,)| v as f64 / 1000.0).collect());
    report.add(
        section,
        "framework time per iteration p50",
        percentile(&fw, 0.5),
        "ms (goal <= 5 is for e2e --rate)",
        None,
    );
    report.add(
        section,
        "framework time per iteration p99",
        percentile(&fw, 0.99),
        "ms (goal <= 25 is for e2e --rate)",
        None,
    );

    // Memory and connections
    let rss_per_run =
        mean(&|s| s.worker_rss_kib.saturating_sub(rss_idle) as f64 / s.in_flight.max(1) as f64);
    let rss_per_held =
        mean(&|s| s.worker_rss_kib.saturating_sub(rss_idle) as f64 / s.running.max(1) as f64);
    report.add(
        section,
        "worker RSS per in-flight run (above idle)",
        rss_per_run,
        &format!(
            "KiB ({rss_per_held:.1} per held run; idle {:.1} MiB)",
            rss_idle as f64 / 1024.0
        ),
        Some(("goal <= 48 KiB", rss_per_run <= 48.0)),
    );
    let max_rss = inside.iter().map(|s| s.worker_rss_kib).max().unwrap_or(0);
    report.add(
        section,
        "worker RSS, highest in the window",
        max_rss as f64 / 1024.0,
        "MiB",
        None,
    );
    let conns = mean(&|s| s.model_connections as f64);
    let conns_max = inside
        .iter()
        .map(|s| s.model_connections)
        .max()
        .unwrap_or(0);
    report.add(
        section,
        "model connections open, mean",
        conns,
        &format!(
            "(max {conns_max}; {:.2} per held run)",
            conns / running_mean.max(1.0)
        ),
        None,
    );

    // Redis: the finished runs' keys first (sampled), then what an in-flight run adds.
    let finished = shared
        .finished
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let step = (finished.len() / 200).max(1);
    let (mut listed, mut usage, mut text, mut counted) = (0usize, 0i64, 0usize, 0usize);
    for (id, text_bytes, _) in finished.iter().step_by(step).take(200) {
        let (items, bytes) = run_keys(&mut rconn, &ctx.env.prefix, id).await?;
        if items == 0 {
            continue;
        }
        listed += items;
        usage += bytes;
        text += text_bytes;
        counted += 1;
    }
    let ratio = listed as f64 / text.max(1) as f64;
    report.add(
        section,
        "finished run's list bytes / its streamed text",
        ratio,
        &format!(
            "ratio ({counted} runs sampled, {} B of text a run)",
            text / counted.max(1)
        ),
        Some(("goal <= 2x", ratio <= 2.0)),
    );
    let usage_per_run = usage as f64 / counted.max(1) as f64;
    report.add(
        section,
        "Redis MEMORY USAGE of a finished run's keys",
        usage_per_run,
        &format!("B ({:.2}x its text)", usage as f64 / text.max(1) as f64),
        None,
    );
    let finished_total = get(&c.completed) + get(&c.not_completed);
    let info_per_finished =
        (redis_after as f64 - redis_before as f64) / finished_total.max(1) as f64;
    report.add(
        section,
        "Redis used_memory growth per finished run",
        info_per_finished,
        "B (INFO memory, whole server)",
        None,
    );
    let retention_h = 24.0;
    let day_at_100 = usage_per_run * 100.0 * 86_400.0;
    report.add(
        section,
        "Redis memory kept at 100 runs/s, 24 h retention",
        day_at_100 / f64::from(1u32 << 30),
        "GiB",
        None,
    );
    let keep_1gib_h = f64::from(1u32 << 30) / (usage_per_run.max(1.0) * 100.0) / 3600.0;
    report.add(
        section,
        "retention that keeps it under 1 GiB at 100 runs/s",
        keep_1gib_h.min(retention_h * 365.0),
        "h",
        None,
    );
    let active_per_run = active_usage.0 as f64 / active_usage.1.max(1) as f64;
    report.add(
        section,
        "Redis MEMORY USAGE of an in-flight run's keys",
        active_per_run,
        &format!(
            "B ({} runs in flight sampled at the window's end)",
            active_usage.1
        ),
        None,
    );
    // The whole server's growth, less what the finished runs keep: the in-flight runs' keys
    // and everything else they cost Redis (the API's subscription, its buffers), and whatever
    // else uses the server meanwhile.
    let in_flight_redis =
        (redis_at_end as f64 - redis_before as f64 - end.finished as f64 * info_per_finished)
            / in_flight_at_end.max(1) as f64;
    report.add(
        section,
        "Redis used_memory per in-flight run",
        in_flight_redis,
        &format!(
            "B (INFO memory at the window's end less the finished runs'; {:.1} MiB grew in the window)",
            (redis_at_end as f64 - redis_at_start as f64) / 1_048_576.0
        ),
        None,
    );

    // Postgres
    let runs = get(&c.submitted).max(1) as f64;
    let d = |f: fn(&PgBytes) -> i64| (f(&pg_after) - f(&pg_before)) as f64 / runs;
    let (heap, toast, indexes, wal) = (
        d(|b| b.heap),
        d(|b| b.toast),
        d(|b| b.indexes),
        d(|b| b.wal),
    );
    report.add(
        section,
        "Postgres bytes per run: heap + TOAST + indexes",
        heap + toast + indexes,
        &format!("B (heap {heap:.0}, TOAST {toast:.0}, indexes {indexes:.0})"),
        None,
    );
    report.add(
        section,
        "Postgres WAL per run",
        wal,
        "B (the whole server's)",
        None,
    );

    // The clients
    let dropped = get(&c.dropped);
    report.add(
        section,
        "SSE clients dropped",
        get(&c.runs_with_drops) as f64,
        &format!("({dropped} streams ended early)"),
        Some(("goal 0", get(&c.runs_with_drops) == 0)),
    );
    report.add(
        section,
        "SSE streams cut on purpose / reconnected at a pause",
        get(&c.cut) as f64,
        &format!(
            "/ {} (refused or failed to connect: {})",
            get(&c.pause_reconnects),
            get(&c.refused)
        ),
        None,
    );
    let broken = get(&c.gaps) + get(&c.duplicates);
    report.add(
        section,
        "event ids with a gap or a duplicate across reconnects",
        broken as f64,
        &format!(
            "({} gaps, {} duplicates, {} stream_rebuilt)",
            get(&c.gaps),
            get(&c.duplicates),
            get(&c.rebuilt)
        ),
        Some(("goal 0", broken == 0)),
    );
    let not_completed = get(&c.not_completed) + get(&c.submit_failed);
    report.add(
        section,
        "runs not completed",
        not_completed as f64,
        &format!(
            "(of {}; {} submissions failed, {} answers failed)",
            get(&c.submitted),
            get(&c.submit_failed),
            get(&c.answers_failed)
        ),
        Some(("goal 0", not_completed == 0)),
    );
    let mut config = plan.config_json(rate);
    config["rates"] = json!(rates);
    config["model_http"] = json!(if ctx.args.load.model_http1 { 1 } else { 2 });
    report.json.insert("load.config".into(), config);
    report.json.insert(
        "load.samples".into(),
        json!(
            samples
                .iter()
                .map(|s| json!([
                    s.at,
                    s.in_flight,
                    s.running,
                    s.worker_rss_kib,
                    s.model_connections
                ]))
                .collect::<Vec<_>>()
        ),
    );
    drop(workers);
    drop(api);
    drop((model, tools));
    Ok(())
}

#[cfg(test)]
mod tests;
