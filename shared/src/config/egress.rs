//! `[egress]`: where tool calls may connect.

use serde::Deserialize;

use super::{ConfigError, invalid};

/// What tool calls may reach (see `crate::egress`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSettings {
    /// What tool calls, MCP servers and webhook deliveries may reach besides public addresses: a
    /// comma-separated allowlist of IPs or CIDRs (optionally `:port`, IPv6 in brackets) and host
    /// names (optionally `:port`). Empty: public addresses only (loopback, private, link-local,
    /// metadata and other special ranges are refused in every spelling, at connect time and on
    /// every redirect hop). A webhook URL must be `https://` unless its address is listed here.
    pub allow: String,
    /// Redirects a tool call follows (each hop is checked); 0 returns a 3xx to the model as an
    /// error result. 0–10.
    pub max_redirects: usize,
}

impl EgressSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = crate::egress::EgressPolicy::parse(&self.allow) {
            return Err(invalid("egress.allow", e));
        }
        if self.max_redirects > 10 {
            return Err(invalid("egress.max_redirects", "must be within 0..=10"));
        }
        Ok(())
    }
}
