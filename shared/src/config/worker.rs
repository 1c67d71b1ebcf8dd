//! `[worker]`: what one worker runs at once, its leases and sweeps, and the limits of a run's
//! model calls and tool calls.

use std::num::{NonZeroU16, NonZeroUsize};
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Runs one worker executes at once (its slots); also the consumer prefetch.
    pub concurrency: NonZeroU16,
    /// A run's message stays unacknowledged while the run holds its slot, so the prefetch alone
    /// keeps deliveries to free slots. A holding longer than this acknowledges early: RabbitMQ
    /// closes a channel whose delivery stays unacknowledged past its `consumer_timeout` (30 min by
    /// default), so keep this well below it. 1000–1500000.
    pub max_delivery_hold_ms: u64,
    /// Lease a worker takes on a run it claims: a run whose lease expired (its worker died, froze
    /// or was cut off) is re-enqueued by the sweeper, and the next attempt emits `run_recovered`.
    pub lease_ms: u64,
    /// How often a worker renews the leases of its runs; positive, and at most half of
    /// `worker.lease_ms`.
    pub lease_renew_ms: u64,
    /// How often the sweeper runs (in one worker at a time): it re-enqueues runs whose lease
    /// expired and queued runs whose message seems lost, and dispatches held runs of tenants with
    /// room in their running limit.
    pub sweep_interval_ms: u64,
    /// A `queued` run whose message was published this long ago and is still untouched is presumed
    /// to have lost its message, and is published again by the sweeper.
    pub requeue_after_ms: u64,
    /// A delivery whose claim failed (Postgres down, the run's row locked elsewhere) goes back to
    /// the queue after 500 ms doubled per earlier delivery of the message (the quorum queue's
    /// `x-delivery-count`, or `x-acquired-count` from RabbitMQ 4.3), at most this long; each
    /// failure counts in `agentfleet_claim_failures_total`. 500–600000.
    pub claim_retry_max_ms: u64,
    /// Take-overs after crashes before a run is quarantined: from then on each of its attempts
    /// runs alone in a worker, and if that worker dies holding it the run is poison: failed
    /// (`poison_run`) and its message dead-lettered. At least 0.
    pub max_recoveries: i32,
    /// Hand-backs after a transient failure (a database error) before the run is failed.
    pub max_handbacks: i32,
    /// Back-off before a run handed back after a failure is published again: this, doubled per
    /// earlier hand-back, at most 30 s.
    pub handback_backoff_ms: u64,
    /// On SIGTERM a worker stops taking runs and lets in-flight iterations finish within this long,
    /// then hands unfinished runs back to the queue without counting a recovery, and exits 0. An
    /// iteration cut short is redone elsewhere.
    pub drain_grace_ms: u64,
    /// Model calls a run makes at most when its agent names no `max_iterations`. 1–10000.
    pub default_max_iterations: i32,
    /// Deadline of one tool call when its tool names no `timeout_ms`.
    pub tool_timeout_ms: u64,
    /// A tool's answer (http or MCP) is read up to this many bytes; the rest is cut off (the run
    /// sees a truncated result and a flag).
    pub max_tool_result_bytes: usize,
    /// Tool calls of one response that run at once (per run); an agent's `max_parallel_tool_calls`
    /// may lower it (docs/tools.md).
    pub max_parallel_tool_calls: NonZeroUsize,
    /// The largest model response (the whole stream) accepted; a longer one fails the call.
    pub max_model_response_bytes: usize,
    /// Tool calls one model response may make (native and XML together); a response with more is
    /// malformed and fails the model call (each would be a row, a dispatch and a result). 1–1024.
    pub max_tool_calls_per_response: usize,
    /// Checks one call's arguments may take against its tool's parameter schema (subschemas applied
    /// to values, every branch counted; `tool_schema::cost`); dearer arguments are refused
    /// unvalidated, and the model is told so (docs/tools.md). Bounds the work a stranger's schema
    /// and the model's arguments can make a worker do. 1000–1000000.
    pub max_argument_checks: u64,
    /// Memory (KiB, estimated: ~160 KiB a pattern with its DFA caches, ~80 bytes a state) that the
    /// tool schemas with patterns compiled by one worker's runs may hold together: each run
    /// compiles its tools' schemas at their first call and holds them while it runs, so strangers'
    /// schemas at the limits times the slots could otherwise take gigabytes. A call whose schema
    /// does not fit is refused for now and the model told to try again; schemas without patterns
    /// are not counted. 1024–16777216.
    pub max_compiled_schema_kib: u64,
    /// The most of it one tenant's runs may hold, so one tenant's schemas cannot leave the others
    /// no room (a schema past it is refused for good). 1024 to `worker.max_compiled_schema_kib`.
    pub max_compiled_schema_kib_per_tenant: u64,
    /// Address of the worker's health and Prometheus metrics server, e.g. `0.0.0.0:9090`; empty
    /// disables it.
    pub metrics_listen: String,
    /// Deadline of connecting to a model's server (and of a tool call's connect).
    pub model_connect_timeout_ms: u64,
    /// HTTP/2 streams (model calls in flight) a worker puts on one connection to a model server
    /// at most: it keeps `ceil(worker.concurrency / this)` clients and gives each call the one
    /// with the fewest calls in flight. Keep it at or below what the model's gateway allows on a
    /// connection (its `SETTINGS_MAX_CONCURRENT_STREAMS`, commonly 100–256): calls beyond that
    /// would wait for a stream to end. Over HTTP/1.1 each call holds a connection of its own
    /// anyway.
    pub model_streams_per_connection: NonZeroUsize,
    /// Deadline of the first byte of a model's answer (its status and headers) once the request is
    /// sent.
    pub model_first_byte_timeout_ms: u64,
    /// The longest silence between two chunks of a model's streamed answer.
    pub model_idle_timeout_ms: u64,
    /// Deadline of one whole model call: every attempt, the back-offs between them and the streamed
    /// answer.
    pub model_total_timeout_ms: u64,
    /// Retries of a model call on 429, 5xx and connection errors (back-off with jitter,
    /// `Retry-After` honoured); 0 never retries.
    pub model_max_retries: usize,
    /// The first retry's back-off, doubled each retry (with jitter).
    pub model_retry_base_ms: u64,
    /// The longest back-off between two retries.
    pub model_retry_max_ms: u64,
    /// A model's `Retry-After` sets the delay of a retry, up to this; it never adds retries beyond
    /// `worker.model_max_retries`.
    pub model_retry_after_max_ms: u64,
    /// Grouped writes of one kind (model turns, tool outcomes, run ends) a worker has in flight at
    /// once; further writes wait and are written together as the next group (`store::group_commit`). Each
    /// group in flight keeps its own Postgres connection, outside `database.max_connections` (sqlx
    /// checks a pooled connection with a round trip each time it takes it back).
    pub write_groups_in_flight: usize,
    /// Most writes in one group (one statement, one commit).
    pub max_write_group: usize,
    /// What a run does once its tenant's daily token budget (`limits.tokens_per_day`) is reached. A
    /// run's own budget (`agent.max_tokens_total`) always fails: nothing a resume brings could
    /// raise it.
    pub on_budget_exceeded: OnBudgetExceeded,
}

