//! Stopping and starting the shared servers, for the tests that restart them (outages and
//! chaos, which `scripts/test` runs alone). Each start returns once the server answers. They
//! need root, as CI has.

use std::process::Command;
use std::time::Duration;

use super::wait::wait_for;

/// How long a restarted server may take to answer.
const BACK_WITHIN: Duration = Duration::from_secs(120);

const PG: &str =
    "pg_ctlcluster --skip-systemctl-redirect $(pg_lsclusters -h | awk 'NR==1{print $1}') main";

fn sh(cmd: &str) -> bool {
    Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

async fn until(what: &str, cmd: &'static str) {
    wait_for(what, BACK_WITHIN, || async move { sh(cmd).then_some(()) }).await;
}

pub fn rabbitmq_stop() {
    assert!(sh("rabbitmqctl -q stop_app"), "rabbitmqctl stop_app");
}

pub async fn rabbitmq_start() {
    assert!(sh("rabbitmqctl -q start_app"), "rabbitmqctl start_app");
    until("RabbitMQ back", "rabbitmqctl -q await_startup").await;
}

pub fn postgres_stop() {
    assert!(sh(&format!("{PG} stop -m fast")), "pg_ctlcluster stop");
}

pub async fn postgres_start() {
    assert!(sh(&format!("{PG} start")), "pg_ctlcluster start");
    until("Postgres back", "pg_isready -q -h 127.0.0.1").await;
}

/// A restart without persistence: Redis comes back empty, as after a crash.
pub async fn redis_restart() {
    assert!(sh("redis-cli -h 127.0.0.1 shutdown nosave || true"));
    assert!(
        sh(
            "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no --dir /tmp --logfile /tmp/redis-agentfleet-test.log"
        ),
        "redis-server"
    );
    until("Redis back", "redis-cli -h 127.0.0.1 ping | grep -q PONG").await;
}

/// The three-node cluster of `scripts/rabbitmq-cluster` (the tests that lose a broker node).
/// Asynchronous: each `rabbitmqctl` takes about a second, which must not hold a runtime thread.
pub mod rabbitmq_cluster {
    fn script() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/rabbitmq-cluster")
    }

    async fn run(args: &[&str]) -> (bool, String) {
        let out = tokio::process::Command::new(script())
            .args(args)
            .output()
            .await
            .expect("scripts/rabbitmq-cluster runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// `afrabbitN@localhost`.
    pub fn node_name(n: u8) -> String {
        format!("afrabbit{n}@localhost")
    }

    /// The AMQP port of node `n`.
    pub fn amqp_port(n: u8) -> u16 {
        5680 + u16::from(n)
    }

    /// The node (1..3) that leads quorum queue `queue`, as node `ask` sees it.
    pub async fn leader(ask: u8, queue: &str) -> Option<u8> {
        let (ok, out) = run(&[
            "ctl",
            &ask.to_string(),
            "-q",
            "list_queues",
            "--no-table-headers",
            "name",
            "leader",
        ])
        .await;
        if !ok {
            return None;
        }
        let node = out.lines().find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next() == Some(queue)).then(|| cols.next().map(str::to_owned))?
        })?;
        (1..=3).find(|&n| node == node_name(n))
    }

    /// The cluster's AMQP connections, as node `ask` lists them: the AMQP port each is on
    /// (that is, its node) and its client properties as JSON text (which hold the name the
    /// client gave it).
    pub async fn connections(ask: u8) -> Vec<(u16, String)> {
        let (ok, out) = run(&[
            "ctl",
            &ask.to_string(),
            "-q",
            "list_connections",
            "name",
            "client_properties",
            "--formatter",
            "json",
        ])
        .await;
        assert!(ok, "list_connections on node {ask}");
        let listed: Vec<serde_json::Value> =
            serde_json::from_str(out.trim()).expect("list_connections gives JSON");
        listed
            .iter()
            .filter_map(|c| {
                // "127.0.0.1:51234 -> 127.0.0.1:5682"
                let name = c["name"].as_str()?;
                let port = name.rsplit_once(':')?.1.parse().ok()?;
                Some((port, c["client_properties"].to_string()))
            })
            .collect()
    }

    /// A crash of node `n`: its Erlang VM killed with SIGKILL.
    pub async fn kill(n: u8) {
        let (ok, out) = run(&["kill", &n.to_string()]).await;
        assert!(ok, "scripts/rabbitmq-cluster kill {n}: {out}");
    }

    /// Starts node `n` again; returns once it takes connections. Blocking, for a `Drop`.
    pub fn start_blocking(n: u8) -> bool {
        std::process::Command::new(script())
            .args(["start", &n.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// The cluster of `scripts/redis-cluster` (the tests that lose a Redis node).
pub mod redis_cluster {
    fn script() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/redis-cluster")
    }

    /// The ports of the primaries, as the node on `seed` sees the cluster now.
    pub async fn primaries(seed: u16) -> Vec<u16> {
        let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{seed}")) else {
            return Vec::new();
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return Vec::new();
        };
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        // `<id> <ip:port@bus> <flags> …`: a live primary's flags hold `master`, not `fail`.
        nodes
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ');
                let address = fields.nth(1)?;
                let flags = fields.next()?;
                (flags.contains("master") && !flags.contains("fail"))
                    .then(|| {
                        address
                            .split(['@'])
                            .next()?
                            .rsplit(':')
                            .next()?
                            .parse()
                            .ok()
                    })
                    .flatten()
            })
            .collect()
    }

    /// A crash of the node on `port` (SIGKILL); its replica takes over.
    pub async fn kill(port: u16) {
        let status = tokio::process::Command::new(script())
            .args(["kill", &port.to_string()])
            .status()
            .await
            .expect("scripts/redis-cluster runs");
        assert!(status.success(), "scripts/redis-cluster kill {port}");
    }

    /// Starts every stopped node again; returns once the cluster is whole and answers.
    pub async fn start() {
        let status = tokio::process::Command::new(script())
            .arg("start")
            .status()
            .await
            .expect("scripts/redis-cluster runs");
        assert!(status.success(), "scripts/redis-cluster start");
    }
}
