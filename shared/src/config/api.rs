//! `[api]`: the HTTP API: its listener, request limits, batches, keys and the console.

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};

use serde::Deserialize;

use super::{ConfigError, invalid};

/// The shortest operator token (`api.admin_token`): 32 random characters are out of reach of
/// guessing even without the failed-attempt limit.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 32;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Address of the public HTTP API (`/v1`, `/openapi.json`, the console), e.g. `0.0.0.0:8080`.
    pub listen: String,
    /// Address of the admin API (`/admin/v1/…`), a listener of its own so that the public port and
    /// its ingress never expose it; bound only when `api.admin_token` is set. Empty: the admin API
    /// is served on `api.listen` instead (its failed-attempt limit then counts every client behind
    /// a proxy as one source).
    pub admin_listen: String,
    /// Largest request body; a larger one is 413 `payload_too_large` (`POST /v1/batches` has
    /// `api.max_batch_body_bytes` instead).
    pub max_body_bytes: usize,
    /// Largest `input` of a run, of a resume, and `reason` of a decision, in bytes (422 naming the
    /// field); at most `api.max_body_bytes`.
    pub max_input_bytes: usize,
    /// Most runs in one `POST /v1/runs/batch` (a tenant's `limits.max_batch_size` may lower it);
    /// more is 422 naming `runs`.
    pub max_batch_runs: usize,
    /// Runs that may wait for one busy thread (`if_busy` `enqueue` or `interrupt`); one more is 429
    /// `thread_queue_full`. 1–1000.
    pub max_queued_per_thread: i64,
    /// Event streams (of runs, threads, batches) one tenant may hold open on one API process; one
    /// more is 429 `too_many_streams`. 1–1000000.
    pub max_streams_per_tenant: usize,
    /// Single run creations (on a new thread, without an `Idempotency-Key`) the API writes at once;
    /// creations arriving meanwhile are written together as the next group (one statement, one
    /// commit; `store::group_commit`). Each group in flight keeps its own Postgres connection, outside
    /// `database.max_connections`.
    pub create_groups_in_flight: usize,
    /// Most creations in one such group.
    pub max_create_group: usize,
    /// Most tools of one agent, with distinct names (422 naming `agent.tools` past it).
    pub max_tools_per_agent: usize,
    /// Patterns (`pattern`, `patternProperties` keys) the distinct tool schemas of one request (a
    /// run's agent, or every agent of a batch) may hold together: the API compiles each when the
    /// run is submitted (0.1 ms and ~25 KiB at least, a worker the same again). 0–100000.
    pub max_schema_patterns: usize,
    /// States those patterns may be estimated to compile to together
    /// (`tool_schema::pattern_states`; docs/tools.md: ~0.5 µs and 40–80 bytes of compiling a
    /// state). 0–10000000.
    pub max_schema_pattern_states: u64,
    /// Requests whose tool schemas hold patterns checked and compiled at once by one API process,
    /// each on a blocking thread; the others wait their turn. 1–64.
    pub max_schema_compiles: usize,
    /// Tool schemas one API process remembers it accepted (a digest and its patterns' counts, ~100
    /// bytes each): a known schema is neither walked nor compiled again, only its patterns counted.
    /// 0 remembers none; at most 1000000.
    pub max_remembered_schemas: usize,
    /// Largest `metadata` of a run or batch (a JSON object, measured as its text); a larger one is
    /// 422 naming `metadata`.
    pub max_metadata_bytes: usize,
    /// Page size of a listing whose request names no `limit`; at most `api.max_page_size`.
    pub default_page_size: u32,
    /// Largest `limit` of a listing (runs, a batch's items, tenants); at least 1.
    pub max_page_size: u32,
    /// `GET /v1/runs/counts` counts the newest this many runs matching its filters (bounds its cost
    /// whatever the tenant's history). 1–1000000.
    pub count_window: u32,
    /// Serve the web console at `/console` (static files in the binary; it signs in with an API key
    /// and uses the same `/v1` endpoints).
    pub console: bool,
    /// A request not answered within it is 408 `request_timeout` (a stream counts as answered once
    /// it starts).
    pub request_timeout_ms: u64,
    /// Secret that signs browser stream tokens (`POST /v1/runs/{id}/stream-token`); every API
    /// replica needs the same one (docs/operations.md, "Rotate secrets"). When empty, a random
    /// secret is made at start-up (tokens then work only on that process). A secret.
    pub stream_token_secret: String,
    /// How long a stream token is valid after it was issued (docs/events.md).
    pub stream_token_ttl_secs: u64,
    /// Comma-separated origins allowed by CORS (`*` for any); empty disables CORS.
    pub cors_allowed_origins: String,
    /// How long an authenticated API key is trusted without asking Postgres again (so a revocation
    /// takes effect within this time); 0 disables the cache.
    pub auth_cache_ttl_ms: u64,
    /// Most API keys that cache holds.
    pub auth_cache_max_keys: NonZeroUsize,
    /// How long a key Postgres did not know (never issued, revoked or expired) is answered 401 from
    /// memory, without asking again; 0 asks every time.
    pub auth_negative_ttl_ms: u64,
    /// Most unknown keys remembered so (~100 bytes each); when full, the expired go, or all.
    pub auth_negative_max_keys: NonZeroUsize,
    /// Unknown API keys one source address (an IPv6 /64) may present within
    /// `api.auth_failure_window_ms`; past them, a key that would need a Postgres lookup is answered
    /// 429 `too_many_attempts`, with `Retry-After`, until that window ends (keys already cached still
    /// work). Behind a proxy every client is one source: raise it there. 0 disables the limit.
    pub auth_max_failures: u32,
    /// The window of `api.auth_max_failures`, starting at a source's first failure.
    pub auth_failure_window_ms: NonZeroU64,
    /// How long a refused source's request waits before its 429 (never past its window's end), so
    /// a client flooding made-up keys gets its answers, and sends its next requests, at a pace that
    /// costs the process little CPU; 0 answers at once.
    pub auth_lockout_delay_ms: u64,
    /// Refused requests held so at once per process (a socket and a timer each); past them the 429
    /// is answered at once. 1–100000.
    pub auth_lockout_max_delayed: usize,
    /// Postgres lookups at once, per process, of keys it has not seen valid (made-up keys, and real
    /// keys at their first use on this process); the others wait their turn. Keeps a flood of
    /// made-up keys from taking the connections every other request needs. 1–1000.
    pub auth_unseen_lookups: usize,
    /// Source addresses whose failed keys are tracked at once (~50 bytes each); when all are within
    /// their window, new sources share one window. 1–1000000.
    pub auth_max_sources: usize,
    /// Operator token of the admin API (`/admin/v1/…`: tenants and keys), sent as `Authorization:
    /// Bearer <token>` and compared in constant time; empty, or at least 32 characters. Empty
    /// disables the admin API (every admin path answers 404). A secret.
    pub admin_token: String,
    /// Failed admin authentications one source address (an IPv6 /64) may make within
    /// `api.admin_failure_window_ms`; past them it is answered 429 `too_many_attempts`, with
    /// `Retry-After`, until that window ends. At least 1.
    pub admin_max_failures: u32,
    /// The window of `api.admin_max_failures`, starting at a source's first failure.
    pub admin_failure_window_ms: NonZeroU64,
    /// Source addresses whose failures are tracked at once (~50 bytes each); when all are within
    /// their window, new sources share one window. 1–1000000.
    pub admin_max_sources: usize,
    /// How often each API replica writes the `last_used_at` of the keys it saw, all in one
    /// statement: the column is that precise, and requests never write to Postgres for it.
    pub key_last_used_flush_ms: NonZeroU64,
    /// Address of the API's Prometheus metrics listener, e.g. `0.0.0.0:9091`, kept off the public
    /// `api.listen` port (metrics are not for tenants); empty disables it.
    pub metrics_listen: String,
    /// Largest `agent.max_tokens_total` (a run's own token budget) a run may ask for; at least 1.
    pub max_tokens_total: i64,
    /// Largest `agent.plan.max_rounds` a plan-and-solve run may ask for. 1–1000.
    pub max_plan_rounds: u32,
    /// Largest `agent.plan.max_tasks` (tasks one `plan` call may create). 1–1000.
    pub max_plan_tasks: u32,
    /// Largest `agent.plan.max_parallel` (a plan's tasks in flight at once). 1–1000.
    pub max_plan_parallel: u32,
    /// The most days one `GET /v1/usage` covers (a longer range is cut to its last days).
    pub max_usage_days: NonZeroU32,
    /// Most items of one `POST /v1/batches` (a tenant's `limits.max_batch_size` lowers it); more is
    /// 422 naming `runs`. 1–1000000.
    pub max_batch_items: usize,
    /// Request limit of `POST /v1/batches` alone (every other route keeps `api.max_body_bytes`);
    /// over it: 413 `payload_too_large`. At least `api.max_body_bytes`.
    pub max_batch_body_bytes: usize,
    /// Bytes of request bodies one API process holds at once, from before a body is read until its
    /// request is answered (a request counts its `Content-Length`, or its route's body limit when it
    /// sends none); a request that would pass it is answered 503 `overloaded` with `Retry-After`
    /// before its body is read. Parsing, checking and writing a body takes about four times its size
    /// (docs/operations.md), so keep it a fraction of the process's memory limit. At least
    /// `api.max_batch_body_bytes`.
    pub body_budget_bytes: usize,
    /// Requests with a body larger than `api.max_body_bytes` (batch submissions) one tenant may
    /// have in flight on one API process; one more is 429 `too_many_large_requests` with
    /// `Retry-After`, before its body is read. 1–1000.
    pub max_large_bodies_per_tenant: usize,
    /// How often each API process asks Postgres, Redis and RabbitMQ whether they answer, in the
    /// background: `/readyz` answers from the last round, and touches none of them itself.
    pub readiness_interval_ms: NonZeroU64,
    /// Most JSON values (object keys counted) a request body may hold, counted before it is parsed:
    /// a parsed value takes 32 bytes and more, so a body of tiny values (`[0,0,…]`) takes ~16 times
    /// its size in memory. Over it: 413 `payload_too_large`. At least 1000.
    pub max_json_values: usize,
    /// Runs of a batch created per transaction: each chunk is one short transaction, so a big batch
    /// never holds locks other writers wait for. 1–10000.
    pub batch_chunk_size: usize,
    /// How often `GET /v1/batches/{id}/events` looks at the counts (one query per open stream).
    pub batch_progress_interval_ms: NonZeroU64,
    /// Chunks of a batch's creation that may fail in a row (each take-over tries again) before the
    /// items still without a run get an `internal_error` in the results and the batch goes on: a
    /// chunk failing the same way every time is not retried for ever. 1–100.
    pub batch_max_chunk_failures: u32,
    /// Lease of the API replica creating (or cancelling) a batch's runs, renewed by each chunk;
    /// once it expires another replica's sweep takes the batch over. At least 2000 and twice
    /// `api.batch_sweep_interval_ms`.
    pub batch_lease_ms: u64,
    /// How often each API replica sweeps unfinished batches: takes over those whose lease expired,
    /// and marks finished those whose runs have all ended (one short statement per unfinished
    /// batch).
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
        if !self.admin_token.is_empty() && self.admin_token.chars().count() < MIN_ADMIN_TOKEN_CHARS
        {
            return Err(invalid(
                "api.admin_token",
                format!(
                    "must be empty (admin API disabled) or at least {MIN_ADMIN_TOKEN_CHARS} characters"
                ),
            ));
        }
        if !(1..=1000).contains(&self.auth_unseen_lookups) {
            return Err(invalid(
                "api.auth_unseen_lookups",
                "must be within 1..=1000",
            ));
        }
        if !(1..=100_000).contains(&self.auth_lockout_max_delayed) {
            return Err(invalid(
                "api.auth_lockout_max_delayed",
                "must be within 1..=100000",
            ));
        }
        if !(1..=1_000_000).contains(&self.auth_max_sources) {
            return Err(invalid(
                "api.auth_max_sources",
                "must be within 1..=1000000",
            ));
        }
        if self.body_budget_bytes < self.max_batch_body_bytes {
            return Err(invalid(
                "api.body_budget_bytes",
                "must be at least api.max_batch_body_bytes",
            ));
        }
        if !(1..=1000).contains(&self.max_large_bodies_per_tenant) {
            return Err(invalid(
                "api.max_large_bodies_per_tenant",
                "must be within 1..=1000",
            ));
        }
        if self.admin_max_failures < 1 {
            return Err(invalid("api.admin_max_failures", "must be at least 1"));
        }
        if !(1..=1_000_000).contains(&self.admin_max_sources) {
            return Err(invalid(
                "api.admin_max_sources",
                "must be within 1..=1000000",
            ));
        }
        if self.max_tokens_total < 1 {
            return Err(invalid("api.max_tokens_total", "must be at least 1"));
        }
        for (key, n) in [
            ("api.max_plan_rounds", self.max_plan_rounds),
            ("api.max_plan_tasks", self.max_plan_tasks),
            ("api.max_plan_parallel", self.max_plan_parallel),
        ] {
            if !(1..=1000).contains(&n) {
                return Err(invalid(key, "must be within 1..=1000"));
            }
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
