//! `[egress]`: where tool calls may connect.

use serde::Deserialize;

use super::{ConfigError, invalid};

/// What tool calls may reach (see `crate::egress`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSettings {
    /// Comma-separated allowlist: IPs or CIDRs (optionally `:port`, IPv6 in brackets) and host
    /// names (optionally `:port`). Empty: public addresses only.
    pub allow: String,
    /// Redirects a tool call follows (each hop is checked); 0 returns a 3xx to the model as an
    /// error result.
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
