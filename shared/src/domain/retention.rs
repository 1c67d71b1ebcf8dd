//! How long a tenant's finished and waiting runs are kept.
//!
//! [`RetentionWindows`] are the configured defaults (`retention.finished_runs_days`,
//! `retention.waiting_runs_days`); [`RetentionOverrides`] is what an operator set for one tenant
//! (`tenants.retention` in Postgres), field by field over the defaults, as limits are. In both,
//! 0 means "kept for ever".

use serde::{Deserialize, Serialize};

/// The longest window accepted, in days (a century): past it, set 0 (kept for ever).
pub const MAX_RETENTION_DAYS: u32 = 36_500;

/// A tenant's effective retention (or the configured defaults). 0: kept for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionWindows {
    /// Days a run is kept after it ended (completed, failed or cancelled).
    pub finished_runs_days: u32,
    /// Days a run may wait for input or approval before it is removed.
    pub waiting_runs_days: u32,
}

/// A window that makes no sense, naming its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RetentionError {
    pub field: &'static str,
    pub message: String,
}

impl RetentionWindows {
    pub fn check(&self) -> Result<(), RetentionError> {
        for (field, days) in [
            ("finished_runs_days", self.finished_runs_days),
            ("waiting_runs_days", self.waiting_runs_days),
        ] {
            if days > MAX_RETENTION_DAYS {
                return Err(RetentionError {
                    field,
                    message: format!("must be at most {MAX_RETENTION_DAYS} (0 keeps for ever)"),
                });
            }
        }
        Ok(())
    }
}

/// One tenant's own windows, each overriding the configured default when present.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_runs_days: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_runs_days: Option<u32>,
}

impl RetentionOverrides {
    /// The tenant's effective windows over `defaults`.
    pub fn over(&self, defaults: &RetentionWindows) -> RetentionWindows {
        RetentionWindows {
            finished_runs_days: self
                .finished_runs_days
                .unwrap_or(defaults.finished_runs_days),
            waiting_runs_days: self.waiting_runs_days.unwrap_or(defaults.waiting_runs_days),
        }
    }

    /// `self` with every field `other` sets taken from `other` (a partial update).
    pub fn merged(&self, other: &RetentionOverrides) -> RetentionOverrides {
        RetentionOverrides {
            finished_runs_days: other.finished_runs_days.or(self.finished_runs_days),
            waiting_runs_days: other.waiting_runs_days.or(self.waiting_runs_days),
        }
    }

    /// The names of the fields, read from the type itself: the literal below names every
    /// field, so adding one fails to compile until it is listed here too.
    pub fn fields() -> Vec<String> {
        let all = RetentionOverrides {
            finished_runs_days: Some(0),
            waiting_runs_days: Some(0),
        };
        match serde_json::to_value(all) {
            Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: RetentionWindows = RetentionWindows {
        finished_runs_days: 30,
        waiting_runs_days: 0,
    };

    #[test]
    fn a_tenant_value_overrides_only_its_own_field() {
        let own: RetentionOverrides = serde_json::from_str(r#"{"finished_runs_days": 7}"#).unwrap();
        assert_eq!(
            own.over(&DEFAULTS),
            RetentionWindows {
                finished_runs_days: 7,
                waiting_runs_days: 0
            }
        );
        assert_eq!(RetentionOverrides::default().over(&DEFAULTS), DEFAULTS);
        let merged = own.merged(&RetentionOverrides {
            waiting_runs_days: Some(90),
            ..Default::default()
        });
        assert_eq!(
            (merged.finished_runs_days, merged.waiting_runs_days),
            (Some(7), Some(90))
        );
        assert!(serde_json::from_str::<RetentionOverrides>(r#"{"finished_run_days": 2}"#).is_err());
        assert_eq!(
            RetentionOverrides::fields(),
            vec!["finished_runs_days", "waiting_runs_days"]
        );
    }

    #[test]
    fn windows_past_a_century_are_refused_naming_the_field() {
        assert_eq!(DEFAULTS.check(), Ok(()));
        let long = RetentionWindows {
            waiting_runs_days: MAX_RETENTION_DAYS + 1,
            ..DEFAULTS
        };
        assert_eq!(long.check().unwrap_err().field, "waiting_runs_days");
    }
}
