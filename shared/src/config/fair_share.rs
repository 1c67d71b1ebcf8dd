//! `[fair_share]`: how the fleet shares its slots between tenants without any per-tenant
//! configuration (docs/architecture.md, "Fair dispatch").

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::domain::FairShare;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairShareSettings {
    /// Each tenant's dispatch window, in runs per slot of the fleet (the sum of the live workers'
    /// `worker.concurrency`): a tenant has at most this many runs per slot in flight (queued in
    /// RabbitMQ or running); its other runs wait in Postgres and are dispatched, oldest first, as
    /// its runs end. 2: a tenant alone fills every slot and keeps as many queued behind them, and
    /// a tenant that arrives later waits behind at most the others' windows, never their
    /// backlogs. 0: off (runs are published as they are created, one queue in arrival order;
    /// only `limits.max_running_runs` holds a tenant back). At most 100.
    pub window_per_slot: u32,
    /// The smallest window, also used while no worker is registered (at start-up). 1–1000000.
    pub min_window: u32,
    /// A worker's registration of its slots counts while it was refreshed within this long;
    /// workers refresh it every `worker.sweep_interval_ms`, and a worker killed without a goodbye
    /// stops counting after this. At least twice `worker.sweep_interval_ms`.
    pub worker_ttl_ms: u64,
    /// How long a worker waits after dispatching a tenant's held runs before it dispatches that
    /// tenant again: the first run to end dispatches at once, the runs ending meanwhile by one
    /// dispatch at the end of the wait. Each tenant keeps at least an eighth of its window queued
    /// beyond the slots, so a short wait idles no slot while it saves a statement per run's end
    /// of a tenant draining a backlog. 0: every end dispatches. At most 1000.
    pub dispatch_spacing_ms: u64,
}

impl FairShareSettings {
    /// The share every dispatcher and creator applies, or `None` when fair share is off.
    pub fn share(&self) -> Option<FairShare> {
        (self.window_per_slot > 0).then_some(FairShare {
            window_per_slot: self.window_per_slot,
            min_window: self.min_window,
            worker_ttl_ms: self.worker_ttl_ms,
        })
    }

    pub(super) fn validate(&self, sweep_interval_ms: u64) -> Result<(), ConfigError> {
        if self.window_per_slot > 100 {
            return Err(invalid(
                "fair_share.window_per_slot",
                "must be at most 100 (0 turns fair share off)",
            ));
        }
        if !(1..=1_000_000).contains(&self.min_window) {
            return Err(invalid(
                "fair_share.min_window",
                "must be within 1..=1000000",
            ));
        }
        if self.dispatch_spacing_ms > 1000 {
            return Err(invalid(
                "fair_share.dispatch_spacing_ms",
                "must be at most 1000 (0: every run's end dispatches)",
            ));
        }
        if self.worker_ttl_ms < 2 * sweep_interval_ms {
            return Err(invalid(
                "fair_share.worker_ttl_ms",
                "must be at least twice worker.sweep_interval_ms (a live worker refreshes its slots once per sweep)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn fair_share_is_on_by_default_and_its_keys_are_checked() {
        let settings = load(&[]).unwrap();
        let share = settings.fair_share.share().expect("on by default");
        assert_eq!(share.window_per_slot, 2);
        assert!(
            load(&[("fair_share.window_per_slot", "0")])
                .unwrap()
                .fair_share
                .share()
                .is_none()
        );
        for (key, value) in [
            ("fair_share.window_per_slot", "101"),
            ("fair_share.min_window", "0"),
            ("fair_share.worker_ttl_ms", "1000"),
            ("fair_share.dispatch_spacing_ms", "1001"),
        ] {
            let err = load(&[(key, value)]).unwrap_err().to_string();
            assert!(err.contains(&format!("`{key}`")), "{key}: {err}");
        }
    }
}
