//! `api_keys.last_used_at` without a Postgres write per request: each authenticated request
//! notes its key and the time here (a map insert under a short lock), and one task writes
//! every noted key in a single statement each `api.key_last_used_flush_ms`.
//!
//! Precision: `last_used_at` is the time of the key's latest request on some replica, written
//! up to one flush interval late. A replica that stops gracefully flushes what it holds; one
//! that crashes loses at most one interval of marks (the column then lags, never leads).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use agentfleet_shared::store::keys;

#[derive(Default)]
pub struct KeyUsage {
    /// Keys used since the last flush, with their latest use. Bounded by the number of keys
    /// that authenticated within one interval (at most `api.auth_cache_max_keys` per TTL).
    seen: Mutex<HashMap<Uuid, DateTime<Utc>>>,
}

impl KeyUsage {
    /// Notes that `key` authenticated a request now.
    pub fn mark(&self, key: Uuid) {
        self.mark_at(key, Utc::now());
    }

    fn mark_at(&self, key: Uuid, at: DateTime<Utc>) {
        let mut seen = self.seen.lock().expect("key usage lock");
        let latest = seen.entry(key).or_insert(at);
        if *latest < at {
            *latest = at;
        }
    }

    /// Everything noted since the last call.
    fn take(&self) -> Vec<(Uuid, DateTime<Utc>)> {
        let mut seen = self.seen.lock().expect("key usage lock");
        std::mem::take(&mut *seen).into_iter().collect()
    }

    /// Writes what was noted; on failure the marks are kept for the next flush.
    pub async fn flush(&self, pool: &PgPool) {
        let used = self.take();
        if let Err(e) = keys::mark_used(pool, &used).await {
            tracing::warn!(error = %e, keys = used.len(), "writing keys' last_used_at failed; retried next flush");
            for (key, at) in used {
                self.mark_at(key, at);
            }
        }
    }

    /// Flushes every `every` until `stop`, then once more.
    pub fn spawn_flusher(
        self: std::sync::Arc<Self>,
        pool: PgPool,
        every: Duration,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => self.flush(&pool).await,
                    _ = stop.cancelled() => break,
                }
            }
            self.flush(&pool).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_noted_once_with_its_latest_use() {
        let usage = KeyUsage::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let t0 = Utc::now();
        let t1 = t0 + chrono::Duration::seconds(5);
        usage.mark_at(a, t1);
        usage.mark_at(a, t0);
        usage.mark_at(b, t0);
        let mut taken = usage.take();
        taken.sort();
        let mut expected = vec![(a, t1), (b, t0)];
        expected.sort();
        assert_eq!(taken, expected);
        assert!(usage.take().is_empty(), "taken marks are gone");
    }
}
