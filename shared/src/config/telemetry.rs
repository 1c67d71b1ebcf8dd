//! `[telemetry]`: logs and exported traces.

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// OTLP/HTTP collector to export traces to, e.g. `http://otel-collector:4318` (spans go to
    /// `<endpoint>/v1/traces`; the batch schedule follows the standard `OTEL_BSP_*` variables);
    /// empty exports nothing (docs/operations.md, "Tracing").
    pub otlp_endpoint: String,
    /// Exported traces name their service `<service_name>-api` and `<service_name>-worker`.
    pub service_name: String,
    /// How log lines are written (the log level comes from `RUST_LOG`).
    pub log_format: LogFormat,
    /// Which spans and events are exported: an `EnvFilter` directive, like `RUST_LOG` but
    /// independent of it. By default agentfleet's own spans at `info`, warnings from all.
    pub trace_filter: String,
}

/// `telemetry.log_format`: how log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum LogFormat {
    /// Human-readable lines on a terminal, JSON otherwise.
    Auto,
    /// One JSON object a line.
    Json,
    /// Human-readable lines.
    Pretty,
}

impl TryFrom<String> for LogFormat {
    type Error = String;

    /// By hand, as `OnBudgetExceeded`: the message names the values allowed.
    fn try_from(s: String) -> Result<LogFormat, String> {
        match s.as_str() {
            "auto" => Ok(LogFormat::Auto),
            "json" => Ok(LogFormat::Json),
            "pretty" => Ok(LogFormat::Pretty),
            other => Err(format!("must be `auto`, `json` or `pretty`, not `{other}`")),
        }
    }
}

impl TelemetrySettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.trace_filter) {
            return Err(invalid(
                "telemetry.trace_filter",
                format!("is not a valid filter directive: {e}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load;

    #[test]
    fn the_log_format_is_one_of_three_naming_the_key() {
        assert_eq!(load(&[]).unwrap().telemetry.log_format, LogFormat::Auto);
        for (text, format) in [
            ("auto", LogFormat::Auto),
            ("json", LogFormat::Json),
            ("pretty", LogFormat::Pretty),
        ] {
            let s = load(&[("telemetry.log_format", text)]).unwrap();
            assert_eq!(s.telemetry.log_format, format);
        }
        let err = load(&[("telemetry.log_format", "yaml")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`telemetry.log_format`"), "{err}");
        assert!(err.contains("`auto`, `json` or `pretty`"), "{err}");
    }
}
