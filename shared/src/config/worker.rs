//! `[worker]`: what one worker runs at once, its leases and sweeps, and the limits of a run's
//! model calls and tool calls.

use std::num::{NonZeroU16, NonZeroUsize};
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Runs executed at once by one worker; also the consumer prefetch.
    pub concurrency: NonZeroU16,
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
    pub max_parallel_tool_calls: NonZeroUsize,
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
