//! agentfleet-api: the HTTP API. It validates and records runs, enqueues them, and streams
//! their events; it never runs an agent itself.

pub mod admission;
pub mod announce;
pub mod auth;
pub mod batch_driver;
pub mod console;
pub mod erasure;
pub mod error;
pub mod extract;
pub mod fair_dispatch;
pub mod layers;
pub mod publish;
pub mod quota;
pub mod rate_limit;
pub mod readiness;
pub mod routes;
pub mod schema;
pub mod startup;
pub mod state;
pub mod stream;
pub mod suspension;
pub mod validate;
pub mod webhooks;

pub use startup::Application;
