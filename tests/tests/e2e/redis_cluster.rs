//! Against a Redis Cluster (`scripts/redis-cluster`, named by `AGENTFLEET_TEST_REDIS_CLUSTER`):
//! a primary killed under live streams, and a stale holder after a failover. Each kills a
//! node of the shared cluster, so they run one at a time in the cluster phase of
//! `scripts/test` (`#[ignore]`d, and skipped by the single-server outage phase).

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_shared::events::{AppendError, EventBus, EventType, Expiry, Floor, NewEvent};
use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(90);

fn seed_port() -> u16 {
    let nodes = redis_cluster_nodes().expect(
        "these tests need a Redis Cluster: AGENTFLEET_TEST_REDIS_CLUSTER (scripts/test sets it)",
    );
    let first = nodes.split(',').next().expect("a node");
    first
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("redis://host:port")
}

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/redis-cluster")
}

/// A plain connection to one node of the cluster, for `CLUSTER` commands.
async fn node(port: u16) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()
}

/// The port of the primary serving `key`'s slot, as a live node sees the cluster now.
async fn primary_of(key: &str, ask: &[u16]) -> Option<u16> {
    shard_of(key, ask).await.map(|(primary, _)| primary)
}

/// The ports of the primary serving `key`'s slot and of its first replica.
async fn shard_of(key: &str, ask: &[u16]) -> Option<(u16, Option<u16>)> {
    for &port in ask {
        let Some(mut conn) = node(port).await else {
            continue;
        };
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .ok()?;
        // Each entry: [first slot, last slot, [host, port, id, …] of the primary, replicas…].
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<redis::Value>(&mut conn)
            .await
            .ok()
            .and_then(|v| redis_to_json(v).as_array().cloned())?;
        for range in slots {
            let (first, last) = (range[0].as_i64()?, range[1].as_i64()?);
            if (first..=last).contains(&slot) {
                let primary = range[2][1].as_i64()? as u16;
                let replica = range.get(3).and_then(|r| r[1].as_i64()).map(|p| p as u16);
                return Some((primary, replica));
            }
        }
    }
    None
}

/// Stops the node on `port` (`SIGSTOP`: alive, but it answers nothing) until dropped.
struct Frozen(u32);

