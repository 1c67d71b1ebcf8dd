//! The worker's dependencies: what every run task of a worker shares (pools, clients, caches,
//! the grouped writers).

use std::sync::Arc;

use agentfleet_shared::config::Settings;
use agentfleet_shared::egress::EgressPolicy;
use agentfleet_shared::events::EventBus;
use agentfleet_shared::queue::Publisher;
use agentfleet_shared::store::fair_dispatch;
use agentfleet_shared::store::group_commit::{Batcher, write_fn};
use agentfleet_shared::store::tool_calls::{self, Outcome};
use agentfleet_shared::store::transitions::{self, Claimed, Ending};
use agentfleet_shared::store::turns::{self, Turn};
use sqlx::PgPool;
use uuid::Uuid;

use crate::control::Registry;

pub struct Deps {
    pub pool: PgPool,
    pub bus: EventBus,
    pub publisher: Publisher,
    pub settings: Arc<Settings>,
    /// For model calls (the operator's gateway), spread over connections (`model_http`).
    pub model_http: crate::model_http::ModelClients,
    /// For tool calls: held to the egress policy.
    pub tools_http: reqwest::Client,
    pub egress: Arc<EgressPolicy>,
    /// Opens registered MCP servers' sealed headers (`mcp.encryption_key`).
    pub mcp_key: Option<[u8; 32]>,
    /// MCP servers' tool lists, reused for `mcp.tools_ttl_ms`.
    pub mcp_tools: crate::tools::mcp::ToolCache,
    /// Tool schemas with patterns compiled by this worker's runs, shared by the runs that
    /// give the same one, within `worker.max_compiled_schema_kib`.
    pub schemas: Arc<crate::tools::compiled::Schemas>,
    /// The catalogs of agents with `http` tools only, shared by the holdings of one agent.
    pub catalogs: crate::tools::catalog::Catalogs,
    /// Names this worker in leases and events.
    pub worker_id: String,
    /// Runs executing here, by id: where cancel hints and the drain deadline are delivered.
    pub active: Registry,
    /// The leases this worker renews (`crate::lease`).
    pub leases: crate::lease::Leases,
    pub writes: Writes,
    /// Final iterations' timings, closed once their turn's commit answered: the next turn
    /// this worker writes carries them (statistics; the sweeper's tick writes what no turn
    /// took, and a turn that fails loses them).
    pub late_timings: std::sync::Mutex<Vec<agentfleet_shared::store::turns::IterationTiming>>,
    /// The tenants whose dispatches are running or spaced (`crate::fair_dispatch`).
    pub dispatch_spacing: crate::fair_dispatch::Spacing,
}

/// The writes every run makes, grouped across this worker's runs (`store::group_commit`).
pub struct Writes {
    /// Claims by this worker, with its lease (slots that free up together claim together).
    pub claims: Batcher<Uuid, Option<Claimed>>,
    /// Per turn: `None` if its fence did not hold, else what the budget check needs.
    pub turns: Batcher<Turn, Option<turns::Committed>>,
    pub outcomes: Batcher<Outcome>,
    /// Per ending: whether its fence held, and the waiting run it promoted.
    pub endings: Batcher<Ending, transitions::Ended>,
    /// Fair dispatch after a limited tenant's run ends or pauses (`store::fair_dispatch`): per
    /// tenant, the runs to publish.
    pub dispatches: Batcher<Uuid, Vec<Uuid>>,
}

impl Writes {
    pub fn spawn(pool: &PgPool, settings: &Settings, worker_id: &str) -> Writes {
        let (n, max, timeout) = (
            settings.worker.write_groups_in_flight,
            settings.worker.max_write_group,
            settings.database.write_timeout(),
        );
        let (owner, lease) = (Arc::new(worker_id.to_owned()), settings.worker.lease());
        Writes {
            claims: Batcher::spawn(
                pool.clone(),
                n,
                max,
                timeout,
                write_fn(move |conn, ids: Arc<Vec<Uuid>>| {
                    let owner = owner.clone();
                    Box::pin(
                        async move { transitions::claim_many(conn, &ids, &owner, lease).await },
                    )
                }),
            ),
            turns: Batcher::spawn(
                pool.clone(),
                n,
                max,
                timeout,
                write_fn(|conn, items: Arc<Vec<Turn>>| {
                    Box::pin(async move { turns::record_many(conn, &items).await })
                }),
            ),
            outcomes: Batcher::spawn(
                pool.clone(),
                n,
                max,
                timeout,
                write_fn(|conn, items: Arc<Vec<Outcome>>| {
                    Box::pin(async move { tool_calls::finish_many(conn, &items).await })
                }),
            ),
            endings: Batcher::spawn(
                pool.clone(),
                n,
                max,
                timeout,
                write_fn(|conn, items: Arc<Vec<Ending>>| {
                    Box::pin(async move { transitions::end_many(conn, &items).await })
                }),
            ),
            dispatches: fair_dispatch::grouped(
                pool.clone(),
                settings.limits.max_running_runs,
                settings.fair_share.share(),
                timeout,
            ),
        }
    }
}
