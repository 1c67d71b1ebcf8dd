//! Combined chaos: runs are submitted and executed while workers are killed with `kill -9`
//! every few seconds (a supervisor restarts them, as a Deployment would) and RabbitMQ,
//! Postgres and Redis each restart once. Then every run must have completed, every side effect
//! must have happened once (by idempotency key), and every run's stream must be consistent
//! (ids strictly increasing; a jump only onto a `stream_rebuilt`) and end with its terminal
//! event. The schedule is fixed, so two runs of this test inflict the same faults. A run
//! taken over too often by the kills is quarantined (run alone in a worker), not failed: the
//! report counts those, which completed like the others.
//!
//! The same chaos runs against the clusters of `scripts/redis-cluster` and
//! `scripts/rabbitmq-cluster`, where a server's restart is a node's crash: the RabbitMQ node
//! leading the runs queue and a Redis primary are killed (SIGKILL) and started again later.
//!
//! `#[ignore]`d like the outage tests (they restart the shared servers): `scripts/test` runs
//! the first in its serial phase and the second in its cluster phase.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const RUNS: usize = 120;
const WORKERS: usize = 2;
const SETTLE: Duration = Duration::from_secs(240);

/// What the test inflicts, at which second of the chaos.
#[derive(Debug, Clone, Copy)]
enum Fault {
    RabbitMqDown,
    RabbitMqUp,
    PostgresDown,
    PostgresUp,
    /// One server: a restart without persistence. A cluster: a primary killed.
    RedisDown,
    /// A cluster: the killed node started again (it rejoins as a replica).
    RedisUp,
}

const SCHEDULE: [(u64, Fault); 6] = [
    (4, Fault::RabbitMqDown),
    (7, Fault::RabbitMqUp),
    (12, Fault::PostgresDown),
    (15, Fault::PostgresUp),
    (20, Fault::RedisDown),
    (24, Fault::RedisUp),
];
/// Seconds of chaos; a worker is killed every `KILL_EVERY` of them.
const CHAOS_SECS: u64 = 26;
const KILL_EVERY: Duration = Duration::from_millis(2500);

/// The servers the chaos strikes: the shared ones, or nodes of the clusters.
enum Servers {
    Shared,
    Clusters {
        /// The runs queue, whose leader node is killed.
        queue: String,
        /// The RabbitMQ node killed, once it is.
        rabbit_down: Option<u8>,
    },
}

impl Servers {
    async fn inflict(&mut self, fault: Fault) {
        match (self, fault) {
            (_, Fault::PostgresDown) => servers::postgres_stop(),
            (_, Fault::PostgresUp) => servers::postgres_start().await,
            (Servers::Shared, Fault::RabbitMqDown) => servers::rabbitmq_stop(),
            (Servers::Shared, Fault::RabbitMqUp) => servers::rabbitmq_start().await,
            (Servers::Shared, Fault::RedisDown) => servers::redis_restart().await,
            (Servers::Shared, Fault::RedisUp) => {}
            (Servers::Clusters { queue, rabbit_down }, Fault::RabbitMqDown) => {
                let mut leader = None;
                for ask in 1..=3 {
                    leader = servers::rabbitmq_cluster::leader(ask, queue).await;
                    if leader.is_some() {
                        break;
                    }
                }
                let leader = leader.expect("the runs queue has a leader");
                servers::rabbitmq_cluster::kill(leader).await;
                *rabbit_down = Some(leader);
            }
            (Servers::Clusters { rabbit_down, .. }, Fault::RabbitMqUp) => {
                if let Some(n) = rabbit_down.take() {
                    let started = tokio::task::spawn_blocking(move || {
                        servers::rabbitmq_cluster::start_blocking(n)
                    })
                    .await
                    .expect("the start's thread");
                    assert!(started, "RabbitMQ node {n} started again");
                }
            }
            (Servers::Clusters { .. }, Fault::RedisDown) => {
                let seed = redis_seed_port();
                let primary = *servers::redis_cluster::primaries(seed)
                    .await
                    .first()
                    .expect("a Redis primary");
                servers::redis_cluster::kill(primary).await;
            }
            (Servers::Clusters { .. }, Fault::RedisUp) => servers::redis_cluster::start().await,
        }
    }