impl Frozen {
    fn node(port: u16) -> Frozen {
        let pid: u32 = std::fs::read_to_string(cluster_dir().join(format!("{port}/redis.pid")))
            .expect("the node's pid file")
            .trim()
            .parse()
            .expect("a pid");
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {which} {pid}");
}

fn cluster_dir() -> std::path::PathBuf {
    std::env::var("AGENTFLEET_REDIS_CLUSTER_DIR")
        .unwrap_or_else(|_| "/var/lib/agentfleet/redis-cluster".into())
        .into()
}

fn redis_to_json(v: redis::Value) -> Value {
    match v {
        redis::Value::Int(i) => json!(i),
        redis::Value::BulkString(b) => json!(String::from_utf8_lossy(&b)),
        redis::Value::SimpleString(s) => json!(s),
        redis::Value::Array(items) => Value::Array(items.into_iter().map(redis_to_json).collect()),
        _ => Value::Null,
    }
}

const PORTS: [u16; 6] = [7101, 7102, 7103, 7104, 7105, 7106];

/// Kills the node on `port` (a crash: `kill -9`), and brings the cluster back whole when
/// dropped, whatever the test's outcome (the node rejoins as a replica).
struct Killed;

impl Killed {
    fn node(port: u16) -> Killed {
        let status = std::process::Command::new(script())
            .args(["kill", &port.to_string()])
            .status()
            .expect("scripts/redis-cluster");
        assert!(status.success(), "killing node {port}");
        Killed
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = std::process::Command::new(script()).arg("start").status();
    }
}

/// Waits until a node other than `dead` serves `key`'s slot (its replica, promoted).
async fn wait_promoted(key: &str, dead: u16) -> u16 {
    let alive: Vec<u16> = PORTS.iter().copied().filter(|p| *p != dead).collect();
    wait_for(
        "a replica promoted in the dead primary's place",
        T,
        || async { primary_of(key, &alive).await.filter(|p| *p != dead) },
    )
    .await
}

/// Every event once, in order: each id one past the last, except a jump onto a
/// `stream_rebuilt` (docs/events.md: what a stream does when Redis lost events); ends with the
/// run's end.
fn assert_whole(run: &str, events: &[Value]) {
    assert!(!events.is_empty(), "run {run}: no event");
    let mut seen = HashSet::new();
    for pair in events.windows(2) {
        let (a, b) = (
            pair[0]["id"].as_u64().unwrap(),
            pair[1]["id"].as_u64().unwrap(),
        );
        assert!(seen.insert(a), "run {run}: id {a} twice: {events:#?}");
        assert!(
            b == a + 1 || (b > a && pair[1]["type"] == "stream_rebuilt"),
            "run {run}: {a} then {b} ({}): {events:#?}",
            pair[1]["type"]
        );
    }
    assert_eq!(
        events.last().unwrap()["type"],
        "run_completed",
        "run {run}: {events:#?}"
    );
}

/// A primary holding live runs' slots dies mid-stream and its replica takes over: every run
/// completes, and every stream, followed by a client reconnecting with `Last-Event-ID` as a
/// browser does, ends with the run's end without a hole (a `stream_rebuilt` where Redis lost
/// events is the documented answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills a node of the shared Redis Cluster: the cluster phase of scripts/test"]
async fn a_primary_killed_mid_stream_loses_no_run_and_leaves_no_hole() {
    let seed = seed_port();
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    // Three seconds of streaming a run, so the kill falls in the middle.
    let body = scripted_run(
        json!([{"content": "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five twenty-six twenty-seven twenty-eight twenty-nine thirty",
                "chunks": 30, "chunk_delay_ms": 100}]),
        json!([]),
    );
    let mut runs = Vec::new();
    for _ in 0..12 {
        let run = app.start_run(&body).await;
        let id = run["id"].as_str().unwrap().to_owned();
        let watcher = app.watch(&id);
        runs.push((id, watcher));
    }
    // Every stream is live: a delta seen by each client.
    for (_, watcher) in &runs {
        watcher.wait_type("message_delta", T).await;
    }
    let key = format!("{}:run:{{{}}}:events", env.prefix, runs[0].0);
    let dead = primary_of(&key, &[seed]).await.expect("the run's primary");
    let on_dead: Vec<&str> = {
        let mut ids = Vec::new();
        for (id, _) in &runs {
            let key = format!("{}:run:{{{id}}}:events", env.prefix);
            if primary_of(&key, &[seed]).await == Some(dead) {
                ids.push(id.as_str());
            }
        }
        ids
    };
    let _killed = Killed::node(dead);
    wait_promoted(&key, dead).await;
    for (id, watcher) in &runs {
        app.wait_status(id, &["completed"], T).await;
        wait_for("the stream's end", T, || async {
            let events = watcher.snapshot();
            (events.last().map(|e| e["type"] == "run_completed") == Some(true)).then_some(())
        })
        .await;
        assert_whole(id, &watcher.snapshot());
    }
    assert!(
        !on_dead.is_empty(),
        "at least one run lived on the killed primary"
    );
    // Read again from the start after the failover, every stream is whole too.
    for (id, _) in &runs {
        assert_whole(id, &app.events(id, 0, T).await);
    }
}

/// Replication is asynchronous: a failover to a replica that missed a run's newest fence would
/// bring the older one back, and the holder it had fenced out (a worker that lost its lease and
/// has not noticed) could append again. An append that takes the stream over waits for a
/// replica to acknowledge the fence first (`redis.fence_replication_ms`), so after the
/// failover the stale holder is still refused. Here the replica is cut off just before the
/// take-over, so only that wait gets the fence to it before its primary dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills a node of the shared Redis Cluster: the cluster phase of scripts/test"]
async fn after_a_failover_a_stale_holder_is_still_refused() {
    let seed = seed_port();
    let env = TestEnv::new().await;
    // A wait long enough for the replica below to come back (within the answer's bound).
    let settings = env.settings_with(&[
        ("redis.response_timeout_ms", "10000"),
        ("redis.fence_replication_ms", "5000"),
    ]);
    let conn = agentfleet_shared::events::redis_connection(&settings.redis).expect("cluster");
    let bus = EventBus::new(conn, &env.prefix, 600)
        .with_fence_replication(settings.redis.fence_replication());
    let (run_id, thread_id) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let data = json!({"text": "x"});
    let delta = NewEvent {
        run_id,
        thread_id,
        kind: EventType::MessageDelta,
        data: &data,
    };
    // The old holder (attempt 1, token 2), then the new one (attempt 2, token 4).
    bus.append(delta, 2, Floor::Exact(0), Expiry::Persist)
        .await
        .expect("the first holder's append");
    let key = bus.keys().fence(run_id);
    // A node killed by the test before rejoins as a replica: wait until the run's shard has
    // one that is in sync with its primary, the premise of what follows.
    let (dead, replica) = wait_for("the run's shard to have a replica in sync", T, || {
        let key = key.clone();
        async move {
            let (primary, replica) = shard_of(&key, &[seed]).await?;
            let replica = replica?;
            let mut conn = node(replica).await?;
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .ok()?;
            info.contains("master_link_status:up")
                .then_some((primary, replica))
        }
    })
    .await;
    // The replica is cut off (frozen, its link closed) when the new holder takes over, and
    // thaws a second later: only a holder that waits for it gets the new fence onto it before
    // its primary dies.
    let frozen = Frozen::node(replica);
    let mut primary = node(dead).await.expect("the primary");
    let cut: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut primary)
        .await
        .expect("CLIENT KILL TYPE replica");
    assert!(cut >= 1, "the primary had a replica to cut off");
    let thaw = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(frozen);
    });
    bus.append(delta, 4, Floor::Exact(1), Expiry::Persist)
        .await
        .expect("the take-over's append");
    // At once: without the wait, the replica would still be frozen, without the new fence.
    let _killed = Killed::node(dead);
    thaw.await.expect("thawed");
    wait_promoted(&key, dead).await;
    let stale = wait_for("the old holder's append answered", T, || async {
        match bus.append(delta, 2, Floor::Exact(1), Expiry::Persist).await {
            Err(AppendError::Fenced { current, .. }) => Some(Ok(current)),
            Ok(appended) => Some(Err(appended.id)),
            // The cluster's map is still being learnt: asked again.
            Err(_) => None,
        }
    })
    .await;
    assert_eq!(
        stale,
        Ok(4),
        "the stale holder must be refused by the new fence"
    );
}
