//! What the worker's holdings share while any of them uses it (compiled schemas, catalogs):
//! values held by the holdings, found here by key while one holds them.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

/// Entries past which an insert first forgets the values no holding uses any longer, at
/// least: after a tidy, twice what it left, so that many live values are not passed over at
/// every insert.
const TIDY_AT: usize = 1024;

/// `K` to a shared `V`, with `P` kept beside each (a `Weak` that pins what the key's address
/// names, say).
pub struct WeakMap<K, V, P = ()> {
    inner: Mutex<Inner<K, V, P>>,
}

struct Inner<K, V, P> {
    entries: HashMap<K, (P, Weak<V>)>,
    tidy_at: usize,
}

impl<K, V, P> Default for WeakMap<K, V, P> {
    fn default() -> Self {
        WeakMap {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                tidy_at: TIDY_AT,
            }),
        }
    }
}

impl<K: Eq + Hash, V, P> WeakMap<K, V, P> {
    /// The value of `key` if a holding still uses it.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        let inner = self.inner.lock().expect("weak map lock");
        inner.entries.get(key).and_then(|(_, v)| v.upgrade())
    }

    pub fn insert(&self, key: K, pin: P, value: &Arc<V>) {
        let mut inner = self.inner.lock().expect("weak map lock");
        if inner.entries.len() >= inner.tidy_at {
            inner.entries.retain(|_, (_, v)| v.strong_count() > 0);
            inner.tidy_at = (inner.entries.len() * 2).max(TIDY_AT);
        }
        inner.entries.insert(key, (pin, Arc::downgrade(value)));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().expect("weak map lock").entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values no holding uses are forgotten once the map passes its threshold, and a map of
    /// many live values tidies again only when it has doubled.
    #[test]
    fn dead_values_are_forgotten_and_live_ones_kept() {
        let map: WeakMap<usize, usize> = WeakMap::default();
        let live: Vec<Arc<usize>> = (0..TIDY_AT - 1).map(Arc::new).collect();
        for (i, v) in live.iter().enumerate() {
            map.insert(i, (), v);
        }
        assert_eq!(map.get(&3).as_deref(), Some(&3));
        let dead = Arc::new(7);
        map.insert(TIDY_AT, (), &dead);
        drop(dead);
        assert_eq!(map.get(&TIDY_AT), None, "no holding uses it");
        assert_eq!(map.len(), TIDY_AT);
        // At the threshold an insert tidies: the dead one goes, the live ones stay, and the
        // next tidy waits for twice what is left.
        let one_more = Arc::new(0);
        map.insert(TIDY_AT + 1, (), &one_more);
        assert_eq!(map.len(), TIDY_AT);
        assert_eq!(map.inner.lock().unwrap().tidy_at, 2 * (TIDY_AT - 1));
        assert_eq!(map.get(&(TIDY_AT + 1)).as_deref(), Some(&0));
    }
}
