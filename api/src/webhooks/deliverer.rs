//! The webhook deliverer: a task of every API replica (`webhooks.enabled`) that sends the
//! outbox's due deliveries (`store::webhook_deliveries`).
//!
//! It runs in the API because API replicas are always up, while workers may be scaled to zero.
//! Each round claims up to its free slots (`webhooks.max_concurrency`) with `SKIP LOCKED`, so
//! replicas share the work without coordination; each claimed delivery is one attempt: signed
//! (`super::signing`), POSTed through the egress-held client (no redirects, addresses checked
//! when they resolve) within `webhooks.timeout_ms`, its answer read up to
//! `webhooks.max_response_bytes`, and its outcome recorded. A round starts every
//! `webhooks.poll_interval_ms`, or at once when a committed change notifies
//! `agentfleet_webhooks` (LISTEN/NOTIFY; the poll is the fallback when that connection is
//! down).
//!
//! Slots are shared per tenant: no tenant holds more than `webhooks.max_concurrency_per_tenant`
//! of a replica's slots, and when a slot frees, a tenant with fewer attempts in flight is served
//! first (`webhook_deliveries::claim_due_shared`). So a tenant whose endpoints are slow (each
//! attempt holding its slot up to `webhooks.timeout_ms`) delays only its own deliveries. A replica dying between claim and record leaves the delivery to be attempted again
//! after `webhooks.claim_lease_ms`, with the same id: at least once.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use reqwest::Url;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use agentfleet_shared::config::{Settings, WebhookSettings};
use agentfleet_shared::egress::EgressPolicy;
use agentfleet_shared::failpoint;
use agentfleet_shared::store::webhook_deliveries::{self, Backoff, Claimed, Outcome};
use agentfleet_shared::store::webhooks::{secret_key, stored_secret};
use agentfleet_shared::tenant_tally::TenantTally;

use crate::webhooks::signing::signature;

/// What a delivery's `last_error` says when the policy refuses its address: the same whatever
/// the address, so a webhook URL cannot map the internal network.
pub const DENIED: &str =
    "egress_denied: the URL's address is not allowed by this deployment's egress policy";

/// The Postgres channel a change that wrote deliveries notifies (migration 0009).
pub const CHANNEL: &str = "agentfleet_webhooks";

struct Deliverer {
    pool: PgPool,
    http: reqwest::Client,
    policy: Arc<EgressPolicy>,
    settings: WebhookSettings,
    backoff: Backoff,
    /// Opens endpoints' sealed secrets (`webhooks.encryption_key`).
    key: Option<[u8; 32]>,
    /// Attempts in flight per tenant.
    busy: TenantTally,
}

/// Starts the deliverer (when `webhooks.enabled`); it stops with `shutdown`.
pub fn spawn(pool: PgPool, settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let hooks = settings.webhooks.clone();
    if !hooks.enabled {
        return Ok(());
    }
    let policy = Arc::new(settings.egress_policy());
    let http = agentfleet_shared::egress_client::client(
        policy.clone(),
        0,
        Duration::from_millis(hooks.connect_timeout_ms.get()),
        hooks.max_concurrency,
    )?;
    let backoff = Backoff {
        base: Duration::from_millis(hooks.backoff_base_ms.get()),
        max: Duration::from_millis(hooks.backoff_max_ms),
        retry_for: Duration::from_millis(hooks.retry_for_ms.get()),
        max_attempts: hooks.max_attempts,
    };
    let key = hooks.key()?;
    let deliverer = Arc::new(Deliverer {
        key,
        busy: TenantTally::default(),
        pool: pool.clone(),
        http,
        policy,
        settings: hooks,
        backoff,
    });
    let wake = Arc::new(Notify::new());
    tokio::spawn(listen(
        pool,
        wake.clone(),
        deliverer.poll(),
        shutdown.clone(),
    ));
    tokio::spawn(purge(
        deliverer.pool.clone(),
        Duration::from_millis(deliverer.settings.keep_finished_ms.get()),
        shutdown.clone(),
    ));
    tokio::spawn(deliverer.run(wake, shutdown));
    Ok(())
}

/// How often finished deliveries past `webhooks.keep_finished_ms` are removed, and how many
/// one statement removes (a backlog is removed in several, each short).
const PURGE_EVERY: Duration = Duration::from_secs(60);
const PURGE_BATCH: i64 = 1000;

/// Removes old finished deliveries, so the outbox holds what is pending plus a window of
/// history. Every replica does it; concurrent purges only find less to delete.
async fn purge(pool: PgPool, keep: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(PURGE_EVERY) => {}
        }
        loop {
            match webhook_deliveries::purge_finished(&pool, keep, PURGE_BATCH).await {
                Ok(n) if n as i64 == PURGE_BATCH && !shutdown.is_cancelled() => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "could not remove old webhook deliveries");
                    break;
                }
            }
        }
    }
}

/// Forwards notifications of committed deliveries to `wake`. It holds one connection of the
/// pool; while it cannot, rounds start on the poll interval alone.
async fn listen(pool: PgPool, wake: Arc<Notify>, retry: Duration, shutdown: CancellationToken) {
    loop {
        let listening = forward(&pool, &wake);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            ended = listening => {
                let Err(e) = ended;
                tracing::debug!(error = %e, "webhook notifications unavailable; polling");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
    }
}

/// Wakes `wake` on every notification, until the connection fails.
async fn forward(pool: &PgPool, wake: &Notify) -> Result<std::convert::Infallible, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    // Anything committed before LISTEN took effect is found by this round.
    wake.notify_one();
    loop {
        listener.recv().await?;
        wake.notify_one();
    }
}

