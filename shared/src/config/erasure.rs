//! `[erasure]`: how a tenant's erasure removes its data (docs/operations.md, "Erasing a
//! tenant").

use std::num::NonZeroU64;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Tenant erasure (`DELETE /admin/v1/tenants/{id}`, `agentfleet-api tenants erase`): its keys are
/// refused and its runs cancelled at once; every API replica takes part in removing the rest
/// in the background.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErasureSettings {
    /// Rows one statement of an erasure deletes at most (each in a short transaction of its own).
    /// 1–10000.
    pub batch_size: u32,
    /// How long after the last of its runs was cancelled an erasure waits before it deletes
    /// anything: API replicas that cached one of its keys refuse it by then
    /// (`api.auth_cache_ttl_ms`), and workers that held its runs have stopped (`worker.lease_ms`).
    /// Keep it above both.
    pub grace_ms: u64,
    /// How often each API replica looks for an erasure nobody drives (not yet started, or whose
    /// replica stopped) and takes it.
    pub interval_ms: NonZeroU64,
    /// How long a replica holds an erasure between two of its steps; past it (the replica
    /// died) another replica takes the erasure over where it stopped.
    pub lease_ms: NonZeroU64,
}

impl ErasureSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(invalid("erasure.batch_size", "must be within 1..=10000"));
        }
        if self.lease_ms.get() < 1000 {
            return Err(invalid("erasure.lease_ms", "must be at least 1000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn erasure_settings_are_checked_naming_the_key() {
        let s = load(&[]).unwrap();
        assert_eq!(s.erasure.batch_size, 500);
        assert!(s.erasure.grace_ms >= s.api.auth_cache_ttl_ms);
        assert!(s.erasure.grace_ms >= s.worker.lease_ms);
        let err = load(&[("erasure.batch_size", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`erasure.batch_size`"), "{err}");
        let err = load(&[("erasure.lease_ms", "10")]).unwrap_err().to_string();
        assert!(err.contains("`erasure.lease_ms`"), "{err}");
    }
}
