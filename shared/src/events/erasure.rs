//! Deleting the Redis keys of runs and threads (a tenant's erasure, `store::erasure`). Nothing
//! here lists keys (`KEYS`/`SCAN` reach one node of a cluster, and walk every key of the
//! fleet): the caller names the runs and threads, read from Postgres before their rows go.

use uuid::Uuid;

use super::{AppendError, EventBus};

/// DELs in flight at once on a cluster, where each goes on its own to its key's node.
const CLUSTER_DELS_IN_FLIGHT: usize = 16;

impl EventBus {
    /// Every key named after `runs` (their event list, fence and id base, and the names of
    /// their channels) and `threads` (their channel's name), and `others` as given; how many
    /// existed. A run's keys share one hash slot (`Keys`), so each run is one `DEL`; on one
    /// server they all go in one pipeline, on a cluster one `DEL` per run (or per key of
    /// `others`), a few at a time, each to its own node.
    pub async fn delete_keys(
        &self,
        runs: &[Uuid],
        threads: &[Uuid],
        others: &[String],
    ) -> Result<u64, AppendError> {
        let keys = self.keys();
        let mut groups: Vec<Vec<String>> =
            Vec::with_capacity(runs.len() + threads.len() + others.len());
        for run in runs {
            groups.push(vec![
                keys.events(*run),
                keys.fence(*run),
                keys.base(*run),
                keys.live(*run),
                keys.control(*run),
            ]);
        }
        for thread in threads {
            groups.push(vec![keys.thread_live(*thread)]);
        }
        for other in others {
            groups.push(vec![other.clone()]);
        }
        if groups.is_empty() {
            return Ok(0);
        }
        if !self.conn.is_cluster() {
            let mut pipe = redis::pipe();
            for group in &groups {
                pipe.del(group);
            }
            // Deleting twice is harmless: the call may be repeated on a fresh connection.
            let deleted: Vec<u64> = self
                .call(|mut conn, _| {
                    let pipe = &pipe;
                    async move { pipe.query_async(&mut conn).await }
                })
                .await?;
            return Ok(deleted.iter().sum());
        }
        let mut deleted = 0;
        for some in groups.chunks(CLUSTER_DELS_IN_FLIGHT) {
            let dels = some.iter().map(|group| self.del(group));
            for outcome in futures_util::future::join_all(dels).await {
                deleted += outcome?;
            }
        }
        Ok(deleted)
    }

    /// One `DEL` of keys of one hash slot; how many existed.
    async fn del(&self, keys: &[String]) -> Result<u64, AppendError> {
        let mut del = redis::cmd("DEL");
        del.arg(keys);
        self.call(|mut conn, _| {
            let del = &del;
            async move { del.query_async::<u64>(&mut conn).await }
        })
        .await
    }
}
