//! The benchmark: the real services, the API and worker processes, the scripted LLM with zero
//! delay and a local tool server. Prints a table and writes JSON; compares every figure with
//! its goal and with the machine's own limits measured in the same run.
//!
//!   cargo build --release -p agentfleet-api -p agentfleet-worker -p agentfleet-tests --bins
//!   target/release/bench                 # full run (see docs/benchmarks.md)
//!   cargo run -p agentfleet-tests --bin bench -- --smoke   # seconds; CI proves it runs
//!
//! Speed goals are reported, never asserted: the exit code says only whether it ran.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use agentfleet_tests::harness::{ChildProcess, TestEnv, amqp_url, redis_url, wait_for};
use agentfleet_tests::mock_llm::script;

#[derive(Parser, Clone)]
#[command(name = "bench", about = "agentfleet benchmark")]
struct Args {
    /// Seconds-long run with tiny sizes, for CI.
    #[arg(long)]
    smoke: bool,
    /// Worker processes for the end-to-end section.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Runs in the end-to-end section.
    #[arg(long)]
    runs: Option<usize>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench.json")]
    out: String,
    /// Run only these sections (limits, enqueue, framework, e2e, faults, events, resume,
    /// recovery, memory, redis).
    #[arg(long)]
    only: Vec<String>,
}

struct Report {
    rows: Vec<(String, String, f64, String, Option<bool>)>,
    json: serde_json::Map<String, Value>,
}

impl Report {
    fn add(
        &mut self,
        section: &str,
        metric: &str,
        value: f64,
        unit: &str,
        goal: Option<(&str, bool)>,
    ) {
        let (goal_text, met) = match goal {
            Some((text, met)) => (text.to_string(), Some(met)),
            None => (String::new(), None),
        };
        self.rows.push((
            section.into(),
            metric.into(),
            value,
            format!("{unit} {goal_text}"),
            met,
        ));
        self.json.insert(
            format!("{section}.{metric}"),
            json!({"value": value, "unit": unit, "goal": goal_text, "met": met}),
        );
    }

    fn print(&self) {
        println!(
            "\n{:<10} {:<46} {:>14}  unit / goal",
            "section", "metric", "value"
        );
        for (section, metric, value, unit, met) in &self.rows {
            let mark = match met {
                Some(true) => "  [met]",
                Some(false) => "  [MISSED]",
                None => "",
            };
            println!("{section:<10} {metric:<46} {value:>14.3}  {unit}{mark}");
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v
}

struct Ctx {
    env: TestEnv,
    args: Args,
    base: String,
    key: String,
    http: reqwest::Client,
    _api: ChildProcess,
}

impl Ctx {
    fn wants(&self, section: &str) -> bool {
        self.args.only.is_empty() || self.args.only.iter().any(|s| s == section)
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let v: Value = resp.json().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {v}");
        Ok(v)
    }

    fn agent(&self) -> Value {
        json!({"model": "mock", "tools": [{"name": "echo", "kind": "http", "url": self.env.tools.url("/echo"),
               "parameters": {"type": "object"}}], "max_iterations": 10})
    }

    async fn count(&self, status: &str) -> i64 {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE status = $1")
            .bind(status)
            .fetch_one(&self.env.pool)
            .await
            .unwrap_or((0,));
        n
    }

    /// Polls until run `id` is completed (panics after `timeout`).
    async fn wait_completed(&self, id: &str, timeout: Duration) {
        wait_for("the run to complete", timeout, || async {
            let (status,): (String,) =
                sqlx::query_as("SELECT status FROM runs WHERE id = $1::uuid")
                    .bind(id)
                    .fetch_one(&self.env.pool)
                    .await
                    .ok()?;
            (status == "completed").then_some(())
        })
        .await;
    }

    /// Submits `n` copies of `body` (32 requests in flight) and waits until as many more runs
    /// have completed; returns the seconds from the first POST to the last completion.
    async fn run_batch(&self, n: usize, body: &Value, limit: Duration) -> anyhow::Result<f64> {
        let done_before = self.count("completed").await;
        let t = Instant::now();
        let sem = Arc::new(Semaphore::new(32));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let permit = sem.clone().acquire_owned().await?;
            let (http, url, key, body) = (
                self.http.clone(),
                format!("{}/v1/runs", self.base),
                self.key.clone(),
                body.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let r = http.post(url).bearer_auth(key).json(&body).send().await;
                drop(permit);
                r.map(|r| r.status() == 202).unwrap_or(false)
            }));
        }
        for task in tasks {
            anyhow::ensure!(task.await?, "a submission failed");
        }
        wait_for("all runs to complete", limit, || async {
            (self.count("completed").await >= done_before + n as i64).then_some(())
        })
        .await;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Stops everything queued or waiting, so the next section starts clean.
    async fn settle(&self) {
        let _ = sqlx::query(
            "UPDATE runs SET status = 'cancelled', finished_at = now(), pending = NULL,
                             lease_owner = NULL, lease_expires_at = NULL
             WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')",
        )
        .execute(&self.env.pool)
        .await;
        if let Ok(conn) = agentfleet_shared::queue::connect(&amqp_url(), "bench").await
            && let Ok(ch) = conn.create_channel().await
        {
            let _ = ch
                .queue_purge(
                    format!("{}.runs", self.env.prefix).as_str().into(),
                    Default::default(),
                )
                .await;
        }
    }

