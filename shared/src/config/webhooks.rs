//! `[webhooks]`: what a tenant may register, and how the API's deliverer sends.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Webhooks: what a tenant may register, and how the API's deliverer sends.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Whether this API replica sends deliveries (any number of replicas may; each claims
    /// its own rows). Registration works either way.
    pub enabled: bool,
    /// How often the deliverer looks for due deliveries when nothing wakes it sooner (a
    /// change that wrote deliveries notifies it on commit).
    pub poll_interval_ms: NonZeroU64,
    /// The deadline of one delivery attempt (connect, send, status line).
    pub timeout_ms: NonZeroU64,
    pub connect_timeout_ms: NonZeroU64,
    /// Attempts in flight at once per replica.
    pub max_concurrency: usize,
    /// How long a claimed delivery is reserved for its replica: past it, a replica that died
    /// between claim and send has its delivery sent by another. Above `timeout_ms`.
    pub claim_lease_ms: u64,
    /// Retry delay after the first failure; it doubles each attempt (with jitter) up to
    /// `backoff_max_ms`.
    pub backoff_base_ms: NonZeroU64,
    pub backoff_max_ms: u64,
    /// A delivery not acknowledged this long after its change is given up (`failed`).
    pub retry_for_ms: NonZeroU64,
    /// A delivery is given up after this many attempts, whatever its age.
    pub max_attempts: i32,
    /// Bytes of a receiver's answer that are read (for the delivery's `last_error`); the rest
    /// is dropped unread.
    pub max_response_bytes: usize,
    pub max_endpoints_per_tenant: u32,
    pub max_url_bytes: usize,
    /// Delivered and given-up deliveries are removed this long after they finished (the
    /// deliveries listing shows them until then).
    pub keep_finished_ms: NonZeroU64,
}

impl WebhookSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.claim_lease_ms <= self.timeout_ms.get() {
            return Err(invalid(
                "webhooks.claim_lease_ms",
                "must exceed webhooks.timeout_ms (a live attempt must not be claimed again)",
            ));
        }
        if self.backoff_max_ms < self.backoff_base_ms.get() {
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
        Duration::from_millis(self.timeout_ms.get())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn webhook_settings_are_checked_naming_the_key() {
        let s = load(&[]).unwrap();
        assert_eq!(s.webhooks.retry_for_ms.get(), 86_400_000);
        let err = load(&[("webhooks.claim_lease_ms", "10000")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`webhooks.claim_lease_ms`"), "{err}");
        let err = load(&[("webhooks.backoff_max_ms", "1")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`webhooks.backoff_max_ms`"), "{err}");
    }
}
