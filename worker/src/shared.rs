//! What every run task of a worker shares.

use std::sync::Arc;

use agentfleet_shared::config::Settings;
use agentfleet_shared::egress::EgressPolicy;
use agentfleet_shared::events::EventBus;
use agentfleet_shared::queue::Publisher;
use sqlx::PgPool;

use crate::control::Registry;

pub struct Shared {
    pub pool: PgPool,
    pub bus: EventBus,
    pub publisher: Publisher,
    pub settings: Arc<Settings>,
    /// For model calls (the operator's gateway).
    pub http: reqwest::Client,
    /// For tool calls: held to the egress policy.
    pub tools_http: reqwest::Client,
    pub egress: Arc<EgressPolicy>,
    /// Names this worker in leases and events.
    pub worker_id: String,
    /// Runs executing here, by id: where cancel hints and the drain deadline are delivered.
    pub active: Registry,
}
