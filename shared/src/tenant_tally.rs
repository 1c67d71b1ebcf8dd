//! Amounts held per tenant, each holding given back when dropped: how a process caps what one
//! tenant may hold of something all tenants share (an API's open event streams, a worker's
//! memory for compiled schemas).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

#[derive(Clone, Default)]
pub struct TenantTally {
    /// A tenant holding nothing has no entry.
    held: Arc<Mutex<HashMap<Uuid, u64>>>,
}

/// What one [`TenantTally::take`] holds, until dropped.
pub struct Held {
    tally: TenantTally,
    tenant: Uuid,
    amount: u64,
}

impl TenantTally {
    /// `amount` more for `tenant`, if what it holds then stays within `max`.
    pub fn take(&self, tenant: Uuid, amount: u64, max: u64) -> Option<Held> {
        let mut held = self.held.lock().expect("tenant tally lock");
        let now = held.get(&tenant).copied().unwrap_or(0);
        if now.saturating_add(amount) > max {
            return None;
        }
        held.insert(tenant, now + amount);
        Some(Held {
            tally: self.clone(),
            tenant,
            amount,
        })
    }

    /// What each tenant holding anything holds now.
    pub fn snapshot(&self) -> Vec<(Uuid, u64)> {
        let held = self.held.lock().expect("tenant tally lock");
        held.iter().map(|(t, n)| (*t, *n)).collect()
    }

    /// Whether no tenant holds anything.
    pub fn is_empty(&self) -> bool {
        self.held.lock().expect("tenant tally lock").is_empty()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.tally.held.lock().expect("tenant tally lock");
        if let Some(n) = held.get_mut(&self.tenant) {
            *n -= self.amount.min(*n);
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_up_to_its_max_and_gives_back_what_it_drops() {
        let tally = TenantTally::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let first = tally.take(a, 3, 5).unwrap();
        assert!(tally.take(a, 3, 5).is_none());
        let second = tally.take(a, 2, 5).unwrap();
        let of_b = tally.take(b, 5, 5);
        assert!(of_b.is_some(), "each tenant its own");
        assert_eq!(tally.snapshot().len(), 2);
        drop(first);
        let third = tally.take(a, 3, 5).unwrap();
        drop((second, third, of_b));
        assert!(tally.is_empty());
    }
}
