//! `[telemetry]`: logs and exported traces.

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// OTLP/HTTP endpoint, e.g. `http://collector:4318`; empty disables export.
    pub otlp_endpoint: String,
    pub service_name: String,
    /// `auto` (human-readable on a terminal, JSON otherwise), `json` or `pretty`.
    pub log_format: String,
    /// Which spans and events are exported (an `EnvFilter` directive, like `RUST_LOG`, but
    /// independent of it): by default agentfleet's own spans at `info`, warnings from all.
    pub trace_filter: String,
}

impl TelemetrySettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !matches!(self.log_format.as_str(), "auto" | "json" | "pretty") {
            return Err(invalid(
                "telemetry.log_format",
                "must be `auto`, `json` or `pretty`",
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.trace_filter) {
            return Err(invalid(
                "telemetry.trace_filter",
                format!("is not a valid filter directive: {e}"),
            ));
        }
        Ok(())
    }
}
