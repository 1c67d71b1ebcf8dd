//! Configuration: built-in defaults, then an optional TOML file, then `AGENTFLEET__SECTION__KEY`
//! environment variables. Invalid configuration stops start-up with a message naming the key.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    pub amqp: AmqpSettings,
    pub api: ApiSettings,
    pub worker: WorkerSettings,
    pub events: EventSettings,
    pub telemetry: TelemetrySettings,
    pub startup: StartupSettings,
    pub egress: EgressSettings,
    /// Every tenant's default limits; a tenant's own values (admin API) override them.
    pub limits: crate::domain::Limits,
    /// How the API enforces `limits.requests_per_second` across replicas (see the API's
    /// `rate_limit` module).
    pub rate_limit: RateLimitSettings,
    /// Webhook endpoints and their deliveries (sent by the API).
    pub webhooks: WebhookSettings,
    /// MCP tool servers: registration (API) and tool listing (worker).
    pub mcp: McpSettings,
    /// Keeping a run's requests within its model's context window (worker).
    pub context: ContextSettings,
    /// Models an agent may name, by the name clients use.
    #[serde(default)]
    pub models: BTreeMap<String, ModelSettings>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// A server on this host (loopback or a Unix socket) is reached without TLS unless the URL
    /// names `sslmode` (see `db::options`).
    pub url: String,
    pub max_connections: u32,
    pub connect_timeout_ms: u64,
    /// Apply migrations when a binary starts (the `migrate` subcommand always can).
    pub migrate_on_start: bool,
    /// How long a migration waits for a lock (`lock_timeout` of its connection; 0: no limit)
    /// before it is rolled back and tried again: while a migration that alters a table waits
    /// for the transactions using it, every later statement on that table queues behind it.
    /// At most half of the fleet's own non-zero lock timeout
    /// ([`DatabaseSettings::migration_lock_timeout`]), so a statement queued behind a waiting
    /// migration never fails first.
    pub migration_lock_timeout_ms: u64,
    /// Attempts of the migrations, in all, while a lock wait is what fails them (backing off
    /// 0.5–10 s between them, jittered): then the binary gives up and says why. Waiting for
    /// another process that applies the migrations is such a lock wait too.
    pub migration_attempts: u32,
    /// Postgres ends a transaction left idle this long (a frozen or partitioned process), so
    /// its row locks cannot block other workers' claims. Keep it below `worker.lease_ms`.
    pub idle_in_transaction_timeout_ms: u64,
    /// Postgres cancels any statement of ours running longer (`statement_timeout`; 0: never),
    /// so a statement stalled for any reason (a lock held elsewhere when `lock_timeout_ms` is
    /// off, a stalled disk) fails instead of holding the runs behind it for as long as it
    /// lasts. A grouped write also gives up on its own a second later, in case the server
    /// cannot even answer. Migrations and the operator subcommands of `agentfleet-api` run
    /// without it.
    pub statement_timeout_ms: u64,
    /// Postgres fails any statement of ours that waits longer than this for a lock
    /// (`lock_timeout`, SQLSTATE 55P03; 0: never), at most half of a non-zero
    /// `statement_timeout_ms` ([`DatabaseSettings::lock_timeout`]). Shorter than the
    /// statement's, it tells a wait on a row locked elsewhere from a slow statement: a grouped
    /// write that meets one is then written item by item, so only the write on the locked row
    /// waits again and fails, while the other runs of its group go on (a group cancelled by
    /// `statement_timeout_ms` fails whole). Migrations and the operator subcommands of
    /// `agentfleet-api` run without it.
    pub lock_timeout_ms: u64,
    /// Plan each prepared statement once per connection (`plan_cache_mode =
    /// force_generic_plan`) instead of re-planning it with each call's values: every hot
    /// statement has the same best plan whatever its values, and planning the grouped writes
    /// cost Postgres about a fifth of its CPU per run.
    pub generic_plans: bool,
    /// Agent specs (as JSON) a process keeps parsed, in KiB, so that the runs of one agent
    /// share one parse (`store::agents`; the parsed form takes several times the text). 0
    /// keeps none.
    pub agent_cache_kib: usize,
}

impl DatabaseSettings {
    /// How long a grouped write waits for its answer before it gives up on the connection:
    /// a second past `statement_timeout_ms`, so the server's own cancel (which keeps the
    /// connection) normally answers first. `None` when statements have no time-out.
    pub fn write_timeout(&self) -> Option<std::time::Duration> {
        (self.statement_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(self.statement_timeout_ms + 1000))
    }

    /// The `lock_timeout` of a migration's connection, in ms (0: never):
    /// `migration_lock_timeout_ms`, capped at half of a non-zero [`Self::lock_timeout`]. The
    /// fleet's statements queued behind a migration's waiting `ALTER TABLE` wait for it as for
    /// any lock; capped, the migration always gives up first and they go on.
    pub fn migration_lock_timeout(&self) -> u64 {
        match (self.migration_lock_timeout_ms, self.lock_timeout()) {
            (0, _) => 0,
            (migration, 0) => migration,
            (migration, fleet) => migration.min(fleet / 2).max(1),
        }
    }