    /// Whatever is still down comes back (the test ends with every server whole).
    async fn restore(&mut self) {
        if let Servers::Clusters { .. } = self {
            self.inflict(Fault::RabbitMqUp).await;
            servers::redis_cluster::start().await;
        }
    }
}

/// The port of the first of `AGENTFLEET_TEST_REDIS_CLUSTER`'s nodes that answers.
fn redis_seed_port() -> u16 {
    redis_cluster_nodes()
        .expect("AGENTFLEET_TEST_REDIS_CLUSTER")
        .split(',')
        .filter_map(|url| {
            url.trim()
                .trim_end_matches('/')
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        })
        .find(|port: &u16| std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok())
        .expect("a live Redis node")
}

/// Submits `total` runs, retrying what the API cannot take now (503, connection refused) as
/// a client would; returns the accepted ids as they come.
fn submit(base: String, key: String, body: Value, total: usize) -> Arc<Mutex<Vec<String>>> {
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let acc = accepted.clone();
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        while acc.lock().unwrap().len() < total {
            let resp = http
                .post(format!("{base}/v1/runs"))
                .bearer_auth(&key)
                .json(&body)
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            match resp {
                Ok(r) if r.status() == 202 => {
                    let v: Value = r.json().await.unwrap();
                    acc.lock()
                        .unwrap()
                        .push(v["id"].as_str().unwrap().to_owned());
                }
                Ok(r) if r.status() == 503 => {}
                Ok(r) => panic!("unexpected answer {}", r.status()),
                Err(_) => {}
            }
            // Paced so submissions span the whole chaos.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    accepted
}

#[derive(Debug, Default)]
struct Report {
    runs: usize,
    lost: Vec<String>,
    duplicate_effects: Vec<String>,
    stuck: Vec<String>,
    streams_without_end: Vec<String>,
    streams_with_bad_ids: Vec<String>,
    /// Runs that ran alone in quarantine (taken over past `worker.max_recoveries`).
    quarantined: usize,
}

impl Report {
    fn line(&self) -> String {
        format!(
            "chaos: {} runs, {} lost, {} duplicate tool calls, {} stuck, {} streams without a terminal event, {} streams with a repeated or missing id, {} quarantined",
            self.runs,
            self.lost.len(),
            self.duplicate_effects.len(),
            self.stuck.len(),
            self.streams_without_end.len(),
            self.streams_with_bad_ids.len(),
            self.quarantined
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared servers: scripts/test runs it alone, after the parallel phase"]
async fn kill_9_and_server_restarts_together_lose_nothing() {
    let env = TestEnv::with(&[("database.connect_timeout_ms", "1000")]).await;
    chaos(env, Servers::Shared).await;
}

/// The chaos against a Redis Cluster and a RabbitMQ cluster (`AGENTFLEET_TEST_REDIS_CLUSTER`,
/// `AGENTFLEET_TEST_AMQP_CLUSTER_URLS`): nodes crash where the shared servers restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills nodes of the shared clusters: the cluster phase of scripts/test"]
async fn on_clusters_kill_9_and_node_losses_together_lose_nothing() {
    assert!(
        redis_cluster_nodes().is_some(),
        "needs a Redis Cluster: AGENTFLEET_TEST_REDIS_CLUSTER (scripts/test sets it)"
    );
    let urls = amqp_cluster_urls();
    let env = TestEnv::with(&[
        ("database.connect_timeout_ms", "1000"),
        ("amqp.url", urls.as_str()),
    ])
    .await;
    let queue = format!("{}.runs", env.prefix);
    chaos(
        env,
        Servers::Clusters {
            queue,
            rabbit_down: None,
        },
    )
    .await;
}

async fn chaos(env: TestEnv, mut servers: Servers) {
    let (_api, base) = env.spawn_api_process(&[]).await;
    let key = agentfleet_shared::store::tenants::create(&env.pool, "chaos")
        .await
        .unwrap()
        .api_key;
    let body = scripted_run(
        json!([{"content": "step one", "tool_calls": [{"name": "effect", "arguments": {}}], "delay_ms": 100},
               {"content": "step two", "chunks": 4, "chunk_delay_ms": 30}]),
        json!([http_tool(&env, "effect", "/side-effect")]),
    );
    let workers: Arc<Mutex<Vec<ChildProcess>>> = Arc::new(Mutex::new(
        (0..WORKERS)
            .map(|_| env.spawn_worker_process(&[]))
            .collect(),
    ));
    let accepted = submit(base.clone(), key.clone(), body, RUNS);

    // The supervisor: restarts exited workers; kills one every KILL_EVERY during the chaos.
    let start = tokio::time::Instant::now();
    let mut next_kill = start + KILL_EVERY;
    let mut kills = 0usize;
    let mut schedule = SCHEDULE.iter().peekable();
    while start.elapsed() < Duration::from_secs(CHAOS_SECS) {
        if let Some((at, fault)) = schedule.peek()
            && start.elapsed() >= Duration::from_secs(*at)
        {
            servers.inflict(*fault).await;
            schedule.next();
        }
        {
            let mut ws = workers.lock().unwrap();
            if tokio::time::Instant::now() >= next_kill {
                let victim = kills % WORKERS;
                ws[victim].kill();
                kills += 1;
                next_kill += KILL_EVERY;
            }
            for w in ws.iter_mut() {
                if w.has_exited() {
                    *w = env.spawn_worker_process(&[]);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (_, fault) in schedule {
        servers.inflict(*fault).await;
    }
    servers.restore().await;
    // Keep the fleet alive from here on (a worker that gave up while a server was away, or
    // was killed last, comes back), as the Deployment would.
    let tend = || {
        let mut ws = workers.lock().unwrap();
        for w in ws.iter_mut() {
            if w.has_exited() {
                *w = env.spawn_worker_process(&[]);
            }
        }
    };
    wait_for("every run to be accepted", SETTLE, || {
        tend();
        let done = accepted.lock().unwrap().len() >= RUNS;
        async move { done.then_some(()) }
    })
    .await;
    let ids = accepted.lock().unwrap().clone();

    // Check through an API in this process (fresh pools, after every fault).
    let mut app = env.spawn_api().await;
    app.api_key = key;
    let mut report = Report {
        runs: ids.len(),
        ..Report::default()
    };
    let deadline = tokio::time::Instant::now() + SETTLE;
    for id in &ids {
        let status = loop {
            let run = app.run(id).await;
            let status = run["status"].as_str().unwrap_or("").to_owned();
            if ["completed", "failed", "cancelled"].contains(&status.as_str())
                || tokio::time::Instant::now() >= deadline
            {
                break status;
            }
            tend();
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        match status.as_str() {
            "completed" => {}
            "failed" | "cancelled" => report.lost.push(format!("{id}: {status}")),
            _ => report.stuck.push(format!("{id}: {status}")),
        }
        let events = app
            .events_as(id, 0, Duration::from_secs(30), &app.api_key)
            .await
            .unwrap_or_default();
        if events.last().map(|e| e["type"].clone()) != Some(json!("run_completed")) {
            report
                .streams_without_end
                .push(format!("{id}: {:?}", types(&events)));
        }
        let mut last = 0u64;
        for e in &events {
            let n = e["id"].as_u64().unwrap_or(0);
            let jump_ok = n == last + 1 || (n > last && e["type"] == "stream_rebuilt");
            if !jump_ok {
                report
                    .streams_with_bad_ids
                    .push(format!("{id}: {last} then {n} ({})", e["type"]));
                break;
            }
            last = n;
        }
    }
    // Side effects: each run's one tool call happened once, under one idempotency key.
    let mut keys: HashMap<String, HashSet<String>> = HashMap::new();
    for call in env.tools.state().calls_to("/side-effect") {
        let key = call.idempotency_key.unwrap_or_default();
        let run = key.split(':').next().unwrap_or("").to_owned();
        keys.entry(run).or_default().insert(key);
    }
    for id in &ids {
        let n = keys.get(id).map_or(0, HashSet::len);
        if n > 1 {
            report
                .duplicate_effects
                .push(format!("{id}: {n} distinct keys"));
        }
    }
    let (quarantined,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM runs WHERE id::text = ANY($1) AND quarantined_at IS NOT NULL",
    )
    .bind(&ids)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    report.quarantined = quarantined as usize;
    println!("{} (kills: {kills})", report.line());
    assert!(
        report.lost.is_empty()
            && report.duplicate_effects.is_empty()
            && report.stuck.is_empty()
            && report.streams_without_end.is_empty()
            && report.streams_with_bad_ids.is_empty(),
        "{}\n{report:#?}",
        report.line()
    );
    assert!(kills >= 8, "the chaos killed workers ({kills})");
}
