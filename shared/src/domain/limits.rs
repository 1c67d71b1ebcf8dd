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
    /// API requests per second (token bucket refill rate), across every API replica.
    pub requests_per_second: u32,
    /// Requests the bucket holds: how large a burst may be after a quiet period.
    pub request_burst: u32,
    /// Runs not yet ended (queued + running + waiting) a tenant may have at once; a create
    /// beyond it is refused with 429.
    pub max_active_runs: u32,
    /// Runs of the tenant dispatched to workers at once; the rest wait `queued` in Postgres
    /// and are dispatched in turn (fair dispatch).
    pub max_running_runs: u32,
    /// Most runs in one `POST /v1/runs/batch` (never more than `api.max_batch_runs`).
    pub max_batch_size: u32,
    /// Model tokens (prompt + completion) per UTC day; a run that would go past it stops
    /// between iterations with `budget_exceeded`.
    pub tokens_per_day: u64,
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
