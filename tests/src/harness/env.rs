//! `TestEnv`: one test's own database, Redis key prefix and RabbitMQ names, the settings that
//! point at them, and their removal when it is dropped.

use std::time::Duration;

use sqlx::{Connection, PgPool};
use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::store::tenants;

use crate::mock_llm::MockLlm;
use crate::tool_server::ToolServer;

/// A fragment of the grouped turn write's text within its first kilobyte (what
/// `pg_stat_activity` keeps), for [`TestEnv::wait_for_lock_waiter`].
/// The webhook sealing key of every test environment (`webhooks.encryption_key`).
pub const WEBHOOK_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

pub const TURN_WRITE_SQL: &str = "prompt_tokens = r.prompt_tokens + t.prompt_tokens";

pub fn admin_database_url() -> String {
    std::env::var("AGENTFLEET_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}
pub fn redis_url() -> String {
    std::env::var("AGENTFLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}
/// The seed nodes of the Redis Cluster the fleet under test uses instead of `redis_url()`
/// (`AGENTFLEET_TEST_REDIS_CLUSTER`, as `redis.cluster_nodes`; `scripts/redis-cluster nodes`
/// prints them). Unset: one server.
pub fn redis_cluster_nodes() -> Option<String> {
    std::env::var("AGENTFLEET_TEST_REDIS_CLUSTER")
        .ok()
        .filter(|nodes| !nodes.trim().is_empty())
}

/// Whether a test that puts a proxy in front of the one Redis server (`redis.url`) must stand
/// aside: the suite runs against a cluster (the test runs in the suite's single-server pass).
pub fn skipped_on_a_redis_cluster(test: &str) -> bool {
    let cluster = redis_cluster_nodes().is_some();
    if cluster {
        eprintln!("{test}: proxies the single Redis server; run without a cluster");
    }
    cluster
}

/// A connection to the Redis the fleet under test uses: the cluster when there is one.
pub fn redis_connection() -> agentfleet_shared::events::RedisConnection {
    let settings = Settings::load_with(None, redis_overrides(), false).expect("test settings");
    agentfleet_shared::events::redis_connection(&settings.redis).expect("a Redis connection")
}

fn redis_overrides() -> Vec<(String, String)> {
    let mut overrides = vec![("redis.url".to_owned(), redis_url())];
    if let Some(nodes) = redis_cluster_nodes() {
        overrides.push(("redis.cluster_nodes".to_owned(), nodes));
    }
    overrides
}

pub fn amqp_url() -> String {
    std::env::var("AGENTFLEET_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The `amqp.url` of the three-node cluster that `scripts/services --rabbitmq-cluster` starts
/// (`scripts/rabbitmq-cluster urls`), for the tests that lose a broker node; `scripts/test`
/// sets it for its second phase. Unset, such a test fails saying so rather than pass.
pub fn amqp_cluster_urls() -> String {
    std::env::var("AGENTFLEET_TEST_AMQP_CLUSTER_URLS").unwrap_or_else(|_| {
        panic!(
            "AGENTFLEET_TEST_AMQP_CLUSTER_URLS is not set: start the cluster with \
             `scripts/services --rabbitmq-cluster` and set it to `scripts/rabbitmq-cluster urls` \
             (scripts/test does both)"
        )
    })
}

/// One isolated environment: database, prefixes, scripted LLM and tool server.
pub struct TestEnv {
    pub id: String,
    pub database_url: String,
    pub db_name: String,
    pub prefix: String,
    /// The broker its settings name (`amqp.url`): where its queues are looked at and removed.
    pub amqp_url: String,
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
        let defaults = Settings::load_with(None, Vec::<(String, String)>::new(), false)
            .expect("the default settings are valid");
        agentfleet_shared::db::migrate(&pool, &defaults.database)
            .await
            .expect("migrations apply");
        let llm = MockLlm::start().await.expect("mock llm starts");
        let tools = ToolServer::start().await.expect("tool server starts");
        let prefix = format!("aft{id}");
        let amqp_url = overrides
            .iter()
            .rev()
            .find(|(k, _)| *k == "amqp.url")
            .map_or_else(amqp_url, |(_, v)| v.to_string());
        let mut env = TestEnv {
            id,
            database_url,
            db_name,
            prefix,
            amqp_url,
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
            (
                "redis.cluster_nodes",
                redis_cluster_nodes().unwrap_or_default(),
            ),
            ("redis.prefix", self.prefix.clone()),
            ("amqp.url", self.amqp_url.clone()),
            ("amqp.prefix", self.prefix.clone()),
            ("api.listen", "127.0.0.1:0".into()),
            // The admin API on the public listener, where the tests (and API processes, whose
            // ports they choose) reach it; `admin.rs` tests the listener of its own.
            ("api.admin_listen", String::new()),
            ("models.mock.base_url", self.llm.base_url()),
            ("models.mock.model", "mock-1".into()),
            // The tool server is on loopback, which the egress policy refuses unless listed:
            // exactly its address is opened, as an operator would open an internal tool.
            ("egress.allow", self.tools.addr().to_string()),
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
            // Webhook secrets are stored sealed; a deployment without the key registers none.
            ("webhooks.encryption_key", WEBHOOK_KEY.into()),
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

    /// A tenant of its own with a key, for isolation tests.
    pub async fn new_tenant_key(&self) -> String {
        tenants::create(&self.pool, "other tenant")
            .await
            .expect("tenant")
            .api_key
    }

    /// The number of messages waiting in a queue of this environment.
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        self.queue_stats(queue).await.0
    }

    /// The messages waiting in a queue of this environment, and its consumers.
    pub async fn queue_stats(&self, queue: &str) -> (u32, u32) {
        let conn = agentfleet_shared::queue::connect(&self.amqp_url, "test-depth")
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
        (q.message_count(), q.consumer_count())
    }

    /// What losing Redis does to this environment's runs (their lists, fences, everything under
    /// its prefix), without touching other tests' keys.
    pub async fn flush_redis_keys(&self) {
        delete_redis_keys(&self.prefix)
            .await
            .expect("deleting the test's Redis keys");
    }

    /// Locks a run's row as an operator's open transaction would (held until the returned
    /// transaction ends; Postgres's idle-in-transaction limit does not end it).
    pub async fn lock_run_row(&self, run_id: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut locker = self.pool.begin().await.expect("begin");
        sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
            .execute(&mut *locker)
            .await
            .expect("no idle limit");
        sqlx::query("SELECT 1 FROM runs WHERE id = $1::uuid FOR UPDATE")
            .bind(run_id)
            .execute(&mut *locker)
            .await
            .expect("the run's row locked");
        locker
    }

    /// Waits until a statement of this test's database whose text holds `fragment` waits on a
    /// lock (the text as `pg_stat_activity` keeps it: its first kilobyte).
    pub async fn wait_for_lock_waiter(&self, what: &str, fragment: &str, timeout: Duration) {
        let pattern = format!("%{fragment}%");
        crate::harness::wait_for(what, timeout, || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE $1",
            )
            .bind(&pattern)
            .fetch_one(&self.pool)
            .await
            .ok()?;
            (n > 0).then_some(())
        })
        .await;
    }

    /// A run's Redis event list as stored (compacted ranges included), a packed finished list
    /// unpacked into its places.
    pub async fn raw_events(&self, run_id: &str) -> Vec<String> {
        let (packed, items) = self.stored_list(run_id).await;
        let packed = packed.unwrap_or_default();
        let rest = items
            .into_iter()
            .skip(packed.len())
            .map(|e| String::from_utf8(e).expect("stored events are UTF-8"));
        packed.into_iter().chain(rest).collect()
    }

    /// Whether a run's list is packed (its first element is a pack of the events before its
    /// last), and its length.
    pub async fn list_is_packed(&self, run_id: &str) -> (bool, usize) {
        let (packed, items) = self.stored_list(run_id).await;
        (packed.is_some(), items.len())
    }

    async fn stored_list(&self, run_id: &str) -> (Option<Vec<String>>, Vec<Vec<u8>>) {
        let mut conn = redis_connection();
        let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(format!("{}:run:{{{run_id}}}:events", self.prefix))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("LRANGE");
        let packed = items
            .first()
            .filter(|e| e.starts_with(b"~z:"))
            .map(|e| agentfleet_shared::events::unpack(e).expect("a pack unpacks"));
        (packed, items)
    }
}

impl Drop for TestEnv {
    /// Removes the database, the queues and the Redis keys; runs on a thread of its own so it
    /// works from a panicking test too.
    fn drop(&mut self) {
        let db = self.db_name.clone();
        let prefix = self.prefix.clone();
        let amqp = self.amqp_url.clone();
        let pool = self.pool.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                // `close` waits for every connection to come back, and it was seen to wait
                // forever after current-thread tests (a connection's return presumably left to
                // the test's runtime, which is blocked in this drop): bounded, and the forced
                // DROP DATABASE below ends whatever is still open.
                let _ = tokio::time::timeout(Duration::from_secs(2), pool.close()).await;
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), delete_redis_keys(&prefix)).await;
                let queues = async {
                    if let Ok(conn) = agentfleet_shared::queue::connect(&amqp, "test-cleanup").await
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
                };
                let _ = tokio::time::timeout(Duration::from_secs(10), queues).await;
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

/// Deletes every Redis key under `prefix:` (on a cluster, `KEYS` asks every primary and each
/// key is deleted on its own node).
async fn delete_redis_keys(prefix: &str) -> redis::RedisResult<()> {
    let mut conn = redis_connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await?;
    for key in keys {
        let _: i64 = redis::cmd("DEL").arg(key).query_async(&mut conn).await?;
    }
    Ok(())
}

/// The same server URL naming database `db`; a query (`?sslmode=...`) is kept.
fn replace_db(url: &str, db: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((url, query)) => (url, format!("?{query}")),
        None => (url, String::new()),
    };
    match url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{db}{query}"),
        None => format!("{url}/{db}{query}"),
    }
}
