//! agentfleet-shared: the domain, configuration, Postgres store, queue topology, event bus and
//! telemetry used by both the API and the workers.

pub mod config;
pub mod db;
pub mod domain;
pub mod egress;
pub mod egress_client;
pub mod event_compaction;
pub mod events;
pub mod failpoint;
pub mod infra;
pub mod queue;
pub mod report;
pub mod sanitize;
pub mod seal;
pub mod signals;
pub mod store;
pub mod telemetry;
pub mod tenant_tally;
pub mod tool_schema;
