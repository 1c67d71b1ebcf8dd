//! What the tool schemas with patterns compiled by a worker's runs may hold together: each
//! run compiles its tools' schemas at their first call and keeps them while it holds its slot,
//! so strangers' schemas at the limits times the slots could take gigabytes. A compiled schema
//! holds its estimate ([`agentfleet_shared::tool_schema::Patterns::compiled_kib`]) of the
//! worker's share (`worker.max_compiled_schema_kib`), and one tenant's runs at most
//! `worker.max_compiled_schema_kib_per_tenant` of it, so one tenant cannot leave the others no
//! room.

use std::sync::Arc;

use agentfleet_shared::tenant_tally::{Held, TenantTally};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

#[derive(Clone)]
pub struct SchemaMemory {
    permits: Arc<Semaphore>,
    /// At most the whole share: what passes it can never be granted.
    per_tenant: u64,
    /// KiB held per tenant.
    tenants: TenantTally,
}

/// Why a share was not granted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Others (or the tenant's own runs) hold too much now: a later call may fit.
    Later,
    /// More than the whole share, or than a tenant's: it never will.
    Never,
}

/// A granted share, given back when dropped (with the holding's catalog).
pub struct Share {
    _permit: OwnedSemaphorePermit,
    _tenant: Held,
}

impl SchemaMemory {
    pub fn new(kib: u64, per_tenant: u64) -> SchemaMemory {
        let kib = kib.min(Semaphore::MAX_PERMITS as u64);
        SchemaMemory {
            permits: Arc::new(Semaphore::new(kib as usize)),
            per_tenant: per_tenant.min(kib),
            tenants: TenantTally::default(),
        }
    }

    pub fn take(&self, tenant: Uuid, kib: u64) -> Result<Share, Refused> {
        if kib > self.per_tenant {
            return Err(Refused::Never);
        }
        // The tenant's part first: given back if the worker's share has no room.
        let tenant = self
            .tenants
            .take(tenant, kib, self.per_tenant)
            .ok_or(Refused::Later)?;
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(kib as u32)
            .map_err(|_| Refused::Later)?;
        Ok(Share {
            _permit: permit,
            _tenant: tenant,
        })
    }

    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_share_and_gives_it_back() {
        let memory = SchemaMemory::new(1_000, 400);
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let first = memory.take(a, 300).unwrap();
        assert_eq!(
            memory.take(a, 200).err(),
            Some(Refused::Later),
            "a's share is full"
        );
        assert_eq!(memory.take(a, 500).err(), Some(Refused::Never));
        // Another tenant still finds room; the worker's share is the next limit.
        let second = memory.take(b, 400).unwrap();
        let c = Uuid::now_v7();
        let third = memory.take(c, 300).unwrap();
        assert_eq!(
            memory.take(c, 100).err(),
            Some(Refused::Later),
            "the worker's is full"
        );
        drop(first);
        assert_eq!(memory.available(), 300);
        let again = memory.take(a, 300).unwrap();
        drop((second, third, again));
        assert_eq!(memory.available(), 1_000);
        assert!(memory.tenants.is_empty());
    }
}