impl Deliverer {
    fn poll(&self) -> Duration {
        Duration::from_millis(self.settings.poll_interval_ms.get())
    }

    async fn run(self: Arc<Self>, wake: Arc<Notify>, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.settings.max_concurrency));
        let lease = Duration::from_millis(self.settings.claim_lease_ms);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let free = slots.available_permits();
            let mut full_round = false;
            if free > 0 {
                let busy = self.busy.snapshot();
                let claimed = webhook_deliveries::claim_due_shared(
                    &self.pool,
                    free,
                    lease,
                    self.settings.max_concurrency_per_tenant,
                    &busy,
                )
                .await;
                match claimed {
                    Ok(claimed) => {
                        full_round = claimed.len() == free;
                        for delivery in claimed {
                            let Ok(slot) = slots.clone().try_acquire_owned() else {
                                break; // cannot happen: we claimed at most the free slots
                            };
                            // Bounded by the claim, which counts what is held.
                            let busy = self.busy.take(delivery.tenant_id, 1, u64::MAX);
                            let me = self.clone();
                            tokio::spawn(async move {
                                me.attempt(delivery).await;
                                drop(busy);
                                drop(slot);
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not claim webhook deliveries");
                    }
                }
            }
            if full_round {
                // More may be due: go again as soon as a slot frees.
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    slot = slots.clone().acquire_owned() => drop(slot),
                }
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(self.poll()) => {}
            }
        }
    }

    /// One attempt of one delivery, and its record.
    async fn attempt(&self, delivery: Claimed) {
        // Test-only: the process dies after the claim committed and before anything was sent.
        failpoint::hit("webhook_before_send");
        let outcome = self.send(&delivery).await;
        // Test-only: the process dies after the receiver answered, before the outcome is
        // recorded: the delivery goes again, with the same id.
        failpoint::hit("webhook_after_send");
        let label = match &outcome {
            Outcome::Delivered { .. } => "delivered",
            Outcome::Failed { give_up: true, .. } => "given_up",
            Outcome::Failed { .. } => "failed",
        };
        metrics::counter!("agentfleet_webhook_attempts_total", "outcome" => label).increment(1);
        match webhook_deliveries::record(&self.pool, delivery.id, delivery.attempts, &outcome).await
        {
            Ok(true) => {}
            Ok(false) => tracing::debug!(
                delivery = %delivery.id,
                "delivery outcome not recorded: its endpoint was deleted or its lease passed"
            ),
            // The row stays claimed; it is attempted again after the lease, with the same id.
            Err(e) => tracing::warn!(
                delivery = %delivery.id,
                error = %e,
                "could not record a webhook delivery's outcome"
            ),
        }
    }

    async fn send(&self, delivery: &Claimed) -> Outcome {
        let age = (Utc::now() - delivery.created_at)
            .to_std()
            .unwrap_or_default();
        let failed = |status_code: Option<u16>, error: String| Outcome::Failed {
            status_code,
            error,
            retry_in: self.backoff.delay(delivery.attempts, age),
            give_up: self.backoff.gives_up(delivery.attempts, age),
        };
        let secret = stored_secret(
            delivery.endpoint_id,
            delivery.secret.as_deref(),
            delivery.secret_sealed.as_deref(),
            self.key.as_ref(),
        );
        let key = match secret
            .as_deref()
            .map_err(|e| e.to_string())
            .and_then(secret_key)
        {
            Ok(key) => key,
            Err(e) => return failed(None, format!("invalid secret: {e}")),
        };
        let url = match Url::parse(&delivery.url) {
            Ok(url) => url,
            Err(_) => return failed(None, "invalid URL".into()),
        };
        // Literal addresses (and the ports of listed names) here; resolved names at connect.
        if self.policy.check_url(&url).is_err() {
            metrics::counter!("agentfleet_egress_denied_total", "stage" => "webhook").increment(1);
            return failed(None, DENIED.into());
        }
        let id = delivery.id.to_string();
        let timestamp = Utc::now().timestamp();
        let sent = self
            .http
            .post(url)
            .timeout(self.settings.timeout())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::USER_AGENT, "agentfleet-webhooks")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                signature(&key, &id, timestamp, &delivery.body),
            )
            .body(delivery.body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) if resp.status().is_success() => Outcome::Delivered {
                status_code: resp.status().as_u16(),
            },
            Ok(resp) => {
                let code = resp.status().as_u16();
                let text = read_capped(resp, self.settings.max_response_bytes).await;
                failed(Some(code), format!("HTTP {code}: {text}"))
            }
            Err(e) if agentfleet_shared::egress_client::is_denied(&e) => {
                failed(None, DENIED.into())
            }
            Err(e) if e.is_timeout() => failed(
                None,
                format!("no answer within {} ms", self.settings.timeout_ms),
            ),
            Err(e) if e.is_connect() => failed(None, "could not connect".into()),
            Err(e) => failed(None, format!("request failed: {}", e.without_url())),
        }
    }
}

/// Up to `cap` bytes of an answer, as text; the rest is never read.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> String {
    let mut buf = Vec::new();
    while buf.len() < cap {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - buf.len();
                buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}
