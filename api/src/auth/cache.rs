//! A short-lived cache of authenticated API keys: every request under `/v1` is authenticated,
//! and a Postgres round trip per request was the largest share of `POST /v1/runs`.
//!
//! Entries live `api.auth_cache_ttl_ms` (0 disables the cache), so a revoked key stops working
//! within that time on every replica (usually sooner: `crate::auth::invalidation` drops entries
//! an admin change names). Entries are found by key hash (requests) or by key id (stream
//! tokens, `crate::auth::caller`); an invalidation drops both. The cache holds at most
//! `api.auth_cache_max_keys` keys.
//!
//! Unknown keys (never issued, revoked or expired: none comes back to life) are remembered
//! apart, for `api.auth_negative_ttl_ms`, at most `api.auth_negative_max_keys` of them, so one
//! unknown key presented again and again costs Postgres one lookup per TTL. That table is
//! bounded like the other: random keys cannot grow it, only churn it (the per-source limit of
//! `crate::auth::attempts` holds those back).
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
    /// Key hashes Postgres did not know, and when it was asked.
    unknown: Mutex<HashMap<Vec<u8>, Instant>>,
    unknown_ttl: Duration,
    max_unknown: usize,
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
            unknown: Mutex::new(HashMap::new()),
            unknown_ttl: Duration::ZERO,
            max_unknown: 0,
            misses: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
            invalidated_at: Mutex::new(None),
        }
    }

    /// Also remembers unknown keys for `ttl` (zero: never), at most `max_keys` of them.
    pub fn with_unknown(mut self, ttl: Duration, max_keys: usize) -> AuthCache {
        self.unknown_ttl = ttl;
        self.max_unknown = max_keys;
        self
    }

    /// Whether `key_hash` was looked up less than `api.auth_negative_ttl_ms` ago and unknown.
    pub fn known_unknown(&self, key_hash: &[u8]) -> bool {
        if self.unknown_ttl.is_zero() {
            return false;
        }
        let unknown = self.unknown.lock().expect("auth cache lock");
        unknown
            .get(key_hash)
            .is_some_and(|at| at.elapsed() < self.unknown_ttl)
    }

    fn put_unknown(&self, key_hash: &[u8]) {
        if self.unknown_ttl.is_zero() || self.max_unknown == 0 {
            return;
        }
        let mut unknown = self.unknown.lock().expect("auth cache lock");
        if unknown.len() >= self.max_unknown {
            let ttl = self.unknown_ttl;
            unknown.retain(|_, at| at.elapsed() < ttl);
            if unknown.len() >= self.max_unknown {
                unknown.clear();
            }
        }
        unknown.insert(key_hash.to_vec(), Instant::now());
    }

    /// The cached principal of `key_hash`, or what `lookup` answers (cached when found, and
    /// remembered as unknown when not). Only one lookup of a key runs at a time; the others
    /// take its answer from the cache.
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
        if self.known_unknown(key_hash) {
            return Ok(None);
        }
        let _stripe = if self.ttl.is_zero() && self.unknown_ttl.is_zero() {
            None
        } else {
            let stripe = key_hash.last().copied().unwrap_or(0) as usize % MISS_STRIPES;
            let guard = self.misses[stripe].lock().await;
            if let Some(p) = self.get(key_hash) {
                return Ok(Some(p));
            }
            if self.known_unknown(key_hash) {
                return Ok(None);
            }
            Some(guard)
        };
        let asked = Instant::now();
        metrics::counter!("agentfleet_auth_lookups_total").increment(1);
        let found = lookup().await?;
        match found {
            Some(p) => self.put(key_hash.to_vec(), p, asked),
            None => self.put_unknown(key_hash),
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

    /// Whether `key_hash` was a valid key not long ago: its entry is kept past its TTL until
    /// the cache needs the room, so a key being asked again after its TTL is told apart from a
    /// guess (the per-source limit refuses guesses, never these).
    pub fn seen(&self, key_hash: &[u8]) -> bool {
        self.entries
            .lock()
            .expect("auth cache lock")
            .contains_key(key_hash)
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
        assert!(
            cache.seen(&[1]),
            "an expired entry is still known to have been valid"
        );
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
        // Without a negative cache, unknown keys are asked every time and never cached.
        for _ in 0..2 {
            let none = cache
                .get_or_lookup(&[8], || async { Ok::<_, ()>(None) })
                .await;
            assert_eq!(none, Ok(None));
        }
        assert!(cache.get(&[8]).is_none());
    }

    #[tokio::test]
    async fn unknown_keys_are_asked_once_per_negative_ttl_and_stay_bounded() {
        let cache =
            AuthCache::new(Duration::from_secs(60), 10).with_unknown(Duration::from_secs(60), 3);
        let asked = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..5 {
            let none = cache
                .get_or_lookup(&[8], || async {
                    asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, ()>(None)
                })
                .await;
            assert_eq!(none, Ok(None));
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(cache.get(&[8]).is_none(), "not a principal");
        for i in 0..100u8 {
            cache.put_unknown(&[i]);
            assert!(cache.unknown.lock().unwrap().len() <= 3);
        }
        let brief = AuthCache::new(Duration::from_secs(60), 10).with_unknown(Duration::ZERO, 3);
        brief.put_unknown(&[1]);
        assert!(!brief.known_unknown(&[1]), "a zero TTL remembers nothing");
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