    fn workers(&self, n: usize, extra: &[(&str, &str)]) -> Vec<ChildProcess> {
        (0..n)
            .map(|_| self.env.spawn_worker_process(extra))
            .collect()
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("bench failed: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    agentfleet_shared::telemetry::install_crypto();
    let env = TestEnv::with(&[
        ("database.max_connections", "24"),
        ("worker.lease_ms", "10000"),
        ("worker.lease_renew_ms", "3000"),
        ("worker.requeue_after_ms", "15000"),
        ("worker.sweep_interval_ms", "2000"),
        ("database.idle_in_transaction_timeout_ms", "5000"),
        ("redis.pool_size", "64"),
        ("telemetry.log_format", "json"),
    ])
    .await;
    let (api, base) = env.spawn_api_process(&[("RUST_LOG", "error")]).await;
    let key = agentfleet_shared::store::tenants::create(&env.pool, "bench")
        .await?
        .api_key;
    let ctx = Ctx {
        env,
        args: args.clone(),
        base,
        key,
        http: reqwest::Client::new(),
        _api: api,
    };
    let mut report = Report {
        rows: Vec::new(),
        json: serde_json::Map::new(),
    };
    let limits = if ctx.wants("limits") {
        machine_limits(&ctx, &mut report).await?
    } else {
        HashMap::new()
    };
    if ctx.wants("enqueue") {
        enqueue(&ctx, &mut report, &limits).await?;
        ctx.settle().await;
    }
    if ctx.wants("framework") {
        framework_time(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("e2e") {
        end_to_end(&ctx, &mut report, &limits).await?;
        ctx.settle().await;
    }
    if ctx.wants("faults") {
        fault_throughput(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("events") {
        event_latency(&ctx, &mut report, &limits).await?;
        ctx.settle().await;
    }
    if ctx.wants("resume") {
        resume_latency(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("recovery") {
        recovery(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("memory") {
        memory(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("redis") {
        redis_bytes(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    report.print();
    let machine = json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "smoke": args.smoke,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    report.json.insert("machine".into(), machine);
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&Value::Object(report.json))?,
    )?;
    println!("\nresults written to {}", args.out);
    Ok(())
}

/// Postgres single-row commits/s, RabbitMQ confirmed publishes/s, Redis RPUSH/s.
async fn machine_limits(
    ctx: &Ctx,
    report: &mut Report,
) -> anyhow::Result<HashMap<&'static str, f64>> {
    let n = if ctx.args.smoke { 300 } else { 5000 };
    let mut out = HashMap::new();
    // Postgres: one connection, autocommit single-row inserts.
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&ctx.env.database_url).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS bench_scratch (id bigserial PRIMARY KEY, v text)")
            .execute(&mut conn)
            .await?;
        let t = Instant::now();
        for i in 0..n {
            sqlx::query("INSERT INTO bench_scratch (v) VALUES ($1)")
                .bind(i.to_string())
                .execute(&mut conn)
                .await?;
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        report.add(
            "limits",
            "postgres single-row commits/s (1 conn)",
            rate,
            "/s",
            None,
        );
        out.insert("pg", rate);
    }
    // RabbitMQ: persistent publishes with confirms, pipelined 64 at a time.
    {
        use lapin::options::{
            BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
        };
        let conn = agentfleet_shared::queue::connect(&amqp_url(), "bench-limits").await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let q = format!("{}.scratch", ctx.env.prefix);
        let mut args = lapin::types::FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            lapin::types::AMQPValue::LongString("quorum".into()),
        );
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await?;
        let t = Instant::now();
        let props = lapin::BasicProperties::default().with_delivery_mode(2);
        let mut pending = Vec::new();
        for _ in 0..n {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    b"{}",
                    props.clone(),
                )
                .await?;
            pending.push(confirm);
            if pending.len() >= 64 {
                for c in pending.drain(..) {
                    c.await?;
                }
            }
        }
        for c in pending {
            c.await?;
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        report.add(
            "limits",
            "rabbitmq confirmed publishes/s (64 in flight)",
            rate,
            "/s",
            None,
        );
        out.insert("amqp", rate);
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        let _ = conn.close(200, "done".into()).await;
    }
    // Redis: RPUSH from 16 concurrent connections (round trip each).
    {
        let client = deadpool_redis::redis::Client::open(redis_url())?;
        let key = format!("{}:scratch", ctx.env.prefix);
        let t = Instant::now();
        let per = n / 16;
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let mut conn = client.get_multiplexed_async_connection().await?;
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..per {
                    let _: i64 = deadpool_redis::redis::cmd("RPUSH")
                        .arg(&key)
                        .arg("x")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await?;
        }
        let rate = (per * 16) as f64 / t.elapsed().as_secs_f64();
        report.add(
            "limits",
            "redis RPUSH/s (16 conns, 1 round trip each)",
            rate,
            "/s",
            None,
        );
        out.insert("redis", rate);
        let mut conn = client.get_multiplexed_async_connection().await?;
        let _: i64 = deadpool_redis::redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
    }
    Ok(out)
}

/// Durable `POST /v1/runs` throughput and latency over a concurrency sweep, no workers.
async fn enqueue(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    let (levels, n): (&[usize], usize) = if ctx.args.smoke {
        (&[1, 8], 40)
    } else {
        (&[1, 8, 32, 64], 3000)
    };
    let body = json!({"input": "hello", "agent": {"model": "mock"}});
    let mut best = 0.0f64;
    for &c in levels {
        let sem = Arc::new(Semaphore::new(c));
        let t = Instant::now();
        let mut tasks = Vec::with_capacity(n);
        for _ in 0..n {
            let permit = sem.clone().acquire_owned().await?;
            let http = ctx.http.clone();
            let url = format!("{}/v1/runs", ctx.base);
            let key = ctx.key.clone();
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                let resp = http.post(url).bearer_auth(key).json(&body).send().await;
                drop(permit);
                let ok = resp.map(|r| r.status() == 202).unwrap_or(false);
                (start.elapsed().as_secs_f64() * 1000.0, ok)
            }));
        }
        let mut lat = Vec::with_capacity(n);
        let mut failures = 0;
        for task in tasks {
            let (ms, ok) = task.await?;
            if !ok {
                failures += 1;
            }
            lat.push(ms);
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        let lat = sorted(lat);
        let p99 = percentile(&lat, 0.99);
        best = best.max(rate);
        report.add("enqueue", &format!("c={c} runs/s"), rate, "/s", None);
        report.add(
            "enqueue",
            &format!("c={c} p50 latency"),
            percentile(&lat, 0.5),
            "ms",
            None,
        );
        report.add(
            "enqueue",
            &format!("c={c} p99 latency"),
            p99,
            "ms",
            (c >= 32).then_some(("goal p99 <= 20 ms", p99 <= 20.0)),
        );
        anyhow::ensure!(failures == 0, "{failures} enqueue requests failed at c={c}");
    }
    report.add(
        "enqueue",
        "best runs/s",
        best,
        "/s",
        Some(("goal >= 3000/s", best >= 3000.0)),
    );
    if let Some(pg) = limits.get("pg") {
        report.add(
            "enqueue",
            "best runs/s / postgres commits/s",
            best / pg,
            "ratio",
            None,
        );
    }
    if let Some(amqp) = limits.get("amqp") {
        report.add(
            "enqueue",
            "best runs/s / rabbitmq publishes/s",
            best / amqp,
            "ratio",
            None,
        );
    }
    Ok(())
}

/// Throughput before and after a fault: a worker killed with `kill -9` in the middle of a
/// batch (and replaced, as Kubernetes would), and, outside smoke mode, RabbitMQ restarted in
/// the middle of one. The fault's own batch pays the recovery; the one after must run at
/// least 90 % as fast as the one before.
async fn fault_throughput(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
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

/// The framework's own time per iteration (the iteration's wall time minus the model call and
/// the tool calls, as the worker records it), one run at a time so that nothing queues.
async fn framework_time(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
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

/// No-op runs (one http tool call, then a final answer) from POST to run_completed.
async fn end_to_end(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    let n = ctx
        .args
        .runs
        .unwrap_or(if ctx.args.smoke { 20 } else { 3000 });
    let _workers = ctx.workers(
        ctx.args.workers,
        &[
            ("worker.concurrency", "64"),
            ("database.max_connections", "20"),
        ],
    );
    let input = script(
        json!([{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}, {"content": "done"}]),
    );
    let body = json!({"input": input, "agent": ctx.agent()});
    // Let the workers connect before the clock starts.
    tokio::time::sleep(Duration::from_millis(if ctx.args.smoke {
        300
    } else {
        1500
    }))
    .await;
    let limit = Duration::from_secs(if ctx.args.smoke { 60 } else { 600 });
    let elapsed = ctx.run_batch(n, &body, limit).await?;
    let rate = n as f64 / elapsed;
    report.add(
        "e2e",
        "no-op runs/s (POST to run_completed)",
        rate,
        "/s",
        Some(("goal >= 700/s", rate >= 700.0)),
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
    let lat: Vec<(f64,)> = sqlx::query_as(
        "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 FROM runs WHERE status = 'completed'",
    )
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
    // Framework time per iteration under this load: mostly queueing for the two cores and
    // the connection pools (the intrinsic figure is the `framework` section's).
    let fw: Vec<(i64,)> = sqlx::query_as("SELECT total_us - model_us - tools_us FROM iterations")
        .fetch_all(&ctx.env.pool)
        .await?;
    let fw = sorted(fw.into_iter().map(|(v,)| v as f64 / 1000.0).collect());
    report.add(
        "e2e",
        "framework time per iteration under load p50",
        percentile(&fw, 0.5),
        "ms",
        None,
    );
    report.add(
        "e2e",
        "framework time per iteration under load p99",
        percentile(&fw, 0.99),
        "ms",
        None,
    );
    let model: Vec<(i64, i64)> = sqlx::query_as("SELECT model_us, tools_us FROM iterations")
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
    Ok(())
}

/// From the worker's append (the envelope's `at`, millisecond resolution) to receipt by an SSE
/// client, with many clients.
async fn event_latency(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    // The goal's load: 1,000 clients receiving 20,000 events/s in all (50 runs streaming 20
    // events/s each, 20 clients per run).
    let (runs, clients, chunks) = if ctx.args.smoke {
        (4, 2, 20)
    } else {
        (50, 20, 100)
    };
    let _workers = ctx.workers(
        ctx.args.workers,
        &[
            ("worker.concurrency", "64"),
            ("events.delta_flush_bytes", "1"),
            ("events.delta_flush_ms", "1"),
        ],
    );
    let text = "abcdefghij".repeat(chunks / 10);
    let input = script(
        json!([{"content": text, "chunks": chunks, "chunk_delay_ms": 50, "delay_ms": 1500}]),
    );
    let body = json!({"input": input, "agent": {"model": "mock"}});
    let mut handles = Vec::new();
    let t = Instant::now();
    for _ in 0..runs {
        let run = ctx.post("/v1/runs", &body).await?;
        let id = run["id"].as_str().unwrap().to_string();
        for _ in 0..clients {
            let (http, url, key) = (
                ctx.http.clone(),
                format!("{}/v1/runs/{id}/events", ctx.base),
                ctx.key.clone(),
            );
            handles.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let Ok(resp) = http.get(url).bearer_auth(key).send().await else {
                    return (lat, 0);
                };
                let mut stream = resp.bytes_stream().eventsource();
                let mut n = 0;
                while let Some(Ok(ev)) = stream.next().await {
                    let now = chrono::Utc::now();
                    let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
                        continue;
                    };
                    n += 1;
                    if v["type"] == "message_delta"
                        && let Some(at) = v["at"]
                            .as_str()
                            .and_then(|a| chrono::DateTime::parse_from_rfc3339(a).ok())
                    {
                        lat.push(
                            (now - at.with_timezone(&chrono::Utc))
                                .num_microseconds()
                                .unwrap_or(0) as f64
                                / 1000.0,
                        );
                    }
                }
                (lat, n)
            }));
        }
    }
    let mut all = Vec::new();
    let mut events = 0usize;
    for h in handles {
        let (lat, n) = h.await?;
        events += n;
        all.extend(lat);
    }
    let secs = t.elapsed().as_secs_f64();
    let lat = sorted(all);
    let p99 = percentile(&lat, 0.99);
    report.add("events", "SSE clients", (runs * clients) as f64, "", None);
    report.add(
        "events",
        "events delivered to clients/s",
        events as f64 / secs,
        "/s",
        None,
    );
    report.add(
        "events",
        "append-to-client latency p50 (1 ms resolution)",
        percentile(&lat, 0.5),
        "ms",
        None,
    );
    report.add(
        "events",
        "append-to-client latency p99 (1 ms resolution)",
        p99,
        "ms",
        Some(("goal <= 10 ms", p99 <= 10.0)),
    );
    if let Some(redis) = limits.get("redis") {
        report.add(
            "events",
            "appended events/s / redis RPUSH/s",
            (events / clients.max(1)) as f64 / secs / redis,
            "ratio",
            None,
        );
    }
    Ok(())
}

/// `POST /resume` to the `run_resumed` event on an open SSE stream.
async fn resume_latency(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 5 } else { 300 };
    let _workers = ctx.workers(ctx.args.workers, &[("worker.concurrency", "64")]);
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

/// From `kill -9` of a worker to its runs' next event (`run_recovered`) on another worker.
async fn recovery(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
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

/// Worker RSS with many runs waiting on a slow model.
async fn memory(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 200 } else { 10_000 };
    let concurrency = n.to_string();
    let worker = ctx.env.spawn_worker_process(&[
        ("worker.concurrency", concurrency.as_str()),
        ("worker.lease_renew_ms", "5000"),
        ("database.max_connections", "20"),
    ]);
    // Let it connect and settle before the idle reading.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = rss_kib(worker.pid()).unwrap_or(0);
    let input = script(json!([{"content": "slow", "delay_ms": 600000}]));
    let one = json!({"input": input, "agent": {"model": "mock"}});
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let runs: Vec<Value> = chunk.iter().map(|_| one.clone()).collect();
        ctx.post("/v1/runs/batch", &json!({"runs": runs})).await?;
    }
    let started = Instant::now();
    wait_for(
        "all runs to be waiting on the model",
        Duration::from_secs(600),
        || async {
            (ctx.count("running").await >= n as i64 && ctx.env.llm.request_count() >= n)
                .then_some(())
        },
    )
    .await;
    let rss = rss_kib(worker.pid()).context("reading VmRSS")? as f64 / 1024.0;
    report.add(
        "memory",
        "runs waiting on the model in one worker",
        n as f64,
        "",
        None,
    );
    report.add(
        "memory",
        "time for all to start",
        started.elapsed().as_secs_f64(),
        "s",
        None,
    );
    report.add(
        "memory",
        "worker RSS idle",
        baseline as f64 / 1024.0,
        "MiB",
        None,
    );
    let goal = if n >= 10_000 {
        Some(("goal <= 1024 MiB", rss <= 1024.0))
    } else {
        None
    };
    report.add("memory", "worker RSS with them waiting", rss, "MiB", goal);
    report.add(
        "memory",
        "RSS per waiting run",
        (rss * 1024.0) / n as f64,
        "KiB",
        None,
    );
    drop(worker);
    Ok(())
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Bytes a realistic run leaves in its Redis list, against the text it streamed: at the
/// default delta coalescing with and without compaction, and at longer flush intervals.
async fn redis_bytes(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    for (flush_ms, compact) in [
        ("50", "true"),
        ("50", "false"),
        ("250", "false"),
        ("1000", "false"),
    ] {
        let workers = ctx.workers(
            1,
            &[
                ("events.delta_flush_ms", flush_ms),
                ("events.delta_flush_bytes", "4096"),
                ("events.compact_deltas", compact),
            ],
        );
        redis_bytes_at(ctx, report, flush_ms, compact == "true").await?;
        drop(workers);
    }
    Ok(())
}

async fn redis_bytes_at(
    ctx: &Ctx,
    report: &mut Report,
    flush_ms: &str,
    compact: bool,
) -> anyhow::Result<()> {
    // About 60 tokens/s, a typical streaming rate: 4-character chunks every 16 ms.
    let words = "agents stream their answers token by token while users watch the text appear ";
    let text = words.repeat(if ctx.args.smoke { 10 } else { 40 });
    let chunks = text.len() / 4;
    let input = script(json!([
        {"content": "Let me check.", "chunks": 4, "chunk_delay_ms": 16, "tool_calls": [{"name": "echo", "arguments": {"q": "x"}}]},
        {"content": text, "chunks": chunks, "chunk_delay_ms": 16}
    ]));
    let run = ctx
        .post("/v1/runs", &json!({"input": input, "agent": ctx.agent()}))
        .await?;
    let id = run["id"].as_str().unwrap().to_string();
    ctx.wait_completed(&id, Duration::from_secs(120)).await;
    let client = deadpool_redis::redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let key = format!("{}:run:{id}:events", ctx.env.prefix);
    // Compaction runs right after `message_completed`; wait for both messages' headers.
    let items: Vec<String> = wait_for("the list to settle", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        let key = key.clone();
        async move {
            let items: Vec<String> = deadpool_redis::redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .ok()?;
            let headers = items
                .iter()
                .filter(|i| i.contains("\"type\":\"~delta\""))
                .count();
            (!compact || headers == 2).then_some(items)
        }
    })
    .await;
    let memory: i64 = deadpool_redis::redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut conn)
        .await?;
    let stored: usize = items.iter().map(String::len).sum();
    let deltas = items
        .iter()
        .filter(|i| {
            i.is_empty() || i.contains("\"type\":\"message_delta\"") || i.contains("~delta")
        })
        .count();
    let streamed = text.len() + "Let me check.".len();
    let ratio = stored as f64 / streamed as f64;
    let tag = format!(
        "flush {flush_ms} ms{}",
        if compact { ", compacted" } else { "" }
    );
    let default = flush_ms == "50" && compact;
    report.add(
        "redis",
        &format!("{tag}: events / deltas in the list"),
        items.len() as f64,
        &format!("({deltas} deltas)"),
        None,
    );
    report.add(
        "redis",
        &format!("{tag}: list bytes / streamed text ({streamed} B)"),
        ratio,
        "ratio",
        default.then_some(("goal <= 2x (defaults)", ratio <= 2.0)),
    );
    report.add(
        "redis",
        &format!("{tag}: MEMORY USAGE / streamed text"),
        memory as f64 / streamed as f64,
        "ratio",
        None,
    );
    Ok(())
}