    /// The `lock_timeout` connections carry, in ms (0: never): `lock_timeout_ms`, capped at
    /// half of a non-zero `statement_timeout_ms`, so that a wait for a lock always ends before
    /// the statement's own cancel would fail its whole group (a deployment that lowered only
    /// the statement's time-out keeps a working pair).
    pub fn lock_timeout(&self) -> u64 {
        match (self.lock_timeout_ms, self.statement_timeout_ms) {
            (0, _) => 0,
            (lock, 0) => lock,
            (lock, statement) => lock.min(statement / 2).max(1),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    /// Prefix of every key and channel, e.g. `agentfleet:run:{id}:events`.
    pub prefix: String,
    /// The longest one event-bus call (an append, a read) may take, waiting for a reconnect
    /// included: past it the call fails like an unreachable Redis (an append is logged and
    /// dropped, the run goes on).
    pub timeout_ms: u64,
    /// One connection attempt.
    pub connect_timeout_ms: u64,
    /// One command's answer on an established connection.
    pub response_timeout_ms: u64,
    /// How often a failed attempt to re-make the shared connection is repeated; calls made
    /// meanwhile wait for it. Once they are used up, the next call starts over.
    pub reconnect_retries: usize,
    /// The first delay before such a repeat, doubled (with jitter) each time, at most
    /// [`RedisSettings::RECONNECT_MAX_BACKOFF`].
    pub reconnect_backoff_ms: u64,
}

impl RedisSettings {
    /// The cap of the reconnect back-off.
    pub const RECONNECT_MAX_BACKOFF: Duration = Duration::from_secs(2);

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    pub url: String,
    /// Prefix of the exchange and queues, e.g. `agentfleet.runs`.
    pub prefix: String,
    /// The longest a publish waits for the broker's confirm, and a consumer's cancel or a
    /// connection's close for its answer. A broker that stops answering without closing
    /// anything (RabbitMQ holds publishers during a memory or disk alarm) then fails the
    /// publish (the sweeper publishes the run again later) instead of holding the run that made
    /// it, and a drain goes on.
    pub timeout_ms: u64,
}

impl AmqpSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

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
    pub auth_cache_max_keys: usize,
    /// Operator token of the admin API (`/admin/v1/…`: tenants and keys), sent as
    /// `Authorization: Bearer <token>`. Empty disables the admin API (its paths answer 404).
    pub admin_token: String,
    /// How often each replica writes the `last_used_at` of the keys it saw, all in one
    /// statement: the column is that precise, and requests never write to Postgres for it.
    pub key_last_used_flush_ms: u64,
    /// Address of the API's Prometheus metrics listener, apart from the public `listen` port
    /// (metrics are not for tenants); empty disables it.
    pub metrics_listen: String,
    /// Largest `agent.max_tokens_total` (a run's own token budget) a run may ask for.
    pub max_tokens_total: i64,
    /// Widest `from..=to` range of `GET /v1/usage`, in days.
    pub max_usage_days: u32,
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
    pub batch_progress_interval_ms: u64,
    /// Chunks of a batch in creation that may fail in a row before the items still without a
    /// run get an error (`internal_error`) and the batch moves on: a chunk failing the same
    /// way every time is not retried for ever.
    pub batch_max_chunk_failures: u32,
    /// Lease of the replica driving a batch (creating or cancelling its runs), renewed by each
    /// chunk; once expired, another replica's sweep takes the batch over.
    pub batch_lease_ms: u64,
    /// How often each replica sweeps unfinished batches: takes over batches whose lease
    /// expired, and finishes batches whose runs have all ended.
    pub batch_sweep_interval_ms: u64,
}

impl ApiSettings {
    /// What the distinct tool schemas of one request may hold together.
    pub fn schema_limits(&self) -> crate::tool_schema::Limits {
        crate::tool_schema::Limits {
            max_patterns: self.max_schema_patterns,
            max_states: self.max_schema_pattern_states,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Runs executed at once by one worker; also the consumer prefetch.
    pub concurrency: u16,
    /// A run's message stays unacknowledged while the run holds its slot, so the prefetch
    /// alone keeps deliveries to free slots. A holding longer than this acknowledges early:
    /// RabbitMQ closes a channel whose delivery stays unacknowledged past its
    /// `consumer_timeout` (30 min by default), so keep this well below it.
    pub max_delivery_hold_ms: u64,
    pub lease_ms: u64,
    pub lease_renew_ms: u64,
    pub sweep_interval_ms: u64,
    /// A `queued` run untouched this long is presumed to have lost its message.
    pub requeue_after_ms: u64,
    /// A delivery whose claim failed (Postgres down, the run's row locked elsewhere) goes back
    /// to the queue after 500 ms doubled per earlier delivery of the message
    /// (`x-delivery-count`, or `x-acquired-count` from RabbitMQ 4.3), at most this long.
    pub claim_retry_max_ms: u64,
    /// Take-overs after crashes before a run is declared poison and failed.
    pub max_recoveries: i32,
    /// Hand-backs after a transient failure (a database error) before the run is failed.
    pub max_handbacks: i32,
    /// Back-off before a run handed back after a failure is published again: this, doubled
    /// per earlier hand-back, at most 30 s.
    pub handback_backoff_ms: u64,
    pub drain_grace_ms: u64,
    pub default_max_iterations: i32,
    pub tool_timeout_ms: u64,
    /// A tool's answer is read up to this many bytes; the rest is cut off (the run sees a
    /// truncated result and a flag).
    pub max_tool_result_bytes: usize,
    /// Tool calls of one response that run at once (per run); an agent's
    /// `max_parallel_tool_calls` may lower it.
    pub max_parallel_tool_calls: usize,
    /// One model response (the whole stream) may not exceed this many bytes; a longer one
    /// fails the call.
    pub max_model_response_bytes: usize,
    /// Tool calls one model response may make (native and XML together); more make the
    /// response malformed (each would be a row, a dispatch and a result).
    pub max_tool_calls_per_response: usize,
    /// Checks one call's arguments may take against its tool's parameter schema (subschemas
    /// applied to values, every branch counted; `tool_schema::cost`); dearer arguments are
    /// refused unvalidated, and the model is told so. Bounds the work a stranger's schema and
    /// the model's arguments can make a worker do.
    pub max_argument_checks: u64,
    /// Memory (KiB, estimated from their patterns) the tool schemas with patterns that this
    /// worker holds compiled at once may take: each run compiles its tools' schemas at their
    /// first call and holds them while it runs, so strangers' schemas at the limits times the
    /// slots could otherwise take gigabytes. A call whose schema does not fit is refused
    /// (the model is told to try later); schemas without patterns are not counted.
    pub max_compiled_schema_kib: u64,
    /// The most of it one tenant's runs may hold, so one tenant's schemas cannot leave the
    /// others no room (a schema past it is refused for good).
    pub max_compiled_schema_kib_per_tenant: u64,
    /// Address of the worker's health and metrics server; empty disables it.
    pub metrics_listen: String,
    pub model_connect_timeout_ms: u64,
    pub model_first_byte_timeout_ms: u64,
    pub model_idle_timeout_ms: u64,
    pub model_total_timeout_ms: u64,
    pub model_max_retries: usize,
    pub model_retry_base_ms: u64,
    pub model_retry_max_ms: u64,
    /// A model's `Retry-After` sets the delay of a retry, up to this; it never adds retries.
    pub model_retry_after_max_ms: u64,
    /// Grouped writes (turns, tool outcomes, run ends) of one kind written at once; more wait
    /// and form the next group (`store::batch`). 1 writes one group at a time.
    pub write_groups_in_flight: usize,
    /// Most items in one grouped write.
    pub max_write_group: usize,
    /// What a run does once its tenant's daily token budget is reached: fail with
    /// `budget_exceeded`, or pause as waiting for input until a resume (after the budget was
    /// raised or a new UTC day began). A run's own budget (`agent.max_tokens_total`) always
    /// fails: nothing a resume brings could raise it.
    pub on_budget_exceeded: OnBudgetExceeded,
}

/// `worker.on_budget_exceeded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum OnBudgetExceeded {
    Fail,
    Pause,
}

impl TryFrom<String> for OnBudgetExceeded {
    type Error = String;

