//! A run's agent as its row carries it, parsed once per process for each distinct spec.
//!
//! A product submits run after run of the same few agents, and an agent with a few realistic
//! tools is kilobytes of JSON schemas: a worker parsed it at every claim and dropped it at
//! every run's end, with the tool catalog built from it, a fifth of its CPU per run under
//! `bench --agent-tools` (perf). Postgres writes a `jsonb` value in one canonical form, so
//! equal specs arrive as equal bytes: the bytes are the key, compared whole (never a hash
//! alone: a tenant must not be able to make another tenant's run decode to its agent), and
//! runs of the same spec share one parsed copy.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::types::Json;
use sqlx::{Decode, Encode, Postgres, Type};

use crate::domain::AgentSpec;

/// A run's agent, shared with every other run of the same spec in this process.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent(pub Arc<AgentSpec>);

impl Deref for Agent {
    type Target = AgentSpec;

    fn deref(&self) -> &AgentSpec {
        &self.0
    }
}

impl From<AgentSpec> for Agent {
    fn from(spec: AgentSpec) -> Agent {
        Agent(Arc::new(spec))
    }
}

impl serde::Serialize for Agent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Bytes of agent JSON a process keeps parsed (`database.agent_cache_kib`; the parsed form
/// takes several times its text). Set once at start-up by [`set_cache_limit`].
static LIMIT_BYTES: AtomicUsize = AtomicUsize::new(4096 * 1024);

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Default::default);

#[derive(Default)]
struct Cache {
    specs: HashMap<Box<[u8]>, Arc<AgentSpec>>,
    bytes: usize,
}

/// How much agent JSON this process keeps parsed, in KiB (0: none).
pub fn set_cache_limit(kib: usize) {
    LIMIT_BYTES.store(kib.saturating_mul(1024), Ordering::Relaxed);
}

/// The parsed spec of `bytes` (a `jsonb` value as Postgres sent it), from `cache` when an
/// equal value was parsed before; `limit` bounds the bytes of JSON the cache holds.
fn parsed(
    cache: &Mutex<Cache>,
    limit: usize,
    bytes: &[u8],
    parse: impl FnOnce() -> Result<AgentSpec, BoxDynError>,
) -> Result<Arc<AgentSpec>, BoxDynError> {
    if bytes.len() > limit {
        return parse().map(Arc::new);
    }
    if let Some(spec) = cache.lock().expect("agent cache lock").specs.get(bytes) {
        return Ok(spec.clone());
    }
    let spec = Arc::new(parse()?);
    let mut cache = cache.lock().expect("agent cache lock");
    // Parsed meanwhile by another claim: share that one, so their runs share a catalog too.
    if let Some(known) = cache.specs.get(bytes) {
        return Ok(known.clone());
    }
    if cache.bytes + bytes.len() > limit {
        // Room is made by dropping arbitrary specs in one pass (the runs that hold them keep
        // theirs): at least what this one needs, and an eighth of the limit, so that a cache
        // kept full does not pass over the whole table for every new spec.
        let mut to_free = (cache.bytes + bytes.len() - limit).max(limit / 8);
        let mut freed = 0;
        cache.specs.retain(|key, _| {
            if to_free == 0 {
                return true;
            }
            to_free = to_free.saturating_sub(key.len());
            freed += key.len();
            false
        });
        cache.bytes -= freed;
    }
    cache.bytes += bytes.len();
    cache.specs.insert(bytes.into(), spec.clone());
    Ok(spec)
}

impl Type<Postgres> for Agent {
    fn type_info() -> PgTypeInfo {
        <Json<AgentSpec> as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <Json<AgentSpec> as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Agent {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let bytes = value.as_bytes()?;
        let limit = LIMIT_BYTES.load(Ordering::Relaxed);
        let spec = parsed(&CACHE, limit, bytes, || {
            <Json<AgentSpec> as Decode<Postgres>>::decode(value).map(|Json(spec)| spec)
        })?;
        Ok(Agent(spec))
    }
}

impl Encode<'_, Postgres> for Agent {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <Json<&AgentSpec> as Encode<Postgres>>::encode_by_ref(&Json(&self.0), buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model: &str) -> AgentSpec {
        serde_json::from_value(serde_json::json!({"model": model})).unwrap()
    }

    /// Equal bytes share one parse; other bytes never get it, whatever they hash to.
    #[test]
    fn equal_values_share_one_parse() {
        let cache = Mutex::default();
        let key = br#"{"model": "shared"}"#;
        let mut parses = 0;
        let mut parse = |model: &str| {
            parses += 1;
            Ok(spec(model))
        };
        let first = parsed(&cache, 1 << 20, key, || parse("a")).unwrap();
        let again = parsed(&cache, 1 << 20, key, || parse("b")).unwrap();
        assert_eq!(parses, 1, "parsed once");
        assert!(Arc::ptr_eq(&first, &again));
        let different = parsed(&cache, 1 << 20, br#"{"model": "shared"} "#, || {
            Ok(spec("c"))
        })
        .unwrap();
        assert_eq!(different.model, "c");
        // A value that cannot be parsed is not kept.
        let bad = br#"{"bad": 1}"#;
        assert!(parsed(&cache, 1 << 20, bad, || Err("no".into())).is_err());
        assert!(!cache.lock().unwrap().specs.contains_key(&bad[..]));
        // Nothing is kept with a limit of 0.
        let none = Mutex::default();
        parsed(&none, 0, key, || Ok(spec("d"))).unwrap();
        assert!(none.lock().unwrap().specs.is_empty());
    }

    /// The cache holds at most its limit of JSON, whatever tenants submit, and what it counts
    /// is what it holds.
    #[test]
    fn the_cache_stays_within_its_limit() {
        let cache = Mutex::default();
        let limit = 1 << 20;
        for i in 0..200 {
            let key = format!("{{\"model\": \"{}{i}\"}}", "x".repeat(50_000));
            parsed(&cache, limit, key.as_bytes(), || Ok(spec("m"))).unwrap();
            let cache = cache.lock().unwrap();
            assert!(cache.bytes <= limit, "{} > {limit}", cache.bytes);
            assert_eq!(
                cache.bytes,
                cache.specs.keys().map(|k| k.len()).sum::<usize>()
            );
            assert!(
                cache.specs.contains_key(key.as_bytes()),
                "the newest is kept"
            );
        }
    }
}
