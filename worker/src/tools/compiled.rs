//! Strangers' parameter schemas compiled within the worker's memory for them
//! ([`SchemaMemory`]), and shared by the runs that give the same schema: a tenant's agent is
//! usually the same for all of its runs, and each run compiling its own copy would hold it
//! once per slot.

use std::sync::Arc;

use agentfleet_shared::tool_schema::{Limits, PatternTable};
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::schema_memory::{Refused, SchemaMemory, Share};
use super::weak_map::WeakMap;

/// A compiled schema, with the share of the worker's memory for compiled patterns it holds
/// until the last holding using it ends.
pub struct Compiled {
    pub validator: Arc<jsonschema::Validator>,
    /// Each pattern's estimated states, for pricing a call's arguments.
    pub states: PatternTable,
    _share: Option<Share>,
}

/// The worker's compiled schemas with patterns, by the digest of schema and limits, while a
/// holding uses them.
pub struct Schemas {
    memory: SchemaMemory,
    compiled: WeakMap<[u8; 32], Compiled>,
}

impl Schemas {
    pub fn new(memory: SchemaMemory) -> Schemas {
        Schemas {
            memory,
            compiled: WeakMap::default(),
        }
    }

    #[cfg(test)]
    pub fn memory(&self) -> &SchemaMemory {
        &self.memory
    }

    fn get(&self, key: &[u8; 32]) -> Option<Arc<Compiled>> {
        self.compiled.get(key)
    }

    fn put(&self, key: [u8; 32], schema: &Arc<Compiled>) {
        self.compiled.insert(key, (), schema);
    }
}

/// Told to the model when the worker's memory for compiled patterns is full.
const NO_ROOM: &str = "the tool's parameter schema cannot be compiled on this worker right \
                       now (it holds as many compiled schemas as it may); the call was not \
                       made, try it again later";

/// A schema without patterns is checked and compiled in microseconds, here; one with
/// patterns may take tens of milliseconds (a stranger's, at the limits: every pattern is
/// parsed to estimate it, then compiled), which would hold up every run sharing this
/// runtime thread: it goes to a blocking thread, is shared with the holdings that compiled
/// it already, or compiles once its estimated memory is granted as `tenant`'s. The outer
/// error is a refusal for memory (not kept: a later call may find room), the inner one the
/// schema's own (kept for the holding).
pub async fn compile(
    schema: Arc<Value>,
    limits: Limits,
    within: Option<(Arc<Schemas>, Uuid)>,
) -> Result<Result<Arc<Compiled>, String>, String> {
    if !agentfleet_shared::tool_schema::has_patterns(&schema) {
        return compile_here(&schema, &limits, None);
    }
    tokio::task::spawn_blocking(move || compile_here(&schema, &limits, within.as_ref()))
        .await
        .map_err(|_| "the tool's parameter schema could not be compiled".to_owned())?
}

fn compile_here(
    schema: &Value,
    limits: &Limits,
    within: Option<&(Arc<Schemas>, Uuid)>,
) -> Result<Result<Arc<Compiled>, String>, String> {
    let unusable = |e: String| format!("the tool's parameter schema is not usable: {e}");
    let key = within.map(|_| {
        let mut digest = Sha256::new();
        digest.update(serde_json::to_vec(schema).expect("a Value serializes"));
        digest.update(limits.max_patterns.to_le_bytes());
        digest.update(limits.max_states.to_le_bytes());
        <[u8; 32]>::from(digest.finalize())
    });
    if let (Some((schemas, _)), Some(key)) = (within, &key)
        && let Some(compiled) = schemas.get(key)
    {
        return Ok(Ok(compiled));
    }
    let inspected = match agentfleet_shared::tool_schema::inspect(
        schema,
        limits,
        "the schema",
        Default::default(),
    ) {
        Ok(inspected) => inspected,
        Err(e) => return Ok(Err(unusable(e))),
    };
    let share = match within {
        Some((schemas, tenant)) if inspected.patterns.count > 0 => {
            match schemas
                .memory
                .take(*tenant, inspected.patterns.compiled_kib())
            {
                Ok(share) => Some(share),
                Err(Refused::Later) => {
                    metrics::counter!("agentfleet_schema_compiles_deferred_total").increment(1);
                    return Err(NO_ROOM.to_owned());
                }
                Err(Refused::Never) => {
                    return Ok(Err(unusable(
                        "its patterns would take more memory compiled than this worker allows \
                         one tenant's compiled schemas together"
                            .to_owned(),
                    )));
                }
            }
        }
        _ => None,
    };
    let validator = match agentfleet_shared::tool_schema::build(schema) {
        Ok(validator) => validator,
        Err(e) => return Ok(Err(unusable(e))),
    };
    let compiled = Arc::new(Compiled {
        validator: Arc::new(validator),
        states: inspected.states,
        _share: share,
    });
    if let (Some((schemas, _)), Some(key)) = (within, key) {
        schemas.put(key, &compiled);
    }
    Ok(Ok(compiled))
}
