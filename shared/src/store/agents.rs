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

/// The parsed spec of `bytes` (a `jsonb` value as Postgres sent it), from the cache when an
/// equal value was parsed before.
fn parsed(
    bytes: &[u8],
    parse: impl FnOnce() -> Result<AgentSpec, BoxDynError>,
) -> Result<Arc<AgentSpec>, BoxDynError> {
    let limit = LIMIT_BYTES.load(Ordering::Relaxed);
    if bytes.len() > limit {
        return parse().map(Arc::new);
    }
    if let Some(spec) = CACHE.lock().expect("agent cache lock").specs.get(bytes) {
        return Ok(spec.clone());
    }
    let spec = Arc::new(parse()?);
    let mut cache = CACHE.lock().expect("agent cache lock");
    if !cache.specs.contains_key(bytes) {
        // Room is made by dropping arbitrary specs: the runs that hold them keep theirs.
        while cache.bytes + bytes.len() > limit {
            let Some(victim) = cache.specs.keys().next().cloned() else {
                break;
            };
            cache.specs.remove(&victim);
            cache.bytes -= victim.len();
        }
        cache.bytes += bytes.len();
        cache.specs.insert(bytes.into(), spec.clone());
    }
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
        let spec = parsed(bytes, || {
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
        let key = format!("{{\"model\": \"shared-{}\"}}", uuid::Uuid::now_v7());
        let mut parses = 0;
        let first = parsed(key.as_bytes(), || {
            parses += 1;
            Ok(spec("a"))
        })
        .unwrap();
        let again = parsed(key.as_bytes(), || {
            parses += 1;
            Ok(spec("b"))
        })
        .unwrap();
        assert_eq!(parses, 1, "parsed once");
        assert!(Arc::ptr_eq(&first, &again));
        let other = format!("{key} ");
        let different = parsed(other.as_bytes(), || Ok(spec("c"))).unwrap();
        assert_eq!(different.model, "c");
        // A value that cannot be parsed is not kept.
        let bad = format!("{{\"bad\": \"{}\"}}", uuid::Uuid::now_v7());
        assert!(parsed(bad.as_bytes(), || Err("no".into())).is_err());
        assert!(!CACHE.lock().unwrap().specs.contains_key(bad.as_bytes()));
    }

    /// The cache holds at most its limit of JSON, whatever tenants submit.
    #[test]
    fn the_cache_stays_within_its_limit() {
        let limit = LIMIT_BYTES.load(Ordering::Relaxed);
        for _ in 0..200 {
            let key = format!(
                "{{\"model\": \"{}{}\"}}",
                "x".repeat(50_000),
                uuid::Uuid::now_v7()
            );
            parsed(key.as_bytes(), || Ok(spec("m"))).unwrap();
        }
        let cache = CACHE.lock().unwrap();
        assert!(cache.bytes <= limit, "{} > {limit}", cache.bytes);
        assert_eq!(
            cache.bytes,
            cache.specs.keys().map(|k| k.len()).sum::<usize>()
        );
    }
}
