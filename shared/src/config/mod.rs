//! Configuration: built-in defaults (`defaults.toml`), then an optional TOML file, then
//! `AGENTFLEET__SECTION__KEY` environment variables. Invalid configuration stops start-up with a
//! message naming the key.
//!
//! One file per section holds its struct, its helpers and its own `validate`; this file holds
//! [`Settings`], loading, and the checks that compare keys of different sections.
//! docs/configuration.md is generated from `defaults.toml` and the fields' doc comments
//! (`reference.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

mod amqp;
mod api;
mod context;
mod database;
mod egress;
mod erasure;
mod events;
mod export;
mod fair_share;
mod mcp;
mod models;
mod rate_limit;
mod redis;
mod retention;
mod startup;
mod telemetry;
mod webhooks;
mod worker;

pub use amqp::AmqpSettings;
pub use api::ApiSettings;
pub use context::ContextSettings;
pub use database::DatabaseSettings;
pub use egress::EgressSettings;
pub use erasure::ErasureSettings;
pub use events::{CompactHeader, EventSettings};
pub use export::ExportSettings;
pub use fair_share::FairShareSettings;
pub use mcp::McpSettings;
pub use models::{ModelSettings, Tokenizer, ToolCalling};
pub use rate_limit::RateLimitSettings;
pub use redis::RedisSettings;
pub use retention::RetentionSettings;
pub use startup::StartupSettings;
pub use telemetry::{LogFormat, TelemetrySettings};
pub use webhooks::WebhookSettings;
pub use worker::{OnBudgetExceeded, WorkerSettings};

/// The built-in defaults: every key of every section.
const DEFAULTS: &str = include_str!("defaults.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("invalid configuration: `{key}`: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        message: message.into(),
    }
}

/// A sealing key (`crate::seal`) as configured under `name`: base64 of 32 bytes, or empty for
/// none. Errors name the key and never echo its value.
fn sealing_key(name: &str, value: &str) -> Result<Option<[u8; 32]>, ConfigError> {
    use base64::Engine;
    if value.is_empty() {
        return Ok(None);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| invalid(name, "is not base64"))?;
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| invalid(name, "must be base64 of exactly 32 bytes"))?;
    Ok(Some(key))
}

/// A Redis or RabbitMQ name prefix: non-empty `[A-Za-z0-9._-]`.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The Postgres database: the truth of every run, thread, batch and tenant.
    pub database: DatabaseSettings,
    /// Redis: each run's event list (what streams replay) and live events, and the shared
    /// request-rate buckets. Not the truth: a lost list is recovered from Postgres
    /// (docs/events.md).
    pub redis: RedisSettings,
    /// RabbitMQ: the queue that carries runs to workers, and the dead letters.
    pub amqp: AmqpSettings,
    /// The HTTP API (`agentfleet-api serve`): its listener, what one request may hold, batches,
    /// keys, the console.
    pub api: ApiSettings,
    /// A worker (`agentfleet-worker`): its slots, leases and sweeps, and the limits of a run's
    /// model and tool calls.
    pub worker: WorkerSettings,
    /// A run's events: how a worker writes them to Redis and how the API streams them
    /// (docs/events.md).
    pub events: EventSettings,
    /// Logs and exported traces (docs/operations.md, "Tracing").
    pub telemetry: TelemetrySettings,
    /// Start-up of either binary.
    pub startup: StartupSettings,
    /// Where tool calls, MCP servers and webhook deliveries may connect (the egress policy).
    pub egress: EgressSettings,
    /// Every tenant's default limits. A tenant's own values (`tenants.limits`, set with the admin
    /// API or `agentfleet-api tenants limits`) override them field by field. In all, 0 means no
    /// limit.
    pub limits: crate::domain::Limits,
    /// How the fleet's slots are shared between tenants with no per-tenant configuration: every
    /// tenant's dispatch window (docs/architecture.md, "Fair dispatch").
    pub fair_share: FairShareSettings,
    /// How the API enforces `limits.requests_per_second` across replicas: a token bucket per tenant
    /// in Redis, and a local limiter in each replica beside it.
    pub rate_limit: RateLimitSettings,
    /// Webhook endpoints and their deliveries (sent by the API).
    pub webhooks: WebhookSettings,
    /// How long finished and waiting runs are kept, and how their removal (in one worker at a
    /// time) yields to the fleet's own work. A tenant's own windows (`tenants.retention`)
    /// override the two windows field by field.
    pub retention: RetentionSettings,
    /// MCP tool servers: registration (API) and tool listing (worker).
    pub mcp: McpSettings,
    /// Keeping a run's requests within its model's context window (worker): old tool results, then
    /// old messages, are cut to a head; then the oldest part is summarised by the model itself
    /// (docs/tools.md, "Context management").
    pub context: ContextSettings,
    /// Tenant erasure (`DELETE /admin/v1/tenants/{id}`): how its data is removed in the background
    /// (docs/operations.md, "Erasing a tenant").
    pub erasure: ErasureSettings,
    /// A tenant's export (`GET /v1/export`), JSON lines streamed page by page.
    pub export: ExportSettings,
    /// The models an agent may name (`agent.model`), by the name clients use: a table per model,
    /// e.g. `[models.gpt]`, or `AGENTFLEET__MODELS__GPT__BASE_URL` and so on (a name given in the
    /// environment is lower-cased). None by default.
    #[serde(default)]
    pub models: BTreeMap<String, ModelSettings>,
}

impl Settings {
    /// Loads defaults, then `file` (if given), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_with(file, Vec::<(String, String)>::new(), true)
    }

    /// As [`Settings::load`], with explicit overrides applied last (`section.key` = value).
    /// Tests use this to isolate prefixes and databases without touching the process env.
    pub fn load_with(
        file: Option<&Path>,
        overrides: impl IntoIterator<Item = (String, String)>,
        read_env: bool,
    ) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml));
        if let Some(path) = file {
            builder = builder.add_source(config::File::from(path).required(true));
        }
        if read_env {
            builder = builder.add_source(
                config::Environment::with_prefix("AGENTFLEET")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true),
            );
        }
        for (key, value) in overrides {
            builder = builder.set_override(key, value)?;
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// The parsed egress allowlist (validated at load).
    pub fn egress_policy(&self) -> crate::egress::EgressPolicy {
        crate::egress::EgressPolicy::parse(&self.egress.allow)
            .expect("egress.allow is validated when the settings load")
    }

    /// Each section's own checks, then those that compare keys of different sections.
    fn validate(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.redis.validate()?;
        self.amqp.validate()?;
        self.api.validate()?;
        self.worker.validate()?;
        self.events.validate()?;
        self.telemetry.validate()?;
        self.egress.validate()?;
        if let Err(e) = self.limits.check() {
            return Err(invalid(&format!("limits.{}", e.field), e.message));
        }
        self.fair_share.validate(self.worker.sweep_interval_ms)?;
        self.webhooks.validate()?;
        self.retention.validate()?;
        self.mcp.validate()?;
        self.context.validate()?;
        self.erasure.validate()?;
        self.export.validate()?;
        for (name, model) in &self.models {
            model.validate(name)?;
        }
        if self.database.idle_in_transaction_timeout_ms == 0
            || self.database.idle_in_transaction_timeout_ms >= self.worker.lease_ms
        {
            return Err(invalid(
                "database.idle_in_transaction_timeout_ms",
                "must be positive and below worker.lease_ms",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