    /// By hand rather than serde's enum naming: its error ("does not have variant
    /// constructor") does not say which values are allowed.
    fn try_from(s: String) -> Result<OnBudgetExceeded, String> {
        match s.as_str() {
            "fail" => Ok(OnBudgetExceeded::Fail),
            "pause" => Ok(OnBudgetExceeded::Pause),
            other => Err(format!("must be `fail` or `pause`, not `{other}`")),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// Expiry of a run's event list once it pauses or ends.
    pub retention_secs: u64,
    /// `message_delta` events are flushed after this long...
    pub delta_flush_ms: u64,
    /// ...or once this many bytes of text are buffered.
    pub delta_flush_bytes: usize,
    /// Rewrite a finished message's deltas in Redis as one small header (see
    /// `compaction.rs`); replays are unchanged, the list shrinks several-fold.
    pub compact_deltas: bool,
    /// How a worker writes a compaction header: `packed` (two or three bytes a delta) or
    /// `arrays` (about six), the only form an API from before 2026-11-26 reads. Set `arrays`
    /// while such an API still serves streams (a rolling upgrade from it); every API since
    /// reads both.
    pub compact_header: CompactHeader,
    pub keepalive_secs: u64,
    pub sse_retry_ms: u64,
    /// Events buffered per SSE client before a slow client is disconnected.
    pub client_buffer: usize,
    /// How long a stream waits for the last event of a run Postgres already shows as ended,
    /// before serving that event from Postgres.
    pub final_event_grace_ms: u64,
    /// How often an idle thread stream looks in Postgres for a new run of its thread anyway. A
    /// new run is noticed from its `run_queued` (or `run_started`) event at once; this only
    /// bounds how late one is noticed whose event never reached Redis.
    pub thread_recheck_ms: u64,
    /// How often a run's stream with nothing to send looks in Postgres anyway: an end whose
    /// event never reached Redis (its worker died between the commit and the append) is
    /// noticed then, and served from Postgres after `final_event_grace_ms`.
    pub idle_recheck_ms: u64,
    /// How long the API keeps its subscription to every run's live events after the last
    /// stream it served closed (it subscribes again, at once, for the next stream).
    pub hub_linger_ms: u64,
    /// How often that subscription checks its connection with a PING: without an answer
    /// before the next one is due the API reconnects and every stream resyncs. A subscriber
    /// only listens: a connection that died without a reset would otherwise look open for
    /// ever.
    pub hub_ping_ms: u64,
    /// When Redis has lost a run's list, its ids continue this far past the last id recorded
    /// in Postgres, so an id a client saw is never handed out again (docs/events.md).
    pub lost_id_margin: u64,
}

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

/// How a run's history is compacted when the next request would exceed the model's context
/// budget: old tool results, then old messages, are cut to a head; then the oldest part is
/// summarised by the model itself (docs/tools.md, "Context management").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextSettings {
    /// Bytes kept of a compressed message (its head); the rest is read back with the built-in
    /// `expand_message` tool.
    pub keep_head_bytes: usize,
    /// A summary leaves the history at most this percentage of the budget, so the next
    /// summary is many turns away.
    pub summary_target_percent: u8,
    /// Summaries one request may need at most (each summarises what fits in one model call);
    /// past them the oldest turns are dropped.
    pub max_summary_rounds: u8,
    /// Completion tokens of a summary.
    pub summary_max_tokens: u32,
    /// The system prompt of a summarising call.
    pub summary_prompt: String,
    /// Most bytes one `expand_message` call returns (it pages with `offset`).
    pub expand_max_bytes: usize,
}

/// MCP servers: what a tenant may register, and how the worker lists their tools.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSettings {
    /// Base64 of 32 bytes: seals registered servers' header values (ChaCha20-Poly1305) in
    /// Postgres. Empty: servers can be registered without headers only. The API and every
    /// worker need the same key. A secret.
    pub encryption_key: String,
    /// How long a server's tool list is reused before it is listed again (per tenant, server
    /// and headers).
    pub tools_ttl_ms: u64,
    /// Deadline of listing a server's tools (connect, initialize, list).
    pub list_timeout_ms: u64,
    /// Most tools taken from one server; more fail the listing.
    pub max_tools_per_server: usize,
    /// Largest input schema of one MCP tool (serialized JSON); a larger one fails the listing.
    pub max_schema_bytes: usize,
    /// Patterns (`pattern`, `patternProperties` keys) one MCP tool's input schema may hold; a
    /// call to a tool with more is refused (the worker compiles each at the tool's first call).
    pub max_schema_patterns: usize,
    /// States those patterns may be estimated to compile to together
    /// (`tool_schema::pattern_states`).
    pub max_schema_pattern_states: u64,
    /// Largest listing response read from a server, and the most a whole listing (every
    /// page's names, descriptions and schemas) may hold.
    pub max_list_bytes: usize,
    /// Servers one tenant may register.
    pub max_servers_per_tenant: i64,
    /// Headers one registered server may carry, and the longest value.
    pub max_headers: usize,
    pub max_header_value_bytes: usize,
}

impl ContextSettings {
    fn check(&self) -> Result<(), ConfigError> {
        if !(10..=90).contains(&self.summary_target_percent) {
            return Err(invalid(
                "context.summary_target_percent",
                "must be within 10..=90",
            ));
        }
        if self.keep_head_bytes > 16 * 1024 {
            return Err(invalid("context.keep_head_bytes", "must be at most 16384"));
        }
        if self.expand_max_bytes < 256 {
            return Err(invalid("context.expand_max_bytes", "must be at least 256"));
        }
        if self.summary_max_tokens < 64 {
            return Err(invalid("context.summary_max_tokens", "must be at least 64"));
        }
        if self.summary_prompt.trim().is_empty() {
            return Err(invalid("context.summary_prompt", "must not be empty"));
        }
        Ok(())
    }
}

impl McpSettings {
    /// What one MCP tool's input schema may hold.
    pub fn schema_limits(&self) -> crate::tool_schema::Limits {
        crate::tool_schema::Limits {
            max_patterns: self.max_schema_patterns,
            max_states: self.max_schema_pattern_states,
        }
    }

