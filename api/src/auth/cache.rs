//! A short-lived cache of authenticated API keys: every request under `/v1` is authenticated,
//! and a Postgres round trip per request was the largest share of `POST /v1/runs`.
//!
//! Entries live `api.auth_cache_ttl_ms` (0 disables the cache), so a revoked key stops working
//! within that time on every replica (usually sooner: `crate::auth::invalidation` drops entries
//! an admin change names). Entries are found by key hash (requests) or by key id (stream
//! tokens, `crate::auth::caller`); an invalidation drops both. Unknown keys are never cached (a flood of bad keys cannot
//! fill it), and the cache holds at most `api.auth_cache_max_keys` keys.
//!
//! Misses of one key are looked up once: when a thousand clients reconnect at the same moment
//! with the same key, one asks Postgres and the others wait for its answer instead of taking a
//! pool connection each. Misses are serialized per stripe of key hashes, so unrelated keys
//! rarely wait for each other and the lock table never grows.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agentfleet_shared::store::tenants::Principal;

const MISS_STRIPES: usize = 64;

pub struct AuthCache {
    ttl: Duration,
    max_keys: usize,
    entries: Mutex<HashMap<Vec<u8>, (Principal, Instant)>>,
    misses: [tokio::sync::Mutex<()>; MISS_STRIPES],
    /// When [`AuthCache::invalidate`] last ran: a lookup asked before it may have read what
    /// the invalidation replaced, so its answer is used once but not cached.
    invalidated_at: Mutex<Option<Instant>>,
}

impl AuthCache {
    pub fn new(ttl: Duration, max_keys: usize) -> AuthCache {
        AuthCache {
            ttl,
            max_keys,
            entries: Mutex::new(HashMap::new()),
            misses: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
            invalidated_at: Mutex::new(None),
        }
    }

    /// The cached principal of `key_hash`, or what `lookup` answers (cached when found). Only
    /// one lookup of a key runs at a time; the others take its answer from the cache.
    pub async fn get_or_lookup<E, F, Fut>(
        &self,
        key_hash: &[u8],
        lookup: F,
    ) -> Result<Option<Principal>, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Option<Principal>, E>>,
    {
        if let Some(p) = self.get(key_hash) {
            return Ok(Some(p));
        }
        let _stripe = if self.ttl.is_zero() {
            None
        } else {
            let stripe = key_hash.last().copied().unwrap_or(0) as usize % MISS_STRIPES;
            let guard = self.misses[stripe].lock().await;
            if let Some(p) = self.get(key_hash) {
                return Ok(Some(p));
            }
            Some(guard)
        };
        let asked = Instant::now();
        let found = lookup().await?;
        if let Some(p) = found {
            self.put(key_hash.to_vec(), p, asked);
        }
        Ok(found)
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
        let stale = self
            .invalidated_at
            .lock()
            .expect("auth cache lock")
            .is_some_and(|at| asked <= at);
        if stale {
            return;
        }
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

impl AuthCache {
    /// Drops every cached principal `which` selects (a revoked key, a suspended tenant), so
    /// the next request asks Postgres (`crate::auth::invalidation`).
    pub fn invalidate(&self, which: impl Fn(&Principal) -> bool) {
        let mut entries = self.entries.lock().expect("auth cache lock");
        *self.invalidated_at.lock().expect("auth cache lock") = Some(Instant::now());
        entries.retain(|_, (p, _)| !which(p));
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
            limits: Default::default(),
            suspended: false,
            expires_at: None,
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

    #[tokio::test]
    async fn concurrent_misses_of_one_key_ask_once() {
        let cache = std::sync::Arc::new(AuthCache::new(Duration::from_secs(60), 10));
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let p = principal();
        let lookups = (0..50).map(|_| {
            let (cache, asked) = (cache.clone(), asked.clone());
            tokio::spawn(async move {
                cache
                    .get_or_lookup(&[7], || async {
                        asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, ()>(Some(p))
                    })
                    .await
            })
        });
        for got in futures_util::future::join_all(lookups).await {
            assert_eq!(got.unwrap().unwrap().map(|p| p.key_id), Some(p.key_id));
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Unknown keys are asked every time and never cached.
        for _ in 0..2 {
            let none = cache
                .get_or_lookup(&[8], || async { Ok::<_, ()>(None) })
                .await;
            assert_eq!(none, Ok(None));
        }
        assert!(cache.get(&[8]).is_none());
    }

    #[test]
    fn invalidation_drops_what_it_names_and_refuses_answers_read_before_it() {
        let cache = AuthCache::new(Duration::from_secs(60), 10);
        let (a, b) = (principal(), principal());
        cache.put(vec![1], a, Instant::now());
        cache.put(vec![2], b, Instant::now());
        let asked_before = Instant::now();
        cache.invalidate(|p| p.key_id == a.key_id);
        assert!(cache.get(&[1]).is_none());
        assert!(cache.get(&[2]).is_some(), "other keys stay");
        cache.put(vec![1], a, asked_before);
        assert!(
            cache.get(&[1]).is_none(),
            "read before the invalidation: not cached"
        );
        cache.put(vec![1], a, Instant::now() + Duration::from_millis(1));
        assert!(cache.get(&[1]).is_some());
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
