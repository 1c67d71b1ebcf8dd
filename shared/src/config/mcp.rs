//! `[mcp]`: MCP tool servers: what a tenant may register, and how a worker lists their tools.

use std::num::{NonZeroU64, NonZeroUsize};

use serde::Deserialize;

use super::{ConfigError, invalid};

/// MCP servers: what a tenant may register, and how the worker lists their tools.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSettings {
    /// Base64 of 32 bytes: seals registered servers' header values (ChaCha20-Poly1305) in Postgres.
    /// Empty: servers can be registered without headers only. The API and every worker need the
    /// same key. A secret (docs/operations.md, "Rotate secrets").
    pub encryption_key: String,
    /// How long a server's tool list is reused before it is listed again (per tenant, server URL
    /// and headers).
    pub tools_ttl_ms: NonZeroU64,
    /// Tool lists one worker keeps (of every tenant; each up to `mcp.max_list_bytes`); when full,
    /// the expired go, else the oldest list of the tenant holding the most.
    pub tools_cache_max_entries: NonZeroUsize,
    /// Tool lists of one tenant a worker keeps (its share: its own oldest goes to make room for its
    /// next, never another tenant's); at most `mcp.tools_cache_max_entries`.
    pub tools_cache_max_per_tenant: NonZeroUsize,
    /// Deadline of listing a server's tools (connect, initialize, list).
    pub list_timeout_ms: NonZeroU64,
    /// Most tools taken from one server, over all the listing's pages (at most 64 pages); more fail
    /// the listing, and the run with `mcp_server_unavailable`.
    pub max_tools_per_server: NonZeroUsize,
    /// Largest input schema of one MCP tool (serialized JSON); a larger one fails the listing (the
    /// run fails, `mcp_server_unavailable`).
    pub max_schema_bytes: NonZeroUsize,
    /// Patterns (`pattern`, `patternProperties` keys) one MCP tool's input schema may hold; a call
    /// to a tool with more is refused (the worker compiles each at the tool's first call).
    pub max_schema_patterns: NonZeroUsize,
    /// States one MCP tool's patterns may be estimated to compile to together
    /// (`tool_schema::pattern_states`); a call to a tool with more is refused.
    pub max_schema_pattern_states: NonZeroU64,
    /// Largest listing response read from a server, and the most a whole listing (every page's
    /// names, descriptions and schemas) may hold; past it the listing fails (the run fails,
    /// `mcp_server_unavailable`).
    pub max_list_bytes: NonZeroUsize,
    /// Servers one tenant may register (409 `too_many_mcp_servers` past it); at least 1.
    pub max_servers_per_tenant: i64,
    /// Headers one registered server may carry. 0–64.
    pub max_headers: usize,
    /// The longest value of such a header.
    pub max_header_value_bytes: NonZeroUsize,
}

impl McpSettings {
    /// What one MCP tool's input schema may hold.
    pub fn schema_limits(&self) -> crate::tool_schema::Limits {
        crate::tool_schema::Limits {
            max_patterns: self.max_schema_patterns.get(),
            max_states: self.max_schema_pattern_states.get(),
        }
    }

    /// The sealing key, when one is configured.
    pub fn key(&self) -> Result<Option<[u8; 32]>, ConfigError> {
        super::sealing_key("mcp.encryption_key", &self.encryption_key)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.key()?;
        if self.max_servers_per_tenant < 1 {
            return Err(invalid("mcp.max_servers_per_tenant", "must be positive"));
        }
        if self.tools_cache_max_per_tenant > self.tools_cache_max_entries {
            return Err(invalid(
                "mcp.tools_cache_max_per_tenant",
                "must be at most mcp.tools_cache_max_entries",
            ));
        }
        if self.max_headers > 64 {
            return Err(invalid("mcp.max_headers", "must be within 0..=64"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn the_mcp_sealing_key_is_32_bytes_of_base64_or_nothing() {
        assert_eq!(load(&[]).unwrap().mcp.key().unwrap(), None);
        let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let s = load(&[("mcp.encryption_key", key)]).unwrap();
        assert_eq!(s.mcp.key().unwrap().unwrap()[31], 31);
        for (bad, why) in [
            ("not base64!", "is not base64"),
            ("AAECAwQ=", "must be base64 of exactly 32 bytes"),
        ] {
            let err = load(&[("mcp.encryption_key", bad)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("mcp.encryption_key") && err.contains(why),
                "{err}"
            );
            assert!(!err.contains(bad), "the key is not echoed: {err}");
        }
        let err = load(&[("worker.max_parallel_tool_calls", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("worker.max_parallel_tool_calls"), "{err}");
    }
}
