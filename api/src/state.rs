//! What every handler and middleware reaches: the database pool, the event bus and hub, the
//! settings, and the per-process limiters and caches (`AppState`).

use std::sync::Arc;

use agentfleet_shared::config::Settings;
use agentfleet_shared::events::EventBus;
use agentfleet_shared::queue::Publisher;
use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::create_many::LimitedRun;
use agentfleet_shared::store::group_commit::Batcher;
use agentfleet_shared::store::runs::RunRow;
use sqlx::PgPool;

use crate::stream::hub::Hub;

/// What every handler reaches, behind one `Arc`: axum clones the state for each handler and
/// each middleware of every request, and a clone of the fields themselves (a dozen reference
/// counts, the event bus's key prefix) showed in the API's profile under load.
#[derive(Clone)]
pub struct AppState(Arc<AppStateInner>);

impl AppState {
    pub fn new(inner: AppStateInner) -> Self {
        AppState(Arc::new(inner))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppStateInner;

    fn deref(&self) -> &AppStateInner {
        &self.0
    }
}

pub struct AppStateInner {
    pub pool: PgPool,
    /// Run creations on new threads, written together when they arrive at once.
    pub creates: Batcher<LimitedRun, Result<RunRow, StoreError>>,
    /// Fair dispatch of limited tenants' held runs (`crate::fair_dispatch`): per tenant, the runs
    /// to publish.
    pub dispatches: Batcher<uuid::Uuid, Vec<uuid::Uuid>>,
    pub bus: EventBus,
    pub publisher: Publisher,
    pub hub: Hub,
    pub settings: Arc<Settings>,
    pub tokens: crate::auth::stream_token::TokenSigner,
    pub auth_cache: Arc<crate::auth::cache::AuthCache>,
    /// Per-tenant request rate (`limits.requests_per_second`), shared across replicas.
    pub rate_limiter: Arc<crate::rate_limit::RateLimiter>,
    /// Keys seen since the last `last_used_at` write (`crate::auth::key_usage`).
    pub key_usage: Arc<crate::auth::key_usage::KeyUsage>,
    /// Tells every replica to drop cached keys an admin call changed.
    pub announcer: crate::auth::invalidation::Announcer,
    /// Cancelled when the server stops, so open event streams end and shutdown can finish.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Seals registered MCP servers' header values (`mcp.encryption_key`); none: headers are
    /// refused.
    pub mcp_key: Option<[u8; 32]>,
    /// Seals webhook endpoints' signing secrets (`webhooks.encryption_key`); none: endpoints
    /// cannot be registered nor their secrets rotated.
    pub webhook_key: Option<[u8; 32]>,
    /// Failed admin authentications per source (`api.admin_max_failures`).
    pub admin_failures: Arc<crate::auth::attempts::FailedAttempts>,
    /// Unknown API keys per source (`api.auth_max_failures`); none when that is 0.
    pub auth_failures: Option<Arc<crate::auth::attempts::FailedAttempts>>,
    /// Lookups of keys never seen valid here, at once (`api.auth_unseen_lookups`).
    pub auth_unseen_lookups: tokio::sync::Semaphore,
    /// Refused sources' requests held before their 429 (`api.auth_lockout_max_delayed`).
    pub auth_delayed: tokio::sync::Semaphore,
    /// Request bodies held by this process (`api.body_budget_bytes`) and large ones per tenant.
    pub admission: Arc<crate::admission::Admission>,
    /// What the servers answered the last background check (`/readyz`).
    pub readiness: Arc<crate::readiness::Readiness>,
    /// Event streams open per tenant (`api.max_streams_per_tenant`).
    pub streams: Arc<crate::stream::slots::StreamSlots>,
    /// Requests whose tool schemas (with patterns) are being checked and compiled at once
    /// (`api.max_schema_compiles`): each may take ~0.1 s and ~15 MiB of a blocking thread.
    pub schema_compiles: Arc<tokio::sync::Semaphore>,
    /// Tool schemas accepted before (`api.max_remembered_schemas`): not checked again.
    pub schema_verdicts: Arc<agentfleet_shared::tool_schema::Verdicts>,
}
