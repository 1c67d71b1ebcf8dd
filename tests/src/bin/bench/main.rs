//! The benchmark: the real services, the API and worker processes, the scripted LLM with zero
//! delay and a local tool server. Prints a table and writes JSON; compares every figure with
//! its goal and with the machine's own limits measured in the same run.
//!
//!   cargo build --release -p agentfleet-api -p agentfleet-worker -p agentfleet-tests --bins
//!   target/release/bench                 # full run (see docs/benchmarks.md)
//!   cargo run -p agentfleet-tests --bin bench -- --smoke   # seconds; CI proves it runs
//!
//! Speed goals are reported, never asserted: the exit code says only whether it ran.

mod auth;
mod batch;
mod common;
mod cpu;
mod e2e;
mod enqueue;
mod events;
mod fairness;
mod faults;
mod framework;
mod limits;
mod load;
mod memory;
mod ops;
mod plan;
mod profile;
mod recovery;
mod redis;
mod report;
mod resume;
mod soak;
mod storage;

use std::collections::HashMap;

use clap::Parser;
use serde_json::{Value, json};

use agentfleet_tests::harness::TestEnv;

use common::Ctx;
use report::Report;

// The scripted model and tool server are counted in the benchmarks' CPU per run (the same
// code serves both sides of bench/compare): they allocate like the fleet's own processes do,
// with jemalloc, so glibc's malloc is not a third of the harness's cost (perf, bench e2e).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Clone)]
#[command(name = "bench", about = "agentfleet benchmark")]
struct Args {
    /// Seconds-long run with tiny sizes, for CI.
    #[arg(long)]
    smoke: bool,
    /// Worker processes for the end-to-end and plan sections (default 2) and the load section
    /// (default 1).
    #[arg(long)]
    workers: Option<usize>,
    /// Runs in the end-to-end section.
    #[arg(long)]
    runs: Option<usize>,
    /// Rounds of the end-to-end section (odd): each figure reported is the median of its
    /// rounds, each round's headline figures are printed too.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Slots per worker (`worker.concurrency`) in the end-to-end and plan sections (default 64)
    /// and the load section (default: a quarter more than --in-flight, shared by the workers).
    #[arg(long)]
    slots: Option<usize>,
    /// Runs per submission in the end-to-end section: 1 (the default) posts each run to
    /// `POST /v1/runs`, 32 requests in flight; N > 1 posts them N at a time to
    /// `POST /v1/runs/batch` (at most `api.max_batch_runs`), 4 requests in flight.
    #[arg(long, default_value_t = 1)]
    submit_batch: usize,
    /// Runs per second offered in the end-to-end section: submissions go out at a steady pace
    /// (up to 512 requests in flight) instead of as fast as the requests in flight (32, or 4
    /// with --submit-batch) are answered, so the figures are those of a fleet under that load
    /// rather than at its limit. Without it, the section measures the fleet saturated.
    #[arg(long)]
    rate: Option<f64>,
    /// A JSON file holding an array of tool parameter schemas: each becomes one more tool
    /// (`tool_1`, `tool_2`, …, at the echo tool's URL) of the agent that the enqueue and
    /// end-to-end sections submit, as a product's agent carries several; the scripted model
    /// calls only `echo`. `bench/agent-tools.json` holds eight realistic ones.
    #[arg(long)]
    agent_tools: Option<String>,
    /// Tool turns per run in the end-to-end section: the scripted model calls `echo` once a
    /// turn this many times, then answers (1: the no-op run every figure of issue 13 uses).
    /// Longer runs send a longer history with every model call, as a working agent does; the
    /// figures keep their names ("no-op runs/s") and the one-turn run's goals.
    #[arg(long, default_value_t = 1)]
    tool_turns: usize,
    /// Bytes of text in each `echo` call's arguments in the end-to-end section, which the
    /// tool returns as its result (0: `{"x": 1}`, the no-op run's).
    #[arg(long, default_value_t = 0)]
    tool_result_bytes: usize,
    /// Bytes of words in the agent's system prompt (enqueue and end-to-end sections; 0: none),
    /// which every model call sends, as a product's agent carries one.
    #[arg(long, default_value_t = 0)]
    system_prompt_bytes: usize,
    /// API processes of the events section's fan-out measurement, comma-separated: for each
    /// count N, 2,000 SSE streams (100 runs × 20 clients) are spread over N API processes, a
    /// run's clients on one of them, and Redis output bytes and API CPU per delivered event are
    /// reported (default 1,2,4; with --smoke 1,2 and 20 streams).
    #[arg(long, value_delimiter = ',')]
    api_replicas: Vec<usize>,
    /// The fan-out with the load per API process fixed instead of the total: each round serves
    /// this many runs' streams (20 clients each) per API process, so N processes serve N times
    /// as many.
    #[arg(long)]
    fan_out_runs_per_api: Option<usize>,
    /// Seconds of the storage section's retention soak: runs offered at half the measured
    /// no-op capacity with finished runs kept 60 s, the database's size sampled every 10 s
    /// (default 600; with --smoke 6, finished runs kept 2 s; 0 skips the soak).
    #[arg(long)]
    soak_secs: Option<u64>,
    /// Drops these indexes of the benchmark's database before the sections run (repeatable),
    /// to measure what maintaining one costs: e.g. `--drop-index runs_finished --only e2e`
    /// against the same run without it.
    #[arg(long, value_name = "INDEX")]
    drop_index: Vec<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench.json")]
    out: String,
    /// The benchmark tenant's own `limits.max_active_runs` (0: none). Without it the tenant has
    /// the shipped default, so its creates count its active runs under its creation lock
    /// (`store::active_runs`) as every tenant's do.
    #[arg(long)]
    max_active_runs: Option<u32>,
    /// The benchmark tenant's own `limits.requests_per_second` (default 0: none, so the sections
    /// measure the fleet rather than one tenant's rate; any other value makes every request
    /// take the rate limiter's Redis round trip).
    #[arg(long, default_value_t = 0)]
    requests_per_second: u32,
    /// Plan-and-solve runs in flight at once in the plan section (default 30; with --smoke
    /// 4).
    #[arg(long)]
    plan_parents: Option<usize>,
    /// Tasks per round in the plan section, all of a round in parallel (default 4; with
    /// --smoke 3).
    #[arg(long)]
    plan_tasks: Option<usize>,
    /// Rounds per plan-and-solve run in the plan section (default 5; with --smoke 2).
    #[arg(long)]
    plan_rounds: Option<usize>,
    /// Run only these sections (limits, enqueue, batch, framework, e2e, fairness, faults,
    /// events, resume, plan, recovery, memory, redis, storage, auth, load).
    #[arg(long)]
    only: Vec<String>,
    #[command(flatten)]
    load: load::LoadArgs,
}

