//! Test harness: every test gets its own database, Redis key prefix and RabbitMQ queue names,
//! so tests run in parallel against the same real servers. Waiting is always polling with a
//! deadline, never a fixed sleep.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use serde_json::{Value, json};
use sqlx::{Connection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::store::tenants;
use deadpool_redis::redis;

use crate::mock_llm::MockLlm;
use crate::tool_server::ToolServer;

pub fn admin_database_url() -> String {
    std::env::var("AGENTFLEET_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}
pub fn redis_url() -> String {
    std::env::var("AGENTFLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}
pub fn amqp_url() -> String {
    std::env::var("AGENTFLEET_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// One isolated environment: database, prefixes, scripted LLM and tool server.
pub struct TestEnv {
    pub id: String,
    pub database_url: String,
    pub db_name: String,
    pub prefix: String,
    pub pool: PgPool,
    pub llm: MockLlm,
    pub tools: ToolServer,
    overrides: Vec<(String, String)>,
}

impl TestEnv {
    pub async fn new() -> TestEnv {
        Self::with(&[]).await
    }

    /// An environment whose settings carry `overrides` (`section.key`, value).
    pub async fn with(overrides: &[(&str, &str)]) -> TestEnv {
        agentfleet_shared::telemetry::install_crypto();
        let id = Uuid::new_v4().simple().to_string()[..12].to_string();
        let db_name = format!("af_test_{id}");
        let admin = admin_database_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("connect to Postgres (scripts/services starts it)");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let database_url = replace_db(&admin, &db_name);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(3)
            .connect(&database_url)
            .await
            .expect("connect test db");
        agentfleet_shared::db::migrate(&pool)
            .await
            .expect("migrations apply");
        let llm = MockLlm::start().await.expect("mock llm starts");
        let tools = ToolServer::start().await.expect("tool server starts");
        let prefix = format!("aft{id}");
        let mut env = TestEnv {
            id,
            database_url,
            db_name,
            prefix,
            pool,
            llm,
            tools,
            overrides: Vec::new(),
        };
        env.overrides = env.base_overrides();
        for (k, v) in overrides {
            env.overrides.push((k.to_string(), v.to_string()));
        }
        env
    }

    fn base_overrides(&self) -> Vec<(String, String)> {
        [
            ("database.url", self.database_url.clone()),
            // Four tests run at once against one server whose stock `max_connections` is 100:
            // a test's API, worker and harness pools together stay well under a quarter.
            ("database.max_connections", "6".into()),
            ("redis.url", redis_url()),
            ("redis.prefix", self.prefix.clone()),
            ("amqp.url", amqp_url()),
            ("amqp.prefix", self.prefix.clone()),
            ("api.listen", "127.0.0.1:0".into()),
            ("models.mock.base_url", self.llm.base_url()),
            ("models.mock.model", "mock-1".into()),
            ("worker.concurrency", "8".into()),
            ("worker.lease_ms", "3000".into()),
            ("worker.lease_renew_ms", "500".into()),
            ("worker.sweep_interval_ms", "500".into()),
            ("worker.requeue_after_ms", "3000".into()),
            ("worker.drain_grace_ms", "5000".into()),
            ("database.idle_in_transaction_timeout_ms", "1500".into()),
            ("worker.model_retry_base_ms", "20".into()),
            ("worker.model_retry_max_ms", "200".into()),
            ("events.keepalive_secs", "1".into()),
            ("api.stream_token_secret", "test-secret".into()),
            ("telemetry.log_format", "pretty".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    pub fn settings(&self) -> Settings {
        self.settings_with(&[])
    }

    pub fn settings_with(&self, extra: &[(&str, &str)]) -> Settings {
        let mut all = self.overrides.clone();
        all.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Settings::load_with(None, all, false).expect("test settings are valid")
    }

    /// The same settings as environment variables, for child processes.
    pub fn env_vars(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut all = self.overrides.clone();
        all.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        all.into_iter()
            .map(|(k, v)| {
                (
                    format!("AGENTFLEET__{}", k.replace('.', "__").to_uppercase()),
                    v,
                )
            })
            .collect()
    }

    pub async fn spawn_api(&self) -> TestApp {
        self.spawn_api_with(&[]).await
    }

    pub async fn spawn_api_with(&self, extra: &[(&str, &str)]) -> TestApp {
        let app = agentfleet_api::Application::build(self.settings_with(extra))
            .await
            .expect("api builds");
        let port = app.port();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            app.run_until_stopped(async move { s.cancelled().await })
                .await
        });
        let tenant = tenants::create(&self.pool, "test tenant")
            .await
            .expect("tenant");
        TestApp {
            address: format!("http://127.0.0.1:{port}"),
            api_key: tenant.api_key,
            tenant_id: tenant.tenant_id,
            http: reqwest::Client::new(),
            stop,
        }
    }

    /// A worker inside this test process.
    pub async fn spawn_worker(&self) -> InProcessWorker {
        self.spawn_worker_with(&[]).await
    }

    pub async fn spawn_worker_with(&self, extra: &[(&str, &str)]) -> InProcessWorker {
        let worker = agentfleet_worker::Worker::build(self.settings_with(extra))
            .await
            .expect("worker builds");
        let id = worker.id().to_string();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let handle = tokio::spawn(async move {
            worker
                .run_until_stopped(async move { s.cancelled().await })
                .await
        });
        InProcessWorker {
            id,
            stop,
            handle: Some(handle),
        }
    }

    /// A worker as a separate OS process (for kill -9 and multi-process tests).
    pub fn spawn_worker_process(&self, extra: &[(&str, &str)]) -> ChildProcess {
        let bin = binary("agentfleet-worker");
        let mut cmd = Command::new(&bin);
        cmd.envs(self.env_vars(extra))
            .env(
                "RUST_LOG",
                std::env::var("AGENTFLEET_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
        ChildProcess { child: Some(child) }
    }

    /// A tenant of its own with a key, for isolation tests.
    pub async fn new_tenant_key(&self) -> String {
        tenants::create(&self.pool, "other tenant")
            .await
            .expect("tenant")
            .api_key
    }
}

impl Drop for TestEnv {
    /// Removes the database, the queues and the Redis keys; runs on a thread of its own so it
    /// works from a panicking test too.
    fn drop(&mut self) {
        let db = self.db_name.clone();
        let prefix = self.prefix.clone();
        let pool = self.pool.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                pool.close().await;
                let _ = delete_redis_keys(&prefix).await;
                if let Ok(conn) =
                    agentfleet_shared::queue::connect(&amqp_url(), "test-cleanup").await
                    && let Ok(ch) = conn.create_channel().await
                {
                    let t = agentfleet_shared::queue::Topology::new(&prefix);
                    for q in [&t.queue, &t.dead_queue] {
                        let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
                    }
                    for x in [&t.exchange, &t.dead_exchange] {
                        let _ = ch
                            .exchange_delete(x.as_str().into(), Default::default())
                            .await;
                    }
                    let _ = conn.close(200, "cleanup".into()).await;
                }
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_database_url()).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// Deletes every Redis key under `prefix:`.
async fn delete_redis_keys(prefix: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(keys).query_async(&mut conn).await?;
    }
    Ok(())
}

fn replace_db(url: &str, db: &str) -> String {
    match url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{db}"),
        None => format!("{url}/{db}"),
    }
}

/// Path of a workspace binary next to the test executable's directory.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|d| {
            if d.ends_with("deps") {
                d.parent()
            } else {
                Some(d)
            }
        })
        .expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build --bins`; scripts/test does)",
        path.display()
    );
    path
}

pub struct InProcessWorker {
    pub id: String,
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl InProcessWorker {
    /// Drains and waits for it.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            h.await.expect("worker task").expect("worker ran cleanly");
        }
    }
}

impl Drop for InProcessWorker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub struct ChildProcess {
    child: Option<Child>,
}

impl ChildProcess {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{sig} failed");
    }
    /// kill -9, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    /// Waits (polling) for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut().expect("running");
        let status = wait_for("process exit", timeout, || {
            let s = child.try_wait().expect("try_wait");
            async move { s }
        })
        .await;
        self.child = None;
        status.code()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running API with a tenant and its key.
pub struct TestApp {
    pub address: String,
    pub api_key: String,
    pub tenant_id: Uuid,
    pub http: reqwest::Client,
    stop: CancellationToken,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(&self.api_key)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.get_as(path, &self.api_key).await
    }

    pub async fn get_as(&self, path: &str, key: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request")
    }

    /// Starts a run; panics unless 202.
    pub async fn start_run(&self, body: &Value) -> Value {
        let resp = self.post("/v1/runs", body).await;
        let status = resp.status();
        let json: Value = resp.json().await.expect("json");
        assert_eq!(status, 202, "start run: {json}");
        json
    }

    pub async fn run(&self, id: &str) -> Value {
        self.get(&format!("/v1/runs/{id}"))
            .await
            .json()
            .await
            .expect("json")
    }

    /// Polls until the run's status is one of `statuses`.
    pub async fn wait_status(&self, id: &str, statuses: &[&str], timeout: Duration) -> Value {
        wait_for(
            &format!("run {id} to reach {statuses:?}"),
            timeout,
            || async {
                let run = self.run(id).await;
                statuses
                    .contains(&run["status"].as_str().unwrap_or_default())
                    .then_some(run)
            },
        )
        .await
    }

    pub async fn messages(&self, thread: &str) -> Vec<Value> {
        let v: Value = self
            .get(&format!("/v1/threads/{thread}/messages?limit=500"))
            .await
            .json()
            .await
            .expect("json");
        v["data"].as_array().cloned().unwrap_or_default()
    }

    /// Reads the SSE stream from `after` until the server ends it; returns the envelopes.
    pub async fn events(&self, run_id: &str, after: u64, timeout: Duration) -> Vec<Value> {
        self.events_as(run_id, after, timeout, &self.api_key)
            .await
            .expect("event stream")
    }

    pub async fn events_as(
        &self,
        run_id: &str,
        after: u64,
        timeout: Duration,
        key: &str,
    ) -> anyhow::Result<Vec<Value>> {
        let resp = self
            .http
            .get(self.url(&format!("/v1/runs/{run_id}/events")))
            .bearer_auth(key)
            .header("Last-Event-ID", after.to_string())
            .send()
            .await?;
        anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
        let mut stream = resp.bytes_stream().eventsource();
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next())
                .await
                .context("stream did not end in time")?;
            match next {
                None => break,
                Some(Err(e)) => anyhow::bail!("sse error: {e}"),
                Some(Ok(ev)) => {
                    if ev.data.is_empty() {
                        continue;
                    }
                    let v: Value = serde_json::from_str(&ev.data)?;
                    anyhow::ensure!(
                        v["id"].as_u64().map(|i| i.to_string()).as_deref() == Some(ev.id.as_str()),
                        "SSE id {} differs from envelope id {}",
                        ev.id,
                        v["id"]
                    );
                    anyhow::ensure!(
                        ev.event == v["type"].as_str().unwrap_or_default(),
                        "SSE event name differs"
                    );
                    out.push(v);
                }
            }
        }
        Ok(out)
    }
}

use eventsource_stream::Eventsource;

/// An agent spec using the scripted model and `tools`.
pub fn agent(tools: Value) -> Value {
    json!({"model": "mock", "system_prompt": "You are a test agent.", "tools": tools, "max_iterations": 10})
}

/// An http tool definition pointing at the tool server.
pub fn http_tool(env: &TestEnv, name: &str, path: &str) -> Value {
    json!({"name": name, "description": format!("{name} tool"), "kind": "http", "url": env.tools.url(path),
           "parameters": {"type": "object"}})
}

/// A run request whose input carries a model script.
pub fn scripted_run(turns: Value, tools: Value) -> Value {
    json!({"input": crate::mock_llm::script(turns), "agent": agent(tools)})
}

/// Asserts ids are exactly 1..=n in order.
pub fn assert_gap_free(events: &[Value]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e["id"].as_u64(),
            Some(i as u64 + 1),
            "event ids must be 1..n without gaps: {events:#?}"
        );
    }
}

pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Follows a run's stream in the background, so a test can act when an event shows up.
pub struct Watcher {
    events: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watcher {
    pub fn snapshot(&self) -> Vec<Value> {
        self.events.lock().expect("watcher lock").clone()
    }

    /// Waits for the first event of type `kind`.
    pub async fn wait_type(&self, kind: &str, timeout: Duration) -> Value {
        wait_for(&format!("event {kind}"), timeout, || {
            let found = self.snapshot().into_iter().find(|e| e["type"] == kind);
            async move { found }
        })
        .await
    }
}

impl TestApp {
    /// Watches a run's events live, reconnecting with Last-Event-ID whenever the stream ends
    /// (e.g. at a pause), until the watcher is dropped.
    pub fn watch(&self, run_id: &str) -> Watcher {
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
        let sink = events.clone();
        let http = self.http.clone();
        let url = self.url(&format!("/v1/runs/{run_id}/events"));
        let key = self.api_key.clone();
        let task = tokio::spawn(async move {
            loop {
                let last = sink
                    .lock()
                    .expect("watcher lock")
                    .last()
                    .and_then(|e| e["id"].as_u64())
                    .unwrap_or(0);
                let Ok(resp) = http
                    .get(&url)
                    .bearer_auth(&key)
                    .header("Last-Event-ID", last.to_string())
                    .send()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let mut stream = resp.bytes_stream().eventsource();
                while let Some(Ok(ev)) = stream.next().await {
                    if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                        sink.lock().expect("watcher lock").push(v);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Watcher { events, task }
    }
}

impl TestEnv {
    /// The API as a separate OS process; returns it and its base URL.
    pub async fn spawn_api_process(&self, extra_env: &[(&str, &str)]) -> (ChildProcess, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let bin = binary("agentfleet-api");
        let child = Command::new(&bin)
            .arg("serve")
            .envs(self.env_vars(&[("api.listen", &listen)]))
            .envs(
                extra_env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn api");
        let base = format!("http://{listen}");
        let http = reqwest::Client::new();
        wait_for("api process ready", Duration::from_secs(30), || {
            let req = http.get(format!("{base}/readyz")).send();
            async move { req.await.ok().filter(|r| r.status().is_success()) }
        })
        .await;
        (ChildProcess { child: Some(child) }, base)
    }

    /// Spawns a worker process with failpoints enabled.
    pub fn spawn_worker_process_with_failpoints(
        &self,
        extra: &[(&str, &str)],
        failpoints: &str,
    ) -> ChildProcess {
        let bin = binary("agentfleet-worker");
        let child = Command::new(&bin)
            .envs(self.env_vars(extra))
            .env("AGENTFLEET_FAILPOINTS", failpoints)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn worker");
        ChildProcess { child: Some(child) }
    }

    /// The number of messages waiting in a queue of this environment.
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let conn = agentfleet_shared::queue::connect(&amqp_url(), "test-depth")
            .await
            .expect("amqp");
        let ch = conn.create_channel().await.expect("channel");
        let q = ch
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .expect("queue exists");
        let _ = conn.close(200, "done".into()).await;
        q.message_count()
    }
}

impl ChildProcess {
    /// Whether the process has exited (reaping it if so).
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => c.try_wait().ok().flatten().is_some(),
        }
    }
}

impl TestEnv {
    /// What losing Redis does to this environment's runs (their lists, fences, everything under
    /// its prefix), without touching other tests' keys.
    pub async fn flush_redis_keys(&self) {
        delete_redis_keys(&self.prefix)
            .await
            .expect("deleting the test's Redis keys");
    }
}

impl TestEnv {
    /// A run's Redis event list exactly as stored (compacted ranges included).
    pub async fn raw_events(&self, run_id: &str) -> Vec<String> {
        let client = deadpool_redis::redis::Client::open(redis_url()).expect("redis url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        deadpool_redis::redis::cmd("LRANGE")
            .arg(format!("{}:run:{run_id}:events", self.prefix))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("LRANGE")
    }
}
