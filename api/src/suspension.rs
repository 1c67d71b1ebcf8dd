//! What a suspended tenant may not do. Its keys keep reading and cancelling (an operator
//! suspends to stop spending, not to hide data), but nothing new starts: creating runs and
//! resuming waiting runs answer 403 `tenant_suspended`. The suspension travels with the
//! cached key, so it reaches every replica within `api.auth_cache_ttl_ms`; the workers do
//! not start a suspended tenant's queued runs.

use axum::http::StatusCode;

use agentfleet_shared::store::tenants::Principal;

use crate::error::ApiError;

/// Refuses a request that would start work for a suspended tenant.
pub fn require_active(caller: &Principal) -> Result<(), ApiError> {
    if caller.suspended {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "tenant_suspended",
            "this tenant is suspended: runs can be read and cancelled, but none created or resumed",
        ));
    }
    Ok(())
}
