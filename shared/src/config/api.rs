//! `[api]`: the HTTP API: its listener, request limits, batches, keys and the console.

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    pub listen: String,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Largest accepted `input` text of a run, in bytes.
    pub max_input_bytes: usize,
    pub max_batch_runs: usize,
    /// Runs that may wait for one busy thread (`if_busy = enqueue | interrupt`).
    pub max_queued_per_thread: i64,
    /// Event streams (of runs, threads, batches) one tenant may hold open on one API process.
    pub max_streams_per_tenant: usize,
    /// Single run creations (on a new thread, without an idempotency key) written together
    /// when they arrive at once: groups in flight at once, and most runs in one group
    /// (`store::batch`).
    pub create_groups_in_flight: usize,
    pub max_create_group: usize,
    pub max_tools_per_agent: usize,
    /// Patterns (`pattern`, `patternProperties` keys) the distinct tool schemas of one request
    /// (a run's agent, or all of a batch's agents) may hold together: the API compiles each
    /// when the run is submitted (0.1 ms and ~25 KiB at least, a worker the same again).
    pub max_schema_patterns: usize,
    /// States those patterns may be estimated to compile to together
    /// (`tool_schema::pattern_states`; up to ~0.6 µs and ~80 bytes each to compile).
    pub max_schema_pattern_states: u64,
    /// Requests whose tool schemas hold patterns checked and compiled at once by one API
    /// process (each on a blocking thread); the others wait their turn.
    pub max_schema_compiles: usize,
    /// Tool schemas one API process remembers it accepted (a digest and its patterns' counts,
    /// ~100 bytes each): a schema it knows is neither walked nor compiled again. 0 remembers
    /// none.
    pub max_remembered_schemas: usize,
    pub max_metadata_bytes: usize,
    pub default_page_size: u32,
    pub max_page_size: u32,
    /// `GET /v1/runs/counts` counts the newest this many runs matching its filters (bounds its
    /// cost whatever the tenant's history).
    pub count_window: u32,
    /// Serve the web console at `/console` (static files in the binary; it signs in with an
    /// API key and uses the same `/v1` endpoints).
    pub console: bool,
    pub request_timeout_ms: u64,
    /// Secret that signs browser stream tokens; every API replica needs the same one. When
    /// empty, a random secret is made at start-up (tokens then work only on that process).
    pub stream_token_secret: String,
    pub stream_token_ttl_secs: u64,
    /// Comma-separated origins allowed by CORS (`*` for any); empty disables CORS.
    pub cors_allowed_origins: String,
    /// How long an authenticated API key is trusted without asking Postgres again (so a
    /// revocation takes effect within this time); 0 disables the cache.
    pub auth_cache_ttl_ms: u64,
    pub auth_cache_max_keys: NonZeroUsize,
    /// Operator token of the admin API (`/admin/v1/…`: tenants and keys), sent as
    /// `Authorization: Bearer <token>`. Empty disables the admin API (its paths answer 404).
    pub admin_token: String,
    /// How often each replica writes the `last_used_at` of the keys it saw, all in one
    /// statement: the column is that precise, and requests never write to Postgres for it.
    pub key_last_used_flush_ms: NonZeroU64,
    /// Address of the API's Prometheus metrics listener, apart from the public `listen` port
    /// (metrics are not for tenants); empty disables it.
    pub metrics_listen: String,
    /// Largest `agent.max_tokens_total` (a run's own token budget) a run may ask for.
    pub max_tokens_total: i64,
    /// Widest `from..=to` range of `GET /v1/usage`, in days.
    pub max_usage_days: NonZeroU32,
    /// Most items of one `POST /v1/batches` (a tenant's `max_batch_size` may lower it).
    pub max_batch_items: usize,
    /// Request limit of `POST /v1/batches` alone (every other route keeps `max_body_bytes`).
    pub max_batch_body_bytes: usize,
    /// Most JSON values (object keys counted) a request body may hold, checked before it is
    /// parsed: a parsed value takes 32 bytes and more, so a body of tiny values (`[0,0,…]`)
    /// takes ~16 times its size in memory.
    pub max_json_values: usize,
    /// Runs of a batch created per transaction: each chunk is one short transaction, so a big
    /// batch never holds locks other writers wait for.
    pub batch_chunk_size: usize,
    /// How often `GET /v1/batches/{id}/events` looks at the counts (one query per stream).
    pub batch_progress_interval_ms: NonZeroU64,
    /// Chunks of a batch in creation that may fail in a row before the items still without a
    /// run get an error (`internal_error`) and the batch moves on: a chunk failing the same
    /// way every time is not retried for ever.
    pub batch_max_chunk_failures: u32,
    /// Lease of the replica driving a batch (creating or cancelling its runs), renewed by each
    /// chunk; once expired, another replica's sweep takes the batch over.
    pub batch_lease_ms: u64,
    /// How often each replica sweeps unfinished batches: takes over batches whose lease
    /// expired, and finishes batches whose runs have all ended.
    pub batch_sweep_interval_ms: NonZeroU64,
}

