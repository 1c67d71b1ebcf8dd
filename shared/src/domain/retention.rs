//! How long a tenant's finished and waiting runs are kept.
//!
//! [`RetentionWindows`] are the configured defaults (`retention.finished_runs_secs`,
//! `retention.waiting_runs_secs`); [`RetentionOverrides`] is what an operator set for one tenant
//! (`tenants.retention` in Postgres), field by field over the defaults, as limits are. In both,
//! 0 means "kept for ever". Windows are in seconds; releases before them took whole days
//! (`finished_runs_days`, `waiting_runs_days`), which are still read (see
//! [`RetentionOverrides`]).

use serde::{Deserialize, Serialize};

/// Seconds in a day: what a legacy `*_days` window is multiplied by.
pub const SECS_PER_DAY: u64 = 86_400;

/// The longest window accepted, in seconds (a century of days): past it, set 0 (kept for ever).
pub const MAX_RETENTION_SECS: u64 = 36_500 * SECS_PER_DAY;

/// A tenant's effective retention (or the configured defaults). 0: kept for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionWindows {
    /// Seconds a run is kept after it ended (completed, failed or cancelled).
    pub finished_runs_secs: u64,
    /// Seconds a run may wait for input or approval before it is removed.
    pub waiting_runs_secs: u64,
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
        for (field, secs) in [
            ("finished_runs_secs", self.finished_runs_secs),
            ("waiting_runs_secs", self.waiting_runs_secs),
        ] {
            if secs > MAX_RETENTION_SECS {
                return Err(RetentionError {
                    field,
                    message: format!(
                        "must be at most {MAX_RETENTION_SECS} seconds (36500 days; 0 keeps for ever)"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// One tenant's own windows, each overriding the configured default when present.
///
/// Stored as `{"finished_runs_secs": …, "waiting_runs_secs": …}`. A row written before windows
/// were in seconds holds `finished_runs_days` / `waiting_runs_days`: read as that many days.
/// Every write of a window removes its `*_days` key ([`RetentionOverrides::stored_keys`]), so
/// a row holding both was last written by an older replica during a rolling upgrade: its
/// `*_days` value is the newer and wins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredOverrides")]
pub struct RetentionOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_runs_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_runs_secs: Option<u64>,
}

/// What `tenants.retention` may hold, legacy keys included.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredOverrides {
    #[serde(default)]
    finished_runs_secs: Option<u64>,
    #[serde(default)]
    waiting_runs_secs: Option<u64>,
    #[serde(default)]
    finished_runs_days: Option<u32>,
    #[serde(default)]
    waiting_runs_days: Option<u32>,
}

impl From<StoredOverrides> for RetentionOverrides {
    fn from(s: StoredOverrides) -> Self {
        let days = |d: Option<u32>| d.map(|d| u64::from(d) * SECS_PER_DAY);
        RetentionOverrides {
            finished_runs_secs: days(s.finished_runs_days).or(s.finished_runs_secs),
            waiting_runs_secs: days(s.waiting_runs_days).or(s.waiting_runs_secs),
        }
    }
}

/// The legacy name of each window (whole days), as releases before seconds stored it.
pub const LEGACY_RETENTION_FIELDS: [(&str, &str); 2] = [
    ("finished_runs_days", "finished_runs_secs"),
    ("waiting_runs_days", "waiting_runs_secs"),
];

impl RetentionOverrides {
    /// The tenant's effective windows over `defaults`.
    pub fn over(&self, defaults: &RetentionWindows) -> RetentionWindows {
        RetentionWindows {
            finished_runs_secs: self
                .finished_runs_secs
                .unwrap_or(defaults.finished_runs_secs),
            waiting_runs_secs: self.waiting_runs_secs.unwrap_or(defaults.waiting_runs_secs),
        }
    }

    /// `self` with every field `other` sets taken from `other` (a partial update).
    pub fn merged(&self, other: &RetentionOverrides) -> RetentionOverrides {
        RetentionOverrides {
            finished_runs_secs: other.finished_runs_secs.or(self.finished_runs_secs),
            waiting_runs_secs: other.waiting_runs_secs.or(self.waiting_runs_secs),
        }
    }

    /// The names of the fields, read from the type itself: the literal below names every
    /// field, so adding one fails to compile until it is listed here too.
    pub fn fields() -> Vec<String> {
        let all = RetentionOverrides {
            finished_runs_secs: Some(0),
            waiting_runs_secs: Some(0),
        };
        match serde_json::to_value(all) {
            Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// The keys of `tenants.retention` that hold `field` (one of [`RetentionOverrides::fields`]):
    /// itself and its legacy `*_days` name, both removed when it is set or cleared.
    pub fn stored_keys(field: &str) -> Vec<String> {
        let mut keys = vec![field.to_owned()];
        keys.extend(
            LEGACY_RETENTION_FIELDS
                .iter()
                .filter(|(_, now)| *now == field)
                .map(|(legacy, _)| (*legacy).to_owned()),
        );
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: RetentionWindows = RetentionWindows {
        finished_runs_secs: 30 * SECS_PER_DAY,
        waiting_runs_secs: 0,
    };

    #[test]
    fn a_tenant_value_overrides_only_its_own_field() {
        let own: RetentionOverrides =
            serde_json::from_str(r#"{"finished_runs_secs": 60}"#).unwrap();
        assert_eq!(
            own.over(&DEFAULTS),
            RetentionWindows {
                finished_runs_secs: 60,
                waiting_runs_secs: 0
            }
        );
        assert_eq!(RetentionOverrides::default().over(&DEFAULTS), DEFAULTS);
        let merged = own.merged(&RetentionOverrides {
            waiting_runs_secs: Some(90),
            ..Default::default()
        });
        assert_eq!(
            (merged.finished_runs_secs, merged.waiting_runs_secs),
            (Some(60), Some(90))
        );
        assert!(serde_json::from_str::<RetentionOverrides>(r#"{"finished_run_secs": 2}"#).is_err());
        assert_eq!(
            RetentionOverrides::fields(),
            vec!["finished_runs_secs", "waiting_runs_secs"]
        );
        assert_eq!(
            RetentionOverrides::stored_keys("waiting_runs_secs"),
            vec!["waiting_runs_secs", "waiting_runs_days"]
        );
    }

    #[test]
    fn rows_in_days_are_read_as_days_and_the_later_days_key_wins() {
        let old: RetentionOverrides =
            serde_json::from_str(r#"{"finished_runs_days": 7, "waiting_runs_days": 0}"#).unwrap();
        assert_eq!(
            (old.finished_runs_secs, old.waiting_runs_secs),
            (Some(7 * SECS_PER_DAY), Some(0))
        );
        // Written back in seconds only.
        assert_eq!(
            serde_json::to_value(old).unwrap(),
            serde_json::json!({"finished_runs_secs": 604_800, "waiting_runs_secs": 0})
        );
        let both: RetentionOverrides =
            serde_json::from_str(r#"{"finished_runs_secs": 60, "finished_runs_days": 2}"#).unwrap();
        assert_eq!(both.finished_runs_secs, Some(2 * SECS_PER_DAY));
    }

    #[test]
    fn windows_past_a_century_are_refused_naming_the_field() {
        assert_eq!(DEFAULTS.check(), Ok(()));
        let long = RetentionWindows {
            waiting_runs_secs: MAX_RETENTION_SECS + 1,
            ..DEFAULTS
        };
        assert_eq!(long.check().unwrap_err().field, "waiting_runs_secs");
        let century = RetentionWindows {
            finished_runs_secs: MAX_RETENTION_SECS,
            ..DEFAULTS
        };
        assert_eq!(century.check(), Ok(()));
    }
}
