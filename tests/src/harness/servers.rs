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