impl ApiSettings {
    /// What the distinct tool schemas of one request may hold together.
    pub fn schema_limits(&self) -> crate::tool_schema::Limits {
        crate::tool_schema::Limits {
            max_patterns: self.max_schema_patterns,
            max_states: self.max_schema_pattern_states,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.admin_token.is_empty() && self.admin_token.len() < 16 {
            return Err(invalid(
                "api.admin_token",
                "must be empty (admin API disabled) or at least 16 characters",
            ));
        }
        if self.max_tokens_total < 1 {
            return Err(invalid("api.max_tokens_total", "must be at least 1"));
        }
        if !(1..=1_000_000).contains(&self.max_batch_items) {
            return Err(invalid("api.max_batch_items", "must be within 1..=1000000"));
        }
        if self.max_json_values < 1000 {
            return Err(invalid("api.max_json_values", "must be at least 1000"));
        }
        if self.max_batch_body_bytes < self.max_body_bytes {
            return Err(invalid(
                "api.max_batch_body_bytes",
                "must be at least api.max_body_bytes",
            ));
        }
        if !(1..=100).contains(&self.batch_max_chunk_failures) {
            return Err(invalid(
                "api.batch_max_chunk_failures",
                "must be within 1..=100",
            ));
        }
        if !(1..=10_000).contains(&self.batch_chunk_size) {
            return Err(invalid("api.batch_chunk_size", "must be within 1..=10000"));
        }
        if self.batch_lease_ms < 2 * self.batch_sweep_interval_ms.get().max(1000) {
            return Err(invalid(
                "api.batch_lease_ms",
                "must be at least twice api.batch_sweep_interval_ms, and at least 2000",
            ));
        }
        if self.max_page_size == 0 || self.default_page_size > self.max_page_size {
            return Err(invalid(
                "api.default_page_size",
                "must be within 1..=api.max_page_size",
            ));
        }
        if !(1..=1_000_000).contains(&self.count_window) {
            return Err(invalid("api.count_window", "must be within 1..=1000000"));
        }
        if self.max_schema_patterns > 100_000 {
            return Err(invalid(
                "api.max_schema_patterns",
                "must be within 0..=100000",
            ));
        }
        if self.max_schema_pattern_states > 10_000_000 {
            return Err(invalid(
                "api.max_schema_pattern_states",
                "must be within 0..=10000000",
            ));
        }
        if !(1..=64).contains(&self.max_schema_compiles) {
            return Err(invalid("api.max_schema_compiles", "must be within 1..=64"));
        }
        if self.max_remembered_schemas > 1_000_000 {
            return Err(invalid(
                "api.max_remembered_schemas",
                "must be within 0..=1000000",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_streams_per_tenant) {
            return Err(invalid(
                "api.max_streams_per_tenant",
                "must be within 1..=1000000",
            ));
        }
        if !(1..=1000).contains(&self.max_queued_per_thread) {
            return Err(invalid(
                "api.max_queued_per_thread",
                "must be within 1..=1000",
            ));
        }
        if self.max_input_bytes > self.max_body_bytes {
            return Err(invalid(
                "api.max_input_bytes",
                "must not exceed api.max_body_bytes",
            ));
        }
        Ok(())
    }
}