    /// The sealing key, when one is configured.
    pub fn key(&self) -> Result<Option<[u8; 32]>, ConfigError> {
        use base64::Engine;
        if self.encryption_key.is_empty() {
            return Ok(None);
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.encryption_key.trim())
            .map_err(|_| invalid("mcp.encryption_key", "is not base64"))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|_| invalid("mcp.encryption_key", "must be base64 of exactly 32 bytes"))?;
        Ok(Some(key))
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.key()?;
        for (key, n) in [
            ("mcp.tools_ttl_ms", self.tools_ttl_ms),
            ("mcp.list_timeout_ms", self.list_timeout_ms),
            ("mcp.max_tools_per_server", self.max_tools_per_server as u64),
            ("mcp.max_schema_bytes", self.max_schema_bytes as u64),
            ("mcp.max_schema_patterns", self.max_schema_patterns as u64),
            (
                "mcp.max_schema_pattern_states",
                self.max_schema_pattern_states,
            ),
            ("mcp.max_list_bytes", self.max_list_bytes as u64),
            (
                "mcp.max_servers_per_tenant",
                self.max_servers_per_tenant.max(0) as u64,
            ),
            (
                "mcp.max_header_value_bytes",
                self.max_header_value_bytes as u64,
            ),
        ] {
            if n == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        if self.max_headers > 64 {
            return Err(invalid("mcp.max_headers", "must be within 0..=64"));
        }
        Ok(())
    }
}

/// Webhooks: what a tenant may register, and how the API's deliverer sends.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Whether this API replica sends deliveries (any number of replicas may; each claims
    /// its own rows). Registration works either way.
    pub enabled: bool,
    /// How often the deliverer looks for due deliveries when nothing wakes it sooner (a
    /// change that wrote deliveries notifies it on commit).
    pub poll_interval_ms: u64,
    /// The deadline of one delivery attempt (connect, send, status line).
    pub timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Attempts in flight at once per replica.
    pub max_concurrency: usize,
    /// How long a claimed delivery is reserved for its replica: past it, a replica that died
    /// between claim and send has its delivery sent by another. Above `timeout_ms`.
    pub claim_lease_ms: u64,
    /// Retry delay after the first failure; it doubles each attempt (with jitter) up to
    /// `backoff_max_ms`.
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    /// A delivery not acknowledged this long after its change is given up (`failed`).
    pub retry_for_ms: u64,
    /// A delivery is given up after this many attempts, whatever its age.
    pub max_attempts: i32,
    /// Bytes of a receiver's answer that are read (for the delivery's `last_error`); the rest
    /// is dropped unread.
    pub max_response_bytes: usize,
    pub max_endpoints_per_tenant: u32,
    pub max_url_bytes: usize,
    /// Delivered and given-up deliveries are removed this long after they finished (the
    /// deliveries listing shows them until then).
    pub keep_finished_ms: u64,
}

impl WebhookSettings {
    fn check(&self) -> Result<(), ConfigError> {
        for (key, v) in [
            ("webhooks.poll_interval_ms", self.poll_interval_ms),
            ("webhooks.timeout_ms", self.timeout_ms),
            ("webhooks.connect_timeout_ms", self.connect_timeout_ms),
            ("webhooks.backoff_base_ms", self.backoff_base_ms),
            ("webhooks.retry_for_ms", self.retry_for_ms),
            ("webhooks.keep_finished_ms", self.keep_finished_ms),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        if self.claim_lease_ms <= self.timeout_ms {
            return Err(invalid(
                "webhooks.claim_lease_ms",
                "must exceed webhooks.timeout_ms (a live attempt must not be claimed again)",
            ));
        }
        if self.backoff_max_ms < self.backoff_base_ms {
            return Err(invalid(
                "webhooks.backoff_max_ms",
                "must be at least webhooks.backoff_base_ms",
            ));
        }
        if !(1..=1024).contains(&self.max_concurrency) {
            return Err(invalid(
                "webhooks.max_concurrency",
                "must be within 1..=1024",
            ));
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return Err(invalid("webhooks.max_attempts", "must be within 1..=1000"));
        }
        if self.max_response_bytes > 1 << 20 {
            return Err(invalid(
                "webhooks.max_response_bytes",
                "must be at most 1048576",
            ));
        }
        if !(1..=10_000).contains(&self.max_endpoints_per_tenant) {
            return Err(invalid(
                "webhooks.max_endpoints_per_tenant",
                "must be within 1..=10000",
            ));
        }
        if !(16..=2048).contains(&self.max_url_bytes) {
            return Err(invalid(
                "webhooks.max_url_bytes",
                "must be within 16..=2048",
            ));
        }
        Ok(())
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupSettings {
    /// How long a binary waits for Postgres, Redis and RabbitMQ at start-up, retrying with
    /// back-off, before it exits naming the server it could not reach.
    pub dependency_wait_ms: u64,
}

impl StartupSettings {
    pub fn dependency_wait(&self) -> Duration {
        Duration::from_millis(self.dependency_wait_ms)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// OpenAI-compatible base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    #[serde(default)]
    pub api_key: String,
    /// The model id sent upstream.
    pub model: String,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Context budget in tokens for the prompt.
    #[serde(default = "default_context_tokens")]
    pub context_tokens: usize,
    /// How the worker counts this model's tokens to keep requests within `context_tokens`.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// How the model calls tools: `native` (the request's `tools`, the answer's `tool_calls`)
    /// or `xml` (described in the system prompt, written in the answer's text).
    #[serde(default)]
    pub tool_calling: ToolCalling,
    /// `chat_completions_url`'s answer, parsed at its first call.
    #[serde(skip)]
    chat_url: std::sync::OnceLock<Option<url::Url>>,
}

impl ModelSettings {
    /// `{base_url}/chat/completions`, parsed once for the life of the settings (reqwest would
    /// parse the text again on every call). `None` when it does not parse: the caller passes
    /// the text on and reqwest names the error.
    pub fn chat_completions_url(&self) -> Option<&url::Url> {
        self.chat_url
            .get_or_init(|| url::Url::parse(&self.chat_completions_text()).ok())
            .as_ref()
    }

    /// `{base_url}/chat/completions` as text.
    pub fn chat_completions_text(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

/// The stored form of a compaction header (`events.compact_header`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactHeader {
    #[default]
    Packed,
    Arrays,
}

/// How a model calls tools (docs/tools.md, "Models without native tool calls").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCalling {
    #[default]
    Native,
    Xml,
}

/// A model's tokenizer: the exact encoding of OpenAI-family models, or an estimate of 4 bytes
/// a token for models whose tokenizer the worker does not have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// GPT-4o, GPT-4.1, o-series and later.
    #[default]
    O200kBase,
    /// GPT-4, GPT-3.5.
    Cl100kBase,
    /// 4 bytes a token: an estimate, not a bound (a margin in `context_tokens` is advisable).
    Estimate,
}

fn default_context_tokens() -> usize {
    100_000
}

const DEFAULTS: &str = r#"
[database]
url = "postgres://postgres@127.0.0.1:5432/agentfleet"
max_connections = 20
connect_timeout_ms = 5000
migrate_on_start = false
migration_lock_timeout_ms = 2000
migration_attempts = 30
idle_in_transaction_timeout_ms = 5000
statement_timeout_ms = 10000
lock_timeout_ms = 5000
generic_plans = true
agent_cache_kib = 4096

[redis]
url = "redis://127.0.0.1:6379"
prefix = "agentfleet"
timeout_ms = 2000
connect_timeout_ms = 1000
response_timeout_ms = 500
reconnect_retries = 2
reconnect_backoff_ms = 100

[amqp]
url = "amqp://guest:guest@127.0.0.1:5672/%2f"
prefix = "agentfleet"
timeout_ms = 5000

[api]
listen = "127.0.0.1:8080"
max_body_bytes = 1048576
max_input_bytes = 262144
max_batch_runs = 1000
max_queued_per_thread = 10
max_streams_per_tenant = 1000
create_groups_in_flight = 1
max_create_group = 64
max_tools_per_agent = 64
max_schema_patterns = 256
max_schema_pattern_states = 100000
max_schema_compiles = 2
max_remembered_schemas = 10000
max_metadata_bytes = 16384
default_page_size = 50
max_page_size = 500
count_window = 10000
console = true
request_timeout_ms = 30000
stream_token_secret = ""
stream_token_ttl_secs = 900
cors_allowed_origins = ""
auth_cache_ttl_ms = 5000
auth_cache_max_keys = 10000
admin_token = ""
key_last_used_flush_ms = 60000
metrics_listen = ""
max_tokens_total = 1000000000
max_usage_days = 366
max_batch_items = 10000
max_batch_body_bytes = 33554432
max_json_values = 1000000
batch_chunk_size = 500
batch_progress_interval_ms = 1000
batch_lease_ms = 10000
batch_max_chunk_failures = 5
batch_sweep_interval_ms = 1000

[worker]
concurrency = 16
max_delivery_hold_ms = 600000
lease_ms = 10000
lease_renew_ms = 3000
sweep_interval_ms = 2000
requeue_after_ms = 15000
claim_retry_max_ms = 10000
max_recoveries = 3
max_handbacks = 5
handback_backoff_ms = 500
drain_grace_ms = 30000
default_max_iterations = 25
tool_timeout_ms = 30000
max_tool_result_bytes = 65536
max_parallel_tool_calls = 8
max_model_response_bytes = 8388608
max_tool_calls_per_response = 128
max_argument_checks = 50000
max_compiled_schema_kib = 262144
max_compiled_schema_kib_per_tenant = 65536
metrics_listen = ""
model_connect_timeout_ms = 5000
model_first_byte_timeout_ms = 60000
model_idle_timeout_ms = 30000
model_total_timeout_ms = 600000
model_max_retries = 4
model_retry_base_ms = 200
model_retry_max_ms = 10000
model_retry_after_max_ms = 30000
write_groups_in_flight = 1
max_write_group = 64
on_budget_exceeded = "fail"

[events]
retention_secs = 86400
delta_flush_ms = 50
delta_flush_bytes = 512
compact_deltas = true
compact_header = "packed"
keepalive_secs = 15
sse_retry_ms = 2000
client_buffer = 1024
final_event_grace_ms = 2000
thread_recheck_ms = 10000
idle_recheck_ms = 10000
hub_ping_ms = 5000
hub_linger_ms = 30000
lost_id_margin = 100000

[telemetry]
otlp_endpoint = ""
service_name = "agentfleet"
log_format = "auto"
trace_filter = "warn,agentfleet_api=info,agentfleet_worker=info,agentfleet_shared=info"

[startup]
dependency_wait_ms = 60000

[egress]
allow = ""
max_redirects = 0

[limits]
requests_per_second = 0
request_burst = 0
max_active_runs = 0
max_running_runs = 0
max_batch_size = 0
tokens_per_day = 0

[rate_limit]
redis_timeout_ms = 250
local_only_ms = 1000
local_max_tenants = 10000

[webhooks]
enabled = true
poll_interval_ms = 1000
timeout_ms = 10000
connect_timeout_ms = 5000
max_concurrency = 16
claim_lease_ms = 30000
backoff_base_ms = 5000
backoff_max_ms = 3600000
retry_for_ms = 86400000
max_attempts = 100
max_response_bytes = 4096
max_endpoints_per_tenant = 20
max_url_bytes = 2048
keep_finished_ms = 604800000

[context]
keep_head_bytes = 400
summary_target_percent = 50
max_summary_rounds = 3
summary_max_tokens = 1024
summary_prompt = "You compress the earlier part of a conversation between a user and an AI agent that uses tools. Write a faithful summary that the agent can continue from: the user's goals and constraints, decisions taken, facts and figures learned from tools (keep exact identifiers, numbers and names), what is done and what is still open. Write plain text, no preamble."
expand_max_bytes = 8192

[mcp]
encryption_key = ""
tools_ttl_ms = 60000
list_timeout_ms = 10000
max_tools_per_server = 128
max_schema_bytes = 65536
max_schema_patterns = 64
max_schema_pattern_states = 20000
max_list_bytes = 4194304
max_servers_per_tenant = 20
max_headers = 8
max_header_value_bytes = 4096
"#;

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

    fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = crate::egress::EgressPolicy::parse(&self.egress.allow) {
            return Err(invalid("egress.allow", e));
        }
        self.webhooks.check()?;
        self.mcp.check()?;
        self.context.check()?;
        if self.worker.max_parallel_tool_calls == 0 {
            return Err(invalid(
                "worker.max_parallel_tool_calls",
                "must be at least 1",
            ));
        }
        if self.startup.dependency_wait_ms == 0 {
            return Err(invalid(
                "startup.dependency_wait_ms",
                "must be positive (one attempt takes up to 10 s)",
            ));
        }
        if self.events.lost_id_margin < 1000 {
            return Err(invalid(
                "events.lost_id_margin",
                "must be at least 1000 (it must exceed the events appended between two records)",
            ));
        }
        if self.egress.max_redirects > 10 {
            return Err(invalid("egress.max_redirects", "must be within 0..=10"));
        }
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        for (key, ms) in [
            ("amqp.timeout_ms", self.amqp.timeout_ms),
            ("redis.timeout_ms", self.redis.timeout_ms),
            ("redis.connect_timeout_ms", self.redis.connect_timeout_ms),
            ("redis.response_timeout_ms", self.redis.response_timeout_ms),
        ] {
            if ms == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        if !name_ok(&self.redis.prefix) {
            return Err(invalid("redis.prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        if !name_ok(&self.amqp.prefix) {
            return Err(invalid("amqp.prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        if let Err(e) = self.limits.check() {
            return Err(invalid(&format!("limits.{}", e.field), e.message));
        }
        if self.rate_limit.redis_timeout_ms == 0 {
            return Err(invalid("rate_limit.redis_timeout_ms", "must be positive"));
        }
        if self.rate_limit.local_max_tenants == 0 {
            return Err(invalid(
                "rate_limit.local_max_tenants",
                "must be at least 1",
            ));
        }
        if self.api.auth_cache_max_keys == 0 {
            return Err(invalid("api.auth_cache_max_keys", "must be at least 1"));
        }
        if self.api.key_last_used_flush_ms == 0 {
            return Err(invalid("api.key_last_used_flush_ms", "must be positive"));
        }
        if !self.api.admin_token.is_empty() && self.api.admin_token.len() < 16 {
            return Err(invalid(
                "api.admin_token",
                "must be empty (admin API disabled) or at least 16 characters",
            ));
        }
        if self.api.max_tokens_total < 1 {
            return Err(invalid("api.max_tokens_total", "must be at least 1"));
        }
        if self.api.max_usage_days == 0 {
            return Err(invalid("api.max_usage_days", "must be at least 1"));
        }
        if !(1..=1_000_000).contains(&self.api.max_batch_items) {
            return Err(invalid("api.max_batch_items", "must be within 1..=1000000"));
        }
        if self.api.max_json_values < 1000 {
            return Err(invalid("api.max_json_values", "must be at least 1000"));
        }
        if self.api.max_batch_body_bytes < self.api.max_body_bytes {
            return Err(invalid(
                "api.max_batch_body_bytes",
                "must be at least api.max_body_bytes",
            ));
        }
        if !(1..=100).contains(&self.api.batch_max_chunk_failures) {
            return Err(invalid(
                "api.batch_max_chunk_failures",
                "must be within 1..=100",
            ));
        }
        if !(1..=10_000).contains(&self.api.batch_chunk_size) {
            return Err(invalid("api.batch_chunk_size", "must be within 1..=10000"));
        }
        for (key, ms) in [
            (
                "api.batch_progress_interval_ms",
                self.api.batch_progress_interval_ms,
            ),
            (
                "api.batch_sweep_interval_ms",
                self.api.batch_sweep_interval_ms,
            ),
        ] {
            if ms == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        if self.api.batch_lease_ms < 2 * self.api.batch_sweep_interval_ms.max(1000) {
            return Err(invalid(
                "api.batch_lease_ms",
                "must be at least twice api.batch_sweep_interval_ms, and at least 2000",
            ));
        }
        if self.worker.concurrency == 0 {
            return Err(invalid("worker.concurrency", "must be at least 1"));
        }
        if !(1_000..=1_500_000).contains(&self.worker.max_delivery_hold_ms) {
            return Err(invalid(
                "worker.max_delivery_hold_ms",
                "must be between 1000 and 1500000 (below RabbitMQ's default consumer_timeout of 30 min)",
            ));
        }
        if self.worker.lease_renew_ms == 0 || self.worker.lease_renew_ms * 2 > self.worker.lease_ms
        {
            return Err(invalid(
                "worker.lease_renew_ms",
                "must be positive and at most half of worker.lease_ms",
            ));
        }
        if self.database.idle_in_transaction_timeout_ms == 0
            || self.database.idle_in_transaction_timeout_ms >= self.worker.lease_ms
        {
            return Err(invalid(
                "database.idle_in_transaction_timeout_ms",
                "must be positive and below worker.lease_ms",
            ));
        }
        if !(500..=600_000).contains(&self.worker.claim_retry_max_ms) {
            return Err(invalid(
                "worker.claim_retry_max_ms",
                "must be within 500..=600000",
            ));
        }
        if !(1..=1024).contains(&self.worker.max_tool_calls_per_response) {
            return Err(invalid(
                "worker.max_tool_calls_per_response",
                "must be within 1..=1024",
            ));
        }
        if !(1_024..=16_777_216).contains(&self.worker.max_compiled_schema_kib) {
            return Err(invalid(
                "worker.max_compiled_schema_kib",
                "must be within 1024..=16777216",
            ));
        }
        if self.worker.max_compiled_schema_kib_per_tenant < 1_024
            || self.worker.max_compiled_schema_kib_per_tenant > self.worker.max_compiled_schema_kib
        {
            return Err(invalid(
                "worker.max_compiled_schema_kib_per_tenant",
                "must be within 1024..=worker.max_compiled_schema_kib",
            ));
        }
        if !(1_000..=1_000_000).contains(&self.worker.max_argument_checks) {
            return Err(invalid(
                "worker.max_argument_checks",
                "must be within 1000..=1000000",
            ));
        }
        if self.worker.max_recoveries < 0 {
            return Err(invalid("worker.max_recoveries", "must not be negative"));
        }
        if !(1..=10_000).contains(&self.worker.default_max_iterations) {
            return Err(invalid(
                "worker.default_max_iterations",
                "must be within 1..=10000",
            ));
        }
        if self.api.max_page_size == 0 || self.api.default_page_size > self.api.max_page_size {
            return Err(invalid(
                "api.default_page_size",
                "must be within 1..=api.max_page_size",
            ));
        }
        if !(1..=1_000_000).contains(&self.api.count_window) {
            return Err(invalid("api.count_window", "must be within 1..=1000000"));
        }
        if self.api.max_schema_patterns > 100_000 {
            return Err(invalid(
                "api.max_schema_patterns",
                "must be within 0..=100000",
            ));
        }
        if self.api.max_schema_pattern_states > 10_000_000 {
            return Err(invalid(
                "api.max_schema_pattern_states",
                "must be within 0..=10000000",
            ));
        }
        if !(1..=64).contains(&self.api.max_schema_compiles) {
            return Err(invalid("api.max_schema_compiles", "must be within 1..=64"));
        }
        if self.database.migration_lock_timeout_ms > 600_000 {
            return Err(invalid(
                "database.migration_lock_timeout_ms",
                "must be within 0..=600000 (0: no limit)",
            ));
        }
        if !(1..=1000).contains(&self.database.migration_attempts) {
            return Err(invalid(
                "database.migration_attempts",
                "must be within 1..=1000",
            ));
        }
        if self.database.agent_cache_kib > 1_048_576 {
            return Err(invalid(
                "database.agent_cache_kib",
                "must be within 0..=1048576 (1 GiB)",
            ));
        }
        if self.api.max_remembered_schemas > 1_000_000 {
            return Err(invalid(
                "api.max_remembered_schemas",
                "must be within 0..=1000000",
            ));
        }
        if !(1..=1_000_000).contains(&self.api.max_streams_per_tenant) {
            return Err(invalid(
                "api.max_streams_per_tenant",
                "must be within 1..=1000000",
            ));
        }
        if !(1..=1000).contains(&self.api.max_queued_per_thread) {
            return Err(invalid(
                "api.max_queued_per_thread",
                "must be within 1..=1000",
            ));
        }
        if self.api.max_input_bytes > self.api.max_body_bytes {
            return Err(invalid(
                "api.max_input_bytes",
                "must not exceed api.max_body_bytes",
            ));
        }
        if self.events.client_buffer == 0 {
            return Err(invalid("events.client_buffer", "must be at least 1"));
        }
        for (name, ms) in [
            ("events.hub_linger_ms", self.events.hub_linger_ms),
            ("events.hub_ping_ms", self.events.hub_ping_ms),
            ("events.idle_recheck_ms", self.events.idle_recheck_ms),
            ("events.thread_recheck_ms", self.events.thread_recheck_ms),
        ] {
            if !(100..=3_600_000).contains(&ms) {
                return Err(invalid(name, "must be within 100..=3600000"));
            }
        }
        if !matches!(
            self.telemetry.log_format.as_str(),
            "auto" | "json" | "pretty"
        ) {
            return Err(invalid(
                "telemetry.log_format",
                "must be `auto`, `json` or `pretty`",
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.telemetry.trace_filter) {
            return Err(invalid(
                "telemetry.trace_filter",
                format!("is not a valid filter directive: {e}"),
            ));
        }
        for (name, model) in &self.models {
            let key = format!("models.{name}.base_url");
            if !(model.base_url.starts_with("http://") || model.base_url.starts_with("https://")) {
                return Err(invalid(&key, "must be an http(s) URL"));
            }
            if model.model.is_empty() {
                return Err(invalid(
                    &format!("models.{name}.model"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }
}

impl WorkerSettings {
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    pub fn lease_renew(&self) -> Duration {
        Duration::from_millis(self.lease_renew_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(overrides: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::load_with(
            None,
            overrides
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
            false,
        )
    }

    #[test]
    fn defaults_are_valid() {
        let s = load(&[]).unwrap();
        assert_eq!(s.redis.prefix, "agentfleet");
        assert_eq!(s.worker.lease_ms, 10_000);
        assert_eq!(s.events.retention_secs, 86_400);
    }

    #[test]
    fn the_lock_time_out_stays_below_the_statement_time_out_or_off() {
        let effective = |lock: &str, statement: &str| {
            load(&[
                ("database.lock_timeout_ms", lock),
                ("database.statement_timeout_ms", statement),
            ])
            .unwrap()
            .database
            .lock_timeout()
        };
        assert_eq!(load(&[]).unwrap().database.lock_timeout(), 5000);
        let migration =
            |pairs: &[(&str, &str)]| load(pairs).unwrap().database.migration_lock_timeout();
        assert_eq!(migration(&[]), 2000, "within the fleet's default");
        assert_eq!(
            migration(&[("database.lock_timeout_ms", "1000")]),
            500,
            "half of the fleet's: a statement queued behind it never fails first"
        );
        assert_eq!(
            migration(&[("database.lock_timeout_ms", "0")]),
            2000,
            "the fleet waits forever"
        );
        assert_eq!(migration(&[("database.migration_lock_timeout_ms", "0")]), 0);
        assert_eq!(effective("4000", "10000"), 4000);
        assert_eq!(effective("10000", "10000"), 5000, "capped at half");
        assert_eq!(effective("5000", "500"), 250, "capped at half");
        assert_eq!(
            effective("5000", "1"),
            1,
            "never 0 (which would mean never)"
        );
        assert_eq!(effective("5000", "0"), 5000, "statements without a limit");
        assert_eq!(effective("0", "500"), 0, "off");
    }

    #[test]
    fn the_budget_setting_is_fail_or_pause_naming_the_key() {
        assert_eq!(
            load(&[]).unwrap().worker.on_budget_exceeded,
            OnBudgetExceeded::Fail
        );
        let s = load(&[("worker.on_budget_exceeded", "pause")]).unwrap();
        assert_eq!(s.worker.on_budget_exceeded, OnBudgetExceeded::Pause);
        let err = load(&[("worker.on_budget_exceeded", "wait")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("worker.on_budget_exceeded"), "{err}");
        assert!(err.contains("`fail`") && err.contains("`pause`"), "{err}");
    }

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

    #[test]
    fn webhook_settings_are_checked_naming_the_key() {
        let s = load(&[]).unwrap();
        assert_eq!(s.webhooks.retry_for_ms, 86_400_000);
        let err = load(&[("webhooks.claim_lease_ms", "10000")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`webhooks.claim_lease_ms`"), "{err}");
        let err = load(&[("webhooks.backoff_max_ms", "1")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`webhooks.backoff_max_ms`"), "{err}");
    }

    #[test]
    fn invalid_value_names_the_key() {
        let err = load(&[("worker.concurrency", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("worker.concurrency"), "{err}");
        let err = load(&[("worker.lease_ms", "not-a-number")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("lease_ms"), "{err}");
        let err = load(&[("telemetry.trace_filter", "agentfleet_worker=loud")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("telemetry.trace_filter"), "{err}");
        let err = load(&[("api.max_remembered_schemas", "1000001")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("api.max_remembered_schemas"), "{err}");
        assert_eq!(
            load(&[("api.max_remembered_schemas", "0")])
                .unwrap()
                .api
                .max_remembered_schemas,
            0
        );
    }

    #[test]
    fn request_limits_are_checked_naming_the_key() {
        let s = load(&[]).unwrap();
        assert_eq!(
            s.limits.requests_per_second, 0,
            "unlimited unless configured"
        );
        let err = load(&[
            ("limits.requests_per_second", "100"),
            ("limits.request_burst", "10"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("`limits.request_burst`"), "{err}");
        let err = load(&[("limits.request_burst", "10")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`limits.request_burst`"), "{err}");
        let err = load(&[("rate_limit.redis_timeout_ms", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`rate_limit.redis_timeout_ms`"), "{err}");
        assert!(
            load(&[
                ("limits.requests_per_second", "100"),
                ("limits.request_burst", "0")
            ])
            .is_ok()
        );
    }

    #[test]
    fn models_are_configured_by_name() {
        let s = load(&[
            ("models.fast.base_url", "http://127.0.0.1:1/v1"),
            ("models.fast.model", "gpt-x"),
        ])
        .unwrap();
        assert_eq!(s.models["fast"].model, "gpt-x");
        let err = load(&[
            ("models.bad.base_url", "ftp://x"),
            ("models.bad.model", "m"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("models.bad.base_url"), "{err}");
    }
}
