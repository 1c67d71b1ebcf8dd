//! A short-lived cache of authenticated API keys: every request under `/v1` is authenticated,
//! and a Postgres round trip per request was the largest share of `POST /v1/runs`.
//!
//! Entries live `api.auth_cache_ttl_ms` (0 disables the cache), so a revoked key stops working
//! within that time on every replica. Unknown keys are never cached (a flood of bad keys cannot
//! fill it), and the cache holds at most `api.auth_cache_max_keys` keys.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agentfleet_shared::store::tenants::Principal;

pub struct AuthCache {
    ttl: Duration,
    max_keys: usize,
    entries: Mutex<HashMap<Vec<u8>, (Principal, Instant)>>,
}

impl AuthCache {
    pub fn new(ttl: Duration, max_keys: usize) -> AuthCache {
        AuthCache {
            ttl,
            max_keys,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The principal of a key hash seen less than the TTL ago.
    pub fn get(&self, key_hash: &[u8]) -> Option<Principal> {
        if self.ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().expect("auth cache lock");
        entries
            .get(key_hash)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(p, _)| *p)
    }

    /// Caches what Postgres answered when asked at `asked` (taken before the query, so an
    /// entry never outlives a revocation by more than the TTL).
    pub fn put(&self, key_hash: Vec<u8>, principal: Principal, asked: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().expect("auth cache lock");
        if entries.len() >= self.max_keys {
            let ttl = self.ttl;
            entries.retain(|_, (_, at)| at.elapsed() < ttl);
            if entries.len() >= self.max_keys {
                entries.clear();
            }
        }
        entries.insert(key_hash, (principal, asked));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn principal() -> Principal {
        Principal {
            tenant_id: Uuid::now_v7(),
            key_id: Uuid::now_v7(),
        }
    }

    #[test]
    fn entries_expire_and_a_zero_ttl_disables_the_cache() {
        let cache = AuthCache::new(Duration::from_millis(30), 10);
        let p = principal();
        cache.put(vec![1], p, Instant::now());
        assert_eq!(cache.get(&[1]).map(|p| p.key_id), Some(p.key_id));
        assert!(cache.get(&[2]).is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        while cache.get(&[1]).is_some() {
            assert!(Instant::now() < deadline, "entry never expired");
            std::thread::yield_now();
        }
        let off = AuthCache::new(Duration::ZERO, 10);
        off.put(vec![1], principal(), Instant::now());
        assert!(off.get(&[1]).is_none());
    }

    #[test]
    fn the_cache_never_grows_past_its_limit() {
        let cache = AuthCache::new(Duration::from_secs(60), 3);
        for i in 0..10u8 {
            cache.put(vec![i], principal(), Instant::now());
            assert!(cache.entries.lock().unwrap().len() <= 3);
        }
        assert!(cache.get(&[9]).is_some(), "the newest key is kept");
    }
}
