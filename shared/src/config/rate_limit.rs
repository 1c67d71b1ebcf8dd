//! `[rate_limit]`: how the API enforces `limits.requests_per_second` across its replicas.

use std::num::{NonZeroU64, NonZeroUsize};

use serde::Deserialize;

/// The shared request-rate bucket in Redis and the API's local limiter beside it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// The longest one rate check may wait for Redis; past it (or on any Redis error) the request
    /// is decided by the replica's local limiter alone (fail open, at the tenant's full rate per
    /// replica).
    pub redis_timeout_ms: NonZeroU64,
    /// After a failed rate check, how long the API decides by its local limiter alone before asking
    /// Redis again (so a Redis outage costs no time per request).
    pub local_only_ms: u64,
    /// Tenants whose local limiter an API replica keeps; past it the map is started afresh.
    pub local_max_tenants: NonZeroUsize,
}
