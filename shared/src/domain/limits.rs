//! What one tenant may use of the fleet.
//!
//! [`Limits`] is the `[limits]` section of the configuration: the default of every tenant.
//! [`LimitOverrides`] is what an operator set for one tenant (`tenants.limits` in Postgres);
//! a field it leaves out falls back to the default. In both, 0 means "no limit".

use serde::{Deserialize, Serialize};

/// Effective limits of a tenant (or the configured defaults). 0 disables a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// API requests per second on `/v1` (token bucket refill rate), shared by every API replica; 0:
    /// no limit, at most 1000000. The default stops a runaway client, not a busy one: about a
    /// fifth of what one API replica creates per second, far above what a product's users send
    /// through one key. Past it: 429 `rate_limited`.
    pub requests_per_second: u32,
    /// Requests the bucket holds: how large a burst may be after a quiet period. 0 is one second's
    /// worth; when set, at least `requests_per_second` (and only with a rate).
    pub request_burst: u32,
    /// Runs not yet ended (queued, running, waiting) a tenant may have at once; a create beyond it
    /// is 429 `too_many_active_runs`. 0: no limit. The default holds five of the largest batches
    /// (`api.max_batch_items`) and bounds what one tenant can pile up in Postgres.
    pub max_active_runs: u32,
    /// Runs of the tenant dispatched to workers at once (queued and published, or running); its
    /// other runs wait `held` in Postgres and are dispatched in turn (fair dispatch). 0: off.
    pub max_running_runs: u32,
    /// Most runs in one batch of the tenant, within `api.max_batch_runs` (`POST /v1/runs/batch`) or
    /// `api.max_batch_items` (`POST /v1/batches`). 0: no limit beyond those.
    pub max_batch_size: u32,
    /// Model tokens (prompt + completion, estimated ones included) per UTC day; a run that reaches
    /// it fails with `budget_exceeded` before its next model call (or pauses:
    /// `worker.on_budget_exceeded`). 0: no limit.
    pub tokens_per_day: u64,
}

/// The fleet's fair share (`[fair_share]`): each tenant's dispatch window is `window_per_slot`
/// runs per slot of the live workers, at least `min_window`. Postgres computes it
/// (`fair_share_window`, migration 0031), from the workers' registrations younger than
/// `worker_ttl_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    pub window_per_slot: u32,
    pub min_window: u32,
    pub worker_ttl_ms: u64,
}

/// Highest `requests_per_second` accepted: the shared bucket counts in microseconds, and a
/// higher rate is no limit in practice (set 0).
pub const MAX_REQUESTS_PER_SECOND: u32 = 1_000_000;

/// A limit that makes no sense, naming its field (without a section prefix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct LimitError {
    pub field: &'static str,
    pub message: String,
}

impl Limits {
    /// Checks the request-rate pair (the other limits are any count, 0 = none). Used for the
    /// `[limits]` defaults at start-up; an operator's per-tenant values can be checked on their
    /// effective limits the same way.
    pub fn check(&self) -> Result<(), LimitError> {
        let err = |field, message: &str| LimitError {
            field,
            message: message.to_owned(),
        };
        if self.requests_per_second > MAX_REQUESTS_PER_SECOND {
            return Err(err(
                "requests_per_second",
                "must be at most 1000000 (0 disables the limit)",
            ));
        }
        if self.requests_per_second == 0 && self.request_burst > 0 {
            return Err(err(
                "request_burst",
                "has no effect while requests_per_second is 0 (unlimited); set both or neither",
            ));
        }
        if self.request_burst > 0 && self.request_burst < self.requests_per_second {
            return Err(err(
                "request_burst",
                "must be 0 (one second's worth) or at least requests_per_second",
            ));
        }
        Ok(())
    }
}

/// One tenant's own values, each overriding the configured default when present.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_runs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_runs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
}

impl LimitOverrides {
    /// The tenant's effective limits over `defaults`.
    pub fn over(&self, defaults: &Limits) -> Limits {
        Limits {
            requests_per_second: self
                .requests_per_second
                .unwrap_or(defaults.requests_per_second),
            request_burst: self.request_burst.unwrap_or(defaults.request_burst),
            max_active_runs: self.max_active_runs.unwrap_or(defaults.max_active_runs),
            max_running_runs: self.max_running_runs.unwrap_or(defaults.max_running_runs),
            max_batch_size: self.max_batch_size.unwrap_or(defaults.max_batch_size),
            tokens_per_day: self.tokens_per_day.unwrap_or(defaults.tokens_per_day),
        }
    }

    /// `self` with every field `other` sets taken from `other` (a partial update).
    pub fn merged(&self, other: &LimitOverrides) -> LimitOverrides {
        LimitOverrides {
            requests_per_second: other.requests_per_second.or(self.requests_per_second),
            request_burst: other.request_burst.or(self.request_burst),
            max_active_runs: other.max_active_runs.or(self.max_active_runs),
            max_running_runs: other.max_running_runs.or(self.max_running_runs),
            max_batch_size: other.max_batch_size.or(self.max_batch_size),
            tokens_per_day: other.tokens_per_day.or(self.tokens_per_day),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: Limits = Limits {
        requests_per_second: 10,
        request_burst: 20,
        max_active_runs: 100,
        max_running_runs: 8,
        max_batch_size: 50,
        tokens_per_day: 0,
    };

    #[test]
    fn a_tenant_value_overrides_only_its_own_field() {
        let own: LimitOverrides = serde_json::from_str(r#"{"max_running_runs": 2}"#).unwrap();
        let eff = own.over(&DEFAULTS);
        assert_eq!(eff.max_running_runs, 2);
        assert_eq!(eff.requests_per_second, 10);
        assert_eq!(
            LimitOverrides::default().over(&DEFAULTS),
            DEFAULTS,
            "no overrides, the defaults"
        );
    }

    #[test]
    fn the_rate_pair_is_checked_naming_the_field() {
        assert_eq!(DEFAULTS.check(), Ok(()));
        let unlimited = Limits {
            requests_per_second: 0,
            request_burst: 0,
            ..DEFAULTS
        };
        assert_eq!(unlimited.check(), Ok(()));
        let small_bucket = Limits {
            request_burst: 5,
            ..DEFAULTS
        };
        assert_eq!(small_bucket.check().unwrap_err().field, "request_burst");
        let burst_alone = Limits {
            requests_per_second: 0,
            ..DEFAULTS
        };
        assert_eq!(burst_alone.check().unwrap_err().field, "request_burst");
        let too_fast = Limits {
            requests_per_second: MAX_REQUESTS_PER_SECOND + 1,
            request_burst: 0,
            ..DEFAULTS
        };
        assert_eq!(too_fast.check().unwrap_err().field, "requests_per_second");
    }

    #[test]
    fn unknown_fields_are_refused_and_merge_keeps_unset_fields() {
        assert!(serde_json::from_str::<LimitOverrides>(r#"{"max_runing_runs": 2}"#).is_err());
        let a = LimitOverrides {
            tokens_per_day: Some(5),
            ..Default::default()
        };
        let b = LimitOverrides {
            max_batch_size: Some(3),
            ..Default::default()
        };
        let m = a.merged(&b);
        assert_eq!((m.tokens_per_day, m.max_batch_size), (Some(5), Some(3)));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"tokens_per_day":5}"#
        );
    }
}
