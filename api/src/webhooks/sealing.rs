//! The start-up step that seals webhook secrets still stored plain (endpoints written before
//! sealing existed; migration 0029). Every API replica with `webhooks.encryption_key` runs it
//! in the background once, batch after batch (`webhooks.seal_batch` per transaction) until no
//! plain row is left. Replicas starting together take disjoint rows (`SKIP LOCKED`), and a row
//! is written only while still plain, so running it any number of times seals each row once.
//! Until a row is sealed the deliverer reads its plain secret, so deliveries go on meanwhile.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use agentfleet_shared::store::webhooks;

/// Failed attempts (a database outage at start-up) before the step gives up until the next
/// start; the plain rows keep working meanwhile.
const ATTEMPTS: u32 = 10;
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Starts the step when a key is configured; without one, warns when plain secrets remain.
pub fn spawn(pool: PgPool, key: Option<[u8; 32]>, batch: u32, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let Some(key) = key else {
            if let Ok(n @ 1..) = webhooks::count_plain(&pool).await {
                tracing::warn!(
                    endpoints = n,
                    "webhook secrets are stored in plain text: set webhooks.encryption_key to seal them"
                );
            }
            return;
        };
        for attempt in 1..=ATTEMPTS {
            match seal_all(&pool, &key, batch).await {
                Ok(0) => return,
                Ok(n) => {
                    tracing::info!(endpoints = n, "sealed the webhook secrets stored plain");
                    return;
                }
                Err(e) => tracing::warn!(
                    error = %e, attempt,
                    "sealing the webhook secrets stored plain failed; trying again"
                ),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RETRY_AFTER) => {}
            }
        }
        tracing::error!(
            "gave up sealing the webhook secrets stored plain; the next start tries again"
        );
    });
}

/// Seals every plain secret, a batch per transaction; returns how many this call sealed.
/// Ends because no code writes a plain secret any more: each full batch shrinks what is left.
pub async fn seal_all(pool: &PgPool, key: &[u8; 32], batch: u32) -> anyhow::Result<u64> {
    let mut sealed = 0;
    loop {
        let n = webhooks::seal_plain(pool, key, batch).await?;
        sealed += n;
        if n < u64::from(batch) {
            return Ok(sealed);
        }
    }
}