impl Args {
    /// Worker processes of the sections that take `--workers` (the load section has its own
    /// default).
    fn workers(&self) -> usize {
        self.workers.unwrap_or(2)
    }

    /// The replica counts of the fan-out measurement, smallest first.
    fn api_replicas(&self) -> Vec<usize> {
        let mut counts = if self.api_replicas.is_empty() {
            if self.smoke {
                vec![1, 2]
            } else {
                vec![1, 2, 4]
            }
        } else {
            self.api_replicas.clone()
        };
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    /// Slots per worker of the end-to-end and plan sections.
    fn slots(&self) -> usize {
        self.slots.unwrap_or(64)
    }
}

/// The scripted runs must stay within the defaults the benchmark keeps, or they would fail, or
/// complete having done less than asked: the tool's answer within `worker.max_tool_result_bytes`
/// (64 KiB; more is cut), a run's history within the scripted model's context without compaction
/// (100,000 tokens less the 4,096 reserved; compaction would cut the script the model reads from
/// the first message), and a submission within `api.max_batch_body_bytes` (32 MiB).
fn scripted_runs_fit(args: &Args, extra_tools: &[serde_json::Value]) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=200).contains(&args.tool_turns),
        "--tool-turns must be within 1..=200"
    );
    anyhow::ensure!(
        args.tool_result_bytes <= 60_000,
        "--tool-result-bytes must be at most 60000: the tool echoes the arguments, and an answer \
         past worker.max_tool_result_bytes (65536) is cut"
    );
    anyhow::ensure!(
        args.system_prompt_bytes <= 200_000,
        "--system-prompt-bytes must be at most 200000 (agent.system_prompt's limit)"
    );
    let tools = serde_json::to_string(extra_tools)?.len();
    // Every turn adds the arguments (in the assistant message) and the result (in the tool
    // message), each with some framing; the script in the first message holds the text once.
    let history = (2 * args.tool_turns + 1) * (args.tool_result_bytes + 200)
        + args.system_prompt_bytes
        + tools
        + 2_000;
    // Counted in bytes: English words with their JSON take several bytes a token, so 270,000
    // bytes stay within the 95,904 tokens the scripted model leaves for the history.
    anyhow::ensure!(
        history <= 270_000,
        "--tool-turns {} with --tool-result-bytes {} and --system-prompt-bytes {}: a run's \
         history would reach about {history} bytes, more than the scripted model's context \
         takes without compaction (which would cut the script it reads); ask for less",
        args.tool_turns,
        args.tool_result_bytes,
        args.system_prompt_bytes
    );
    let body =
        args.submit_batch * (args.tool_result_bytes + args.system_prompt_bytes + tools + 4_096);
    anyhow::ensure!(
        body <= 32 << 20,
        "--submit-batch {} runs of about {} bytes each exceed api.max_batch_body_bytes (32 MiB)",
        args.submit_batch,
        body / args.submit_batch
    );
    Ok(())
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
    anyhow::ensure!(
        args.repeat % 2 == 1,
        "--repeat must be odd (1, 3, 5, …): the median of an even count is no round's figure"
    );
    anyhow::ensure!(
        (1..=1000).contains(&args.submit_batch),
        "--submit-batch must be within 1..=1000 (the API's default api.max_batch_runs)"
    );
    anyhow::ensure!(
        (1..=200).contains(&args.tool_turns),
        "--tool-turns must be within 1..=200"
    );
    anyhow::ensure!(
        args.workers.is_none_or(|w| (1..=64).contains(&w))
            && args.slots.is_none_or(|s| (1..=100_000).contains(&s)),
        "--workers must be within 1..=64 and --slots within 1..=100000"
    );
    anyhow::ensure!(
        args.api_replicas
            .iter()
            .all(|n| (1..=events::MAX_API_REPLICAS).contains(n)),
        "--api-replicas takes counts within 1..={}",
        events::MAX_API_REPLICAS
    );
    // Every task of a round in flight at once (`api.max_plan_parallel`, 16), rounds within
    // `api.max_plan_rounds` (20).
    anyhow::ensure!(
        args.plan_parents.is_none_or(|n| (1..=10_000).contains(&n))
            && args.plan_tasks.is_none_or(|n| (1..=16).contains(&n))
            && args.plan_rounds.is_none_or(|n| (1..=20).contains(&n)),
        "--plan-parents must be within 1..=10000, --plan-tasks within 1..=16 and --plan-rounds \
         within 1..=20"
    );
    if let Some(rate) = args.rate {
        anyhow::ensure!(
            rate.is_finite() && (1.0..=100_000.0).contains(&rate),
            "--rate must be within 1..=100000 runs per second"
        );
    }
    let extra_tools = match &args.agent_tools {
        None => Vec::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--agent-tools {path}: {e}"))?;
            let schemas: Vec<serde_json::Value> = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("--agent-tools {path}: not a JSON array: {e}"))?;
            schemas
        }
    };
    scripted_runs_fit(&args, &extra_tools)?;
    agentfleet_shared::telemetry::install_crypto();
    let env = TestEnv::with(&[
        ("database.max_connections", "24"),
        ("worker.lease_ms", "10000"),
        ("worker.lease_renew_ms", "3000"),
        ("worker.requeue_after_ms", "15000"),
        ("worker.sweep_interval_ms", "2000"),
        ("database.idle_in_transaction_timeout_ms", "5000"),
        ("telemetry.log_format", "json"),
    ])
    .await;
    for index in &args.drop_index {
        // A plain identifier only: it is spliced into the statement.
        anyhow::ensure!(
            !index.is_empty()
                && index
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "--drop-index {index}: an index name of lower-case letters, digits and _"
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP INDEX {index}")))
            .execute(&env.pool)
            .await
            .map_err(|e| anyhow::anyhow!("--drop-index {index}: {e}"))?;
    }
    let (api, base) = env.spawn_api_process(&[("RUST_LOG", "error")]).await;
    let tenant = agentfleet_shared::store::tenants::create(&env.pool, "bench").await?;
    sqlx::query(
        "UPDATE tenants SET limits = jsonb_strip_nulls(jsonb_build_object(
             'max_active_runs', $2::int8, 'requests_per_second', $3::int8)) WHERE id = $1",
    )
    .bind(tenant.tenant_id)
    .bind(args.max_active_runs.map(i64::from))
    .bind(i64::from(args.requests_per_second))
    .execute(&env.pool)
    .await?;
    let key = tenant.api_key;
    let ctx = Ctx {
        env,
        args: args.clone(),
        base,
        key,
        http: reqwest::Client::new(),
        api,
        extra_tools,
    };
    let mut report = Report::default();
    let limits = if ctx.wants("limits") {
        limits::machine_limits(&ctx, &mut report).await?
    } else {
        HashMap::new()
    };
    if ctx.wants("enqueue") {
        enqueue::enqueue(&ctx, &mut report, &limits).await?;
        ctx.settle().await;
    }
    if ctx.wants("batch") {
        batch::batch(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("framework") {
        framework::framework_time(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("e2e") {
        e2e::end_to_end(&ctx, &mut report, &limits).await?;
        ctx.settle().await;
    }
    if ctx.wants("fairness") {
        fairness::fairness(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("faults") {
        faults::fault_throughput(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("events") {
        events::event_latency(&ctx, &mut report, &limits).await?;
        ctx.settle().await;
        events::fan_out(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("resume") {
        resume::resume_latency(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("plan") {
        plan::plan_rounds(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("recovery") {
        recovery::recovery(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("memory") {
        memory::memory(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("redis") {
        redis::redis_bytes(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("storage") {
        storage::storage(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("auth") {
        auth::flood(&ctx, &mut report).await?;
        ctx.settle().await;
    }
    if ctx.wants("load") {
        load::load(&ctx, &mut report).await?;
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
