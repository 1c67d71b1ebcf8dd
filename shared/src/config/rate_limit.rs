//! `[rate_limit]`: how the API enforces `limits.requests_per_second` across its replicas.

use serde::Deserialize;

use super::{ConfigError, invalid};

/// The shared request-rate bucket in Redis and the API's local limiter beside it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// The longest one rate check may wait for Redis; past it (or on any Redis error) the
    /// request is decided by the replica's local limiter alone.
    pub redis_timeout_ms: u64,
    /// After a failed rate check, how long the API decides by its local limiter alone
    /// before asking Redis again (so a Redis outage costs no time per request).
    pub local_only_ms: u64,
    /// Tenants whose local limiter a replica keeps; past it the map is started afresh.
    pub local_max_tenants: usize,
}

impl RateLimitSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.redis_timeout_ms == 0 {
            return Err(invalid("rate_limit.redis_timeout_ms", "must be positive"));
        }
        if self.local_max_tenants == 0 {
            return Err(invalid(
                "rate_limit.local_max_tenants",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
