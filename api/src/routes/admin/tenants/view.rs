//! A tenant as the admin endpoints answer it: with the limits and retention that apply to it.

use serde::Serialize;
use utoipa::ToSchema;

use agentfleet_shared::domain::{Limits, RetentionWindows};
use agentfleet_shared::store::tenants::TenantInfo;

use crate::state::AppState;

/// A tenant with the limits and retention windows that apply to it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantView {
    #[serde(flatten)]
    pub tenant: TenantInfo,
    /// Its own limits over the configured `[limits]` (0 = no limit).
    #[schema(value_type = Object)]
    pub effective_limits: Limits,
    /// Its own retention windows over the configured `[retention]`, in seconds (0 = kept for
    /// ever).
    #[schema(value_type = Object)]
    pub effective_retention: RetentionWindows,
}

pub fn view(state: &AppState, tenant: TenantInfo) -> TenantView {
    TenantView {
        effective_limits: tenant.limits.over(&state.settings.limits),
        effective_retention: tenant.retention.over(&state.settings.retention.windows()),
        tenant,
    }
}
