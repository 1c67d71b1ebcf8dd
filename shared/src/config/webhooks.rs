//! `[webhooks]`: what a tenant may register, and how the API's deliverer sends.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Webhooks: what a tenant may register, and how the API's deliverer sends.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Whether this API replica sends webhook deliveries (any number of replicas may; each claims
    /// its own rows). Registration works either way.
    pub enabled: bool,
    /// Base64 of 32 bytes: seals endpoints' signing secrets (ChaCha20-Poly1305) in Postgres. Empty:
    /// endpoints cannot be registered nor their secrets rotated (422 naming `url` or `secret`), and
    /// only endpoints written before sealing existed still deliver. Every API replica needs the
    /// same key; at start-up each seals the secrets still stored plain (docs/operations.md,
    /// "Upgrade"). A secret (docs/operations.md, "Rotate secrets").
    pub encryption_key: String,
    /// Endpoints sealed per transaction by the start-up step that seals secrets still plain.
    /// 1–10000.
    pub seal_batch: u32,
    /// How often the deliverer looks for due deliveries when nothing wakes it sooner (a change that
    /// wrote deliveries notifies it on commit, LISTEN/NOTIFY).
    pub poll_interval_ms: NonZeroU64,
    /// The deadline of one delivery attempt (connect, send, status line).
    pub timeout_ms: NonZeroU64,
    /// The deadline of an attempt's connect.
    pub connect_timeout_ms: NonZeroU64,
    /// Delivery attempts in flight at once per API replica. 1–1024.
    pub max_concurrency: usize,
    /// Of those, the most one tenant's deliveries may hold (its share: slow endpoints of one tenant
    /// never take the others' slots; when a slot frees, the tenant with the fewest attempts in
    /// flight goes first). 1–`webhooks.max_concurrency`.
    pub max_concurrency_per_tenant: usize,
    /// How long a claimed delivery is reserved for its replica: past it (the replica died between
    /// claim and send) any replica attempts it again. Must exceed `webhooks.timeout_ms`.
    pub claim_lease_ms: u64,
    /// Retry delay after the first failed attempt; it doubles each attempt (drawn from its upper
    /// half: jitter) up to `webhooks.backoff_max_ms`.
    pub backoff_base_ms: NonZeroU64,
    /// The longest retry delay; at least `webhooks.backoff_base_ms`.
    pub backoff_max_ms: u64,
    /// A delivery not acknowledged this long after its change (a day by default) is given up
    /// (`failed`).
    pub retry_for_ms: NonZeroU64,
    /// A delivery is given up (`failed`) after this many attempts, whatever its age. 1–1000.
    pub max_attempts: i32,
    /// Bytes of a receiver's answer that are read (for the delivery's `last_error`); the rest is
    /// dropped unread. At most 1048576.
    pub max_response_bytes: usize,
    /// Endpoints a tenant may register (409 `too_many_webhooks` past it). 1–10000.
    pub max_endpoints_per_tenant: u32,
    /// The longest endpoint URL. 16–2048.
    pub max_url_bytes: usize,
    /// Delivered and given-up deliveries are removed this long (7 days by default) after they
    /// finished; until then the deliveries listing shows them.
    pub keep_finished_ms: NonZeroU64,
}

impl WebhookSettings {
    /// The sealing key of endpoints' secrets, when one is configured.
    pub fn key(&self) -> Result<Option<[u8; 32]>, ConfigError> {
        super::sealing_key("webhooks.encryption_key", &self.encryption_key)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.key()?;
        if !(1..=10_000).contains(&self.seal_batch) {
            return Err(invalid("webhooks.seal_batch", "must be within 1..=10000"));
        }
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
        if !(1..=self.max_concurrency).contains(&self.max_concurrency_per_tenant) {
            return Err(invalid(
                "webhooks.max_concurrency_per_tenant",
                "must be within 1..=webhooks.max_concurrency",
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
