//! agentfleet-api: the HTTP API. It validates and records runs, enqueues them, and streams
//! their events; it never runs an agent itself.

pub mod announce;
pub mod auth;
pub mod auth_cache;
pub mod auth_invalidation;
pub mod batch_driver;
pub mod console;
pub mod dispatch;
pub mod error;
pub mod extract;
pub mod hub;
pub mod key_usage;
pub mod layers;
pub mod publish;
pub mod quota;
pub mod rate_limit;
pub mod routes;
pub mod startup;
pub mod state;
pub mod stream;
pub mod stream_slots;
pub mod stream_token;
pub mod suspension;
pub mod validate;
pub mod webhook_deliverer;
pub mod webhook_signing;

pub use startup::Application;