/// `worker.on_budget_exceeded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum OnBudgetExceeded {
    /// The run fails with `budget_exceeded`.
    Fail,
    /// The run pauses (`waiting_for_input`, pending kind `budget`) until a resume with
    /// `{"input"}`, after the budget was raised or a new UTC day began.
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

impl WorkerSettings {
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    pub fn lease_renew(&self) -> Duration {
        Duration::from_millis(self.lease_renew_ms)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1_000..=1_500_000).contains(&self.max_delivery_hold_ms) {
            return Err(invalid(
                "worker.max_delivery_hold_ms",
                "must be between 1000 and 1500000 (below RabbitMQ's default consumer_timeout of 30 min)",
            ));
        }
        if self.lease_renew_ms == 0 || self.lease_renew_ms * 2 > self.lease_ms {
            return Err(invalid(
                "worker.lease_renew_ms",
                "must be positive and at most half of worker.lease_ms",
            ));
        }
        if !(500..=600_000).contains(&self.claim_retry_max_ms) {
            return Err(invalid(
                "worker.claim_retry_max_ms",
                "must be within 500..=600000",
            ));
        }
        if !(1..=1024).contains(&self.max_tool_calls_per_response) {
            return Err(invalid(
                "worker.max_tool_calls_per_response",
                "must be within 1..=1024",
            ));
        }
        if !(1_024..=16_777_216).contains(&self.max_compiled_schema_kib) {
            return Err(invalid(
                "worker.max_compiled_schema_kib",
                "must be within 1024..=16777216",
            ));
        }
        if self.max_compiled_schema_kib_per_tenant < 1_024
            || self.max_compiled_schema_kib_per_tenant > self.max_compiled_schema_kib
        {
            return Err(invalid(
                "worker.max_compiled_schema_kib_per_tenant",
                "must be within 1024..=worker.max_compiled_schema_kib",
            ));
        }
        if !(1_000..=1_000_000).contains(&self.max_argument_checks) {
            return Err(invalid(
                "worker.max_argument_checks",
                "must be within 1000..=1000000",
            ));
        }
        if self.max_recoveries < 0 {
            return Err(invalid("worker.max_recoveries", "must not be negative"));
        }
        if !(1..=10_000).contains(&self.default_max_iterations) {
            return Err(invalid(
                "worker.default_max_iterations",
                "must be within 1..=10000",
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
}
