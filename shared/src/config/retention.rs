//! `[retention]`: how long finished and waiting runs are kept, and how their removal yields to
//! the fleet's own work (docs/operations.md, "Retention").

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::domain::{RetentionWindows, SECS_PER_DAY};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Seconds a run is kept after it ended (completed, failed, cancelled); then it is removed
    /// with its tool calls, timings and webhook deliveries, and its thread with its messages once
    /// every run of the thread is gone (docs/operations.md, "Retention"). Usage totals are kept.
    /// A tenant's own value (`tenants.retention`, set with the admin API or `agentfleet-api
    /// tenants retention`) overrides it. 0: kept for ever. At most 3153600000 (36500 days). The
    /// key of earlier releases, `retention.finished_runs_days` (whole days, at most 36500), is
    /// still read: when set, it replaces this one.
    pub finished_runs_secs: u64,
    /// Seconds a run may wait for input or approval (from its pause) before it is removed like a
    /// finished one; a run waiting for its thread behind it goes with it. Overridable per tenant
    /// as above. 0 (the default): a waiting run is never removed by age. At most 3153600000.
    /// `retention.waiting_runs_days` (whole days) is still read, as above.
    pub waiting_runs_secs: u64,
    // The keys in days of earlier releases (not in defaults.toml: set only by an operator's
    // file or environment). Private, so the configuration reference lists only the above.
    #[serde(default)]
    finished_runs_days: Option<u32>,
    #[serde(default)]
    waiting_runs_days: Option<u32>,
    /// Time between passes: once a pass finds nothing more to remove, the next one starts this
    /// much later (a new run past its window waits at most this long).
    pub interval_ms: u64,
    /// Runs one removal batch takes at most (each batch is one short transaction); also the
    /// webhook deliveries it removes at most. 1–10000.
    pub batch_runs: u32,
    /// Messages one batch removes at most from threads that go whole (a long thread goes over
    /// several batches, newest messages first). 1–100000.
    pub batch_messages: u32,
    /// The share of time removal may keep the fleet's database busy, in percent: after a batch
    /// that took `t`, the next starts `t × (100 − duty) / duty` later, whichever worker runs it.
    /// 1–100.
    pub duty_percent: u32,
    /// A batch slower than this is taken as a sign the database is loaded: the next batch waits
    /// `retention.yield_pause_ms`.
    pub slow_batch_ms: u64,
    /// Removal pauses (`retention.yield_pause_ms`) while the oldest runnable run (queued, not held
    /// by its tenant's running limit) has waited this long for a worker: the fleet is behind, and
    /// removal waits for it. 0: never yields to the queue.
    pub yield_runnable_age_ms: u64,
    /// How long removal pauses when it yields (a slow batch, runs waiting for workers).
    pub yield_pause_ms: u64,
    /// How long a removal statement waits for a row or table lock before it gives up (and the
    /// batch is tried again later); far below `database.lock_timeout_ms`, so removal gives way
    /// rather than makes anything wait. Removal takes rows with `SKIP LOCKED`, so it meets a held
    /// lock rarely. 1–60000.
    pub lock_timeout_ms: u64,
}

impl RetentionSettings {
    /// The configured windows: every tenant's default.
    pub fn windows(&self) -> RetentionWindows {
        let days = |d: Option<u32>| d.map(|d| u64::from(d) * SECS_PER_DAY);
        RetentionWindows {
            finished_runs_secs: days(self.finished_runs_days).unwrap_or(self.finished_runs_secs),
            waiting_runs_secs: days(self.waiting_runs_days).unwrap_or(self.waiting_runs_secs),
        }
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    pub fn yield_pause(&self) -> Duration {
        Duration::from_millis(self.yield_pause_ms)
    }

    /// The pause after a batch that took `took`: the duty cycle's share, or the yield pause
    /// after a slow batch.
    pub fn pause_after(&self, took: Duration) -> Duration {
        if took >= Duration::from_millis(self.slow_batch_ms) {
            return self.yield_pause().max(took);
        }
        let duty = self.duty_percent.clamp(1, 100);
        took * (100 - duty) / duty
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        // A legacy key in days is named in its own error: it is what the operator wrote.
        for (key, days) in [
            ("retention.finished_runs_days", self.finished_runs_days),
            ("retention.waiting_runs_days", self.waiting_runs_days),
        ] {
            if days.is_some_and(|d| d > 36_500) {
                return Err(invalid(key, "must be at most 36500 (0 keeps for ever)"));
            }
        }
        if let Err(e) = self.windows().check() {
            return Err(invalid(&format!("retention.{}", e.field), e.message));
        }
        let ranges: [(&str, u64, u64, u64); 6] = [
            ("retention.batch_runs", self.batch_runs.into(), 1, 10_000),
            (
                "retention.batch_messages",
                self.batch_messages.into(),
                1,
                100_000,
            ),
            ("retention.duty_percent", self.duty_percent.into(), 1, 100),
            ("retention.lock_timeout_ms", self.lock_timeout_ms, 1, 60_000),
            ("retention.interval_ms", self.interval_ms, 100, 86_400_000),
            (
                "retention.yield_pause_ms",
                self.yield_pause_ms,
                1,
                3_600_000,
            ),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                return Err(invalid(key, format!("must be within {min}..={max}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::load;

    #[test]
    fn the_pause_keeps_the_duty_cycle_and_yields_after_a_slow_batch() {
        let s = load(&[]).unwrap().retention;
        assert_eq!(s.finished_runs_secs, 30 * 86_400);
        assert_eq!(s.waiting_runs_secs, 0);
        let d = |ms| Duration::from_millis(ms);
        // 20 %: busy 100 ms, then 400 ms off.
        assert_eq!(s.pause_after(d(100)), d(400));
        assert_eq!(s.pause_after(d(s.slow_batch_ms)), s.yield_pause());
        let full = load(&[("retention.duty_percent", "100")])
            .unwrap()
            .retention;
        assert_eq!(full.pause_after(d(100)), d(0));
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (key, value) in [
            ("retention.finished_runs_secs", "3153600001"),
            ("retention.waiting_runs_secs", "-1"),
            ("retention.finished_runs_days", "36501"),
            ("retention.waiting_runs_days", "40000"),
            ("retention.batch_runs", "0"),
            ("retention.duty_percent", "0"),
            ("retention.duty_percent", "101"),
            ("retention.lock_timeout_ms", "0"),
        ] {
            let err = load(&[(key, value)]).unwrap_err().to_string();
            assert!(err.contains(key), "{key}={value}: {err}");
        }
    }

    #[test]
    fn a_window_in_days_still_configures_it() {
        let s = load(&[
            ("retention.finished_runs_days", "7"),
            ("retention.waiting_runs_days", "0"),
        ])
        .unwrap()
        .retention;
        let w = s.windows();
        assert_eq!((w.finished_runs_secs, w.waiting_runs_secs), (604_800, 0));
        let s = load(&[("retention.finished_runs_secs", "60")])
            .unwrap()
            .retention;
        assert_eq!(s.windows().finished_runs_secs, 60);
    }
}
