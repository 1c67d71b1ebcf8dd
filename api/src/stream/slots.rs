//! Event streams open per tenant on this API process, capped (`api.max_streams_per_tenant`):
//! each open stream holds a task, a buffer and, while idle, a look in Postgres every
//! `events.idle_recheck_ms`; one tenant opening streams without end would take them from all.

use std::sync::Arc;

use agentfleet_shared::tenant_tally::{Held, TenantTally};
use axum::http::StatusCode;
use uuid::Uuid;

use crate::error::ApiError;

#[derive(Default)]
pub struct StreamSlots {
    open: TenantTally,
}

/// One open stream of a tenant; dropping it (the response body goes) frees its place.
pub struct StreamSlot {
    _open: Held,
}

impl StreamSlots {
    /// A place for one more stream of `tenant`, or 429 `too_many_streams` past `max`.
    pub fn take(self: &Arc<Self>, tenant: Uuid, max: usize) -> Result<StreamSlot, ApiError> {
        let Some(open) = self.open.take(tenant, 1, max as u64) else {
            metrics::counter!("agentfleet_requests_limited_total", "reason" => "streams")
                .increment(1);
            return Err(ApiError {
                retry_after_secs: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_streams",
                    format!(
                        "this tenant already has {max} event streams open on this API instance, the most it may; close one first"
                    ),
                )
            });
        };
        Ok(StreamSlot { _open: open })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_max_places_and_one_more_once_one_is_freed() {
        let slots = Arc::new(StreamSlots::default());
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let first = slots.take(a, 2).unwrap();
        let _second = slots.take(a, 2).unwrap();
        let refused = slots.take(a, 2).err().expect("a third is refused");
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            slots.take(b, 2).is_ok(),
            "another tenant has its own places"
        );
        drop(first);
        assert!(slots.take(a, 2).is_ok());
    }
}
