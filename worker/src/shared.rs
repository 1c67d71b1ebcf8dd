//! What every run task of a worker shares.

use std::sync::Arc;

use agentfleet_shared::config::Settings;
use agentfleet_shared::egress::EgressPolicy;
use agentfleet_shared::events::EventBus;
use agentfleet_shared::queue::Publisher;
use agentfleet_shared::store::batch::Batcher;
use agentfleet_shared::store::tool_calls::{self, Outcome};
use agentfleet_shared::store::transitions::{self, Ending};
use agentfleet_shared::store::turns::{self, Turn};
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
    pub writes: Writes,
}

/// The writes every run makes, grouped across this worker's runs (`store::batch`).
pub struct Writes {
    pub turns: Batcher<Turn>,
    pub outcomes: Batcher<Outcome>,
    pub endings: Batcher<Ending>,
}

impl Writes {
    pub fn spawn(pool: &PgPool, settings: &Settings) -> Writes {
        let (n, max) = (
            settings.worker.write_groups_in_flight,
            settings.worker.max_write_group,
        );
        Writes {
            turns: Batcher::spawn(
                pool.clone(),
                n,
                max,
                Arc::new(|pool, items| Box::pin(turns::record_many(pool, items))),
            ),
            outcomes: Batcher::spawn(
                pool.clone(),
                n,
                max,
                Arc::new(|pool, items| Box::pin(tool_calls::finish_many(pool, items))),
            ),
            endings: Batcher::spawn(
                pool.clone(),
                n,
                max,
                Arc::new(|pool, items| Box::pin(transitions::end_many(pool, items))),
            ),
        }
    }
}
