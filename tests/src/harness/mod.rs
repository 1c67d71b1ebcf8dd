//! Test harness: every test gets its own database, Redis key prefix and RabbitMQ queue names,
//! so tests run in parallel against the same real servers. Waiting is always polling with a
//! deadline, never a fixed sleep.
//!
//! - `env`: `TestEnv`, the isolated environment and its settings, removed on drop
//! - `process`: spawning the API and workers, in process or as OS processes
//! - `app`: `TestApp`, HTTP calls to a running API
//! - `watch`: `Watcher`, a run's event stream followed in the background
//! - `wait`: `wait_for` and `wait_until`, polling with a deadline
//! - `bodies`: request bodies and assertions on events
//! - `servers`: stopping and starting the shared servers (outage and chaos tests)

mod app;
mod bodies;
mod env;
mod process;
pub mod servers;
mod wait;
mod watch;

pub use app::TestApp;
pub use bodies::{
    agent, assert_gap_free, complete_call, http_tool, plan_call, planner_run, scripted_run, types,
};
pub use env::{
    TURN_WRITE_SQL, TestEnv, WEBHOOK_KEY, admin_database_url, amqp_cluster_urls, amqp_url,
    redis_cluster_nodes, redis_connection, redis_url, skipped_on_a_redis_cluster,
};
pub use process::{ChildProcess, InProcessWorker, api_cli, binary, free_address, scrape_metrics};
pub use wait::{wait_for, wait_until};
pub use watch::Watcher;
