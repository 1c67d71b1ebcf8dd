//! The demo: migrations, the API, two workers, the scripted LLM and a tool server; submits a
//! few runs (one with a tool call, one that asks a question, one that needs a confirmation),
//! answers them, prints one run's event stream; registers a webhook, submits a small batch
//! with `agentfleetctl submit --wait` and shows the signed `batch.completed` webhook arriving;
//! then shuts everything down cleanly.
//!
//! Run it with `scripts/demo` (which starts the services and builds the binaries first).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};

use agentfleet_tests::harness::{binary, wait_for};
use agentfleet_tests::mock_llm::{MockLlm, script};
use agentfleet_tests::tool_server::ToolServer;
use agentfleet_tests::webhook_receiver::Receiver;

const DB: &str = "agentfleet_demo";

struct Proc(&'static str, Child);

impl Proc {
    fn term(&mut self) -> anyhow::Result<i32> {
        Command::new("kill")
            .arg("-TERM")
            .arg(self.1.id().to_string())
            .status()?;
        let status = self.1.wait()?;
        Ok(status.code().unwrap_or(-1))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.1.kill();
        let _ = self.1.wait();
    }
}

/// The Redis key prefix and RabbitMQ name prefix of the demo's fleet.
const PREFIX: &str = "agentfleet-demo";

#[tokio::main]
async fn main() {
    agentfleet_shared::telemetry::install_crypto();
    let admin = std::env::var("AGENTFLEET_DEMO_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    // Every process of the demo has exited when `run` returns, whatever happened.
    let result = run(&admin).await;
    if std::env::var_os("AGENTFLEET_DEMO_KEEP").is_some() {
        println!(
            "\nkept database {DB}, Redis keys {PREFIX}:* and queues {PREFIX}.* (AGENTFLEET_DEMO_KEEP)"
        );
    } else if let Err(e) = cleanup(&admin).await {
        eprintln!(
            "demo: cleaning up: {}",
            agentfleet_shared::report::one_line(&e)
        );
    }
    if let Err(e) = result {
        eprintln!("demo failed: {}", agentfleet_shared::report::one_line(&e));
        std::process::exit(1);
    }
}

/// Removes what the demo made: its database, Redis keys and queues.
async fn cleanup(admin: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    step("cleaning up (set AGENTFLEET_DEMO_KEEP=1 to keep the demo's data)");
    let mut conn = sqlx::PgConnection::connect(admin).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {DB} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await?;
    let amqp = std::env::var("AGENTFLEET__AMQP__URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let broker = agentfleet_shared::queue::connect(&amqp, "agentfleet-demo-cleanup").await?;
    let ch = broker.create_channel().await?;
    let t = agentfleet_shared::queue::Topology::new(PREFIX);
    for q in [&t.queue, &t.dead_queue] {
        ch.queue_delete(q.as_str().into(), Default::default())
            .await?;
    }
    for x in [&t.exchange, &t.dead_exchange] {
        ch.exchange_delete(x.as_str().into(), Default::default())
            .await?;
    }
    let _ = broker.close(200, "demo cleanup".into()).await;
    let redis_url =
        std::env::var("AGENTFLEET__REDIS__URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}:*"))
        .query_async(&mut redis)
        .await?;
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await?;
    }
    println!(
        "  removed database {DB}, {} Redis key(s) and the demo's queues",
        keys.len()
    );
    Ok(())
}

async fn run(admin: &str) -> anyhow::Result<()> {
    let admin = admin.to_owned();
    let db_url = admin
        .rsplit_once('/')
        .map(|(b, _)| format!("{b}/{DB}"))
        .unwrap_or_default();
    step("preparing the database");
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .context("Postgres (run scripts/services)")?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {DB} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DB}")))
            .execute(&mut conn)
            .await?;
    }
    let llm = MockLlm::start().await?;
    let tools = ToolServer::start().await?;
    let hooks = Receiver::start(0).await;
    let api_port = free_port()?;
    let env = vec![
        ("AGENTFLEET__DATABASE__URL".to_string(), db_url.clone()),
        (
            "AGENTFLEET__API__LISTEN".into(),
            format!("127.0.0.1:{api_port}"),
        ),
        ("AGENTFLEET__MODELS__DEMO__BASE_URL".into(), llm.base_url()),
        ("AGENTFLEET__MODELS__DEMO__MODEL".into(), "scripted".into()),
        // The demo's tool server and webhook receiver are on loopback, which tool calls and
        // webhooks may reach only when listed.
        (
            "AGENTFLEET__EGRESS__ALLOW".into(),
            format!("{},{}", tools.addr(), hooks.addr),
        ),
        ("AGENTFLEET__REDIS__PREFIX".into(), PREFIX.into()),
        ("AGENTFLEET__AMQP__PREFIX".into(), PREFIX.into()),
        ("AGENTFLEET__TELEMETRY__LOG_FORMAT".into(), "pretty".into()),
        // A demo-only secret: stream tokens then verify on any API replica.
        (
            "AGENTFLEET__API__STREAM_TOKEN_SECRET".into(),
            format!("demo-{}", uuid::Uuid::new_v4().simple()),
        ),
        (
            "RUST_LOG".into(),
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        ),
    ];
    let api_bin = binary("agentfleet-api");
    let status = Command::new(&api_bin)
        .arg("migrate")
        .envs(env.clone())
        .status()?;
    if !status.success() {
        bail!("migrations failed");
    }
    let out = Command::new(&api_bin)
        .args(["create-tenant", "--name", "demo"])
        .envs(env.clone())
        .output()?;
    let key = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("api_key=").map(str::to_owned))
        .context("create-tenant printed no key")?;
    step("starting the API and two workers");
    let spawn = |name: &'static str, args: &[&str]| -> anyhow::Result<Proc> {
        let child = Command::new(binary(name))
            .args(args)
            .envs(env.clone())
            .stdin(Stdio::null())
            .spawn()?;
        Ok(Proc(name, child))
    };
    let mut api = spawn("agentfleet-api", &["serve"])?;
    let mut workers = vec![
        spawn("agentfleet-worker", &[])?,
        spawn("agentfleet-worker", &[])?,
    ];
    let base = format!("http://127.0.0.1:{api_port}");
    let http = reqwest::Client::new();
    wait_for("the API to be ready", Duration::from_secs(30), || {
        let http = http.clone();
        let url = format!("{base}/readyz");
        async move {
            http.get(url)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        }
    })
    .await;

    let echo = json!({"name": "lookup", "description": "Looks a word up", "kind": "http",
        "url": tools.url("/echo"), "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}});
    let pay = json!({"name": "pay", "description": "Sends money", "kind": "http", "risk": "high",
        "url": tools.url("/side-effect"), "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}});
    let agent = |tools: Value| json!({"model": "demo", "system_prompt": "You are a demo agent.", "tools": tools});
    let post = |path: String, body: Value| {
        let http = http.clone();
        let key = key.clone();
        async move {
            let resp = http.post(path).bearer_auth(key).json(&body).send().await?;
            let status = resp.status();
            let v: Value = resp.json().await?;
            anyhow::ensure!(status.is_success(), "{status}: {v}");
            Ok::<Value, anyhow::Error>(v)
        }
    };

    step("registering a webhook for paused confirmations and finished batches");
    let endpoint = post(
        format!("{base}/v1/webhooks"),
        json!({"url": hooks.url(), "events": ["run.waiting_for_confirmation", "batch.completed"],
               "description": "the demo's receiver"}),
    )
    .await?;
    hooks.trust(
        endpoint["secret"]
            .as_str()
            .context("the secret, shown once")?,
    );
    println!(
        "  endpoint {} -> {} ({})",
        endpoint["id"], endpoint["url"], endpoint["events"]
    );

    step("submitting runs");
    let plain = post(
        format!("{base}/v1/runs"),
        json!({"input": "Say hello", "agent": agent(json!([]))}),
    )
    .await?;
    let with_tool = post(
        format!("{base}/v1/runs"),
        json!({"input": script(json!([
            {"content": "Let me look that up.", "tool_calls": [{"name": "lookup", "arguments": {"word": "fleet"}}]},
            {"content": "A fleet is a group of ships working together.", "chunks": 6}])),
            "agent": agent(json!([echo]))}),
    )
    .await?;
    let asking = post(
        format!("{base}/v1/runs"),
        json!({"input": script(json!([
            {"tool_calls": [{"name": "ask", "arguments": {"text": "Which city?"}}]},
            {"content": "Paris it is."}])), "agent": agent(json!([]))}),
    )
    .await?;
    let confirming = post(
        format!("{base}/v1/runs"),
        json!({"input": script(json!([
            {"tool_calls": [{"name": "pay", "arguments": {"amount": 42}}]},
            {"content": "Paid 42."}])), "agent": agent(json!([pay]))}),
    )
    .await?;
    for run in [&plain, &with_tool, &asking, &confirming] {
        println!(
            "  run {} on thread {}: {}",
            run["id"], run["thread_id"], run["status"]
        );
    }

    step("the event stream of the run with a tool call");
    print_stream(&http, &base, &key, with_tool["id"].as_str().unwrap(), 0).await?;

    step("answering the question");
    let ask_id = asking["id"].as_str().unwrap();
    let seen = print_stream(&http, &base, &key, ask_id, 0).await?;
    post(
        format!("{base}/v1/runs/{ask_id}/resume"),
        json!({"input": "Paris"}),
    )
    .await?;
    print_stream(&http, &base, &key, ask_id, seen).await?;

    step("approving the payment");
    let pay_id = confirming["id"].as_str().unwrap();
    let seen = print_stream(&http, &base, &key, pay_id, 0).await?;
    let run: Value = http
        .get(format!("{base}/v1/runs/{pay_id}"))
        .bearer_auth(&key)
        .send()
        .await?
        .json()
        .await?;
    let call_id = run["pending"]["tool_calls"][0]["tool_call_id"].clone();
    println!("  pending: {}", run["pending"]);
    post(
        format!("{base}/v1/runs/{pay_id}/resume"),
        json!({"decisions": [{"tool_call_id": call_id, "approve": true}]}),
    )
    .await?;
    print_stream(&http, &base, &key, pay_id, seen).await?;

    step("final states");
    for id in [
        &plain["id"],
        &with_tool["id"],
        &asking["id"],
        &confirming["id"],
    ] {
        let id = id.as_str().unwrap();
        let run = wait_for("the run to finish", Duration::from_secs(30), || {
            let http = http.clone();
            let url = format!("{base}/v1/runs/{id}");
            let key = key.clone();
            async move {
                let v: Value = http
                    .get(url)
                    .bearer_auth(key)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                matches!(v["status"].as_str(), Some("completed" | "failed")).then_some(v)
            }
        })
        .await;
        println!(
            "  run {id}: {} after {} iteration(s)",
            run["status"], run["iteration"]
        );
    }
    println!("  the tool server saw {} call(s)", tools.calls().len());

    step("a small batch, submitted with agentfleetctl submit --wait");
    let dir = std::env::temp_dir().join(format!("agentfleet-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("batch.jsonl");
    let lines: Vec<String> = ["Paris", "Lima", "Oslo"]
        .iter()
        .map(|city| {
            json!({"custom_id": format!("city-{}", city.to_lowercase()),
                   "input": script(json!([{"content": format!("{city} is a capital.")}])),
                   "agent": agent(json!([]))})
            .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n")?;
    println!("  $ agentfleetctl submit {} --wait", file.display());
    let status = Command::new(binary("agentfleetctl"))
        .arg("submit")
        .arg(&file)
        .arg("--wait")
        .env("AGENTFLEET_API", &base)
        .env("AGENTFLEET_KEY", &key)
        .status()?;
    std::fs::remove_dir_all(&dir)?;
    if !status.success() {
        bail!("agentfleetctl submit exited with {status}");
    }

    step("the webhooks that arrived");
    wait_for(
        "the batch.completed webhook",
        Duration::from_secs(30),
        || async {
            hooks
                .got()
                .iter()
                .any(|h| h.body["type"] == "batch.completed")
                .then_some(())
        },
    )
    .await;
    for h in hooks.got() {
        println!(
            "  {} {:<30} signature {} data.status={}",
            h.id,
            h.body["type"].as_str().unwrap_or(""),
            if h.signed { "valid" } else { "INVALID" },
            h.body["data"]["status"]
        );
    }
    if hooks.got().iter().any(|h| !h.signed) {
        bail!("a webhook arrived with a signature that does not check out");
    }

    step("shutting down (SIGTERM: workers drain, then exit)");
    for w in &mut workers {
        let code = w.term()?;
        println!("  {} exited with {code}", w.0);
    }
    let code = api.term()?;
    println!("  {} exited with {code}", api.0);
    println!("\ndemo finished");
    Ok(())
}

fn step(s: &str) {
    println!("\n== {s}");
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Prints a run's events after `after` until the stream ends; returns the last id.
async fn print_stream(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    run: &str,
    after: u64,
) -> anyhow::Result<u64> {
    let resp = http
        .get(format!("{base}/v1/runs/{run}/events"))
        .bearer_auth(key)
        .header("Last-Event-ID", after.to_string())
        .send()
        .await?;
    let mut stream = resp.bytes_stream().eventsource();
    let mut last = after;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), stream.next()).await? {
        let ev = ev?;
        if ev.data.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&ev.data)?;
        last = v["id"].as_u64().unwrap_or(last);
        println!(
            "  {:>3} {:<22} {}",
            v["id"],
            v["type"].as_str().unwrap_or(""),
            v["data"]
        );
    }
    Ok(last)
}
