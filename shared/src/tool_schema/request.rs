//! The tool schemas of one API request, each distinct one checked and compiled once, and the
//! verdicts a process remembers of the schemas it accepted before.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Limits, Patterns, build, has_patterns, inspect};

/// SHA-256 of a schema's serialization (serde_json writes an object's keys sorted, so the
/// same schema has the same digest however its keys were ordered in the request).
type SchemaDigest = [u8; 32];

/// The tool schemas of one request (a run's agent, or every agent of a batch): each distinct
/// schema is checked and compiled once, and their patterns are held to one [`Limits`]
/// together, so a request costs the API at most that much compiling however many runs it
/// holds (a batch of 10,000 agents, each with its own patterns, compiled each before).
pub struct RequestSchemas<'a> {
    limits: Limits,
    /// Where the limit counts patterns, for its refusal ("the agent's tool schemas
    /// together").
    what: &'static str,
    seen: HashSet<SchemaDigest>,
    /// Each distinct schema with the field of its first use.
    distinct: Vec<Distinct<'a>>,
}

struct Distinct<'a> {
    field: String,
    schema: &'a Value,
    digest: SchemaDigest,
}

/// A refused schema: the field it was given in (`agent.tools[0].parameters`) and why.
#[derive(Debug, PartialEq, Eq)]
pub struct SchemaError {
    pub field: String,
    pub message: String,
}

/// The schemas this process accepted before, by digest, with the patterns each holds. A
/// product submits the same agent run after run: its schemas are walked and compiled at the
/// first request, and every later one costs a hash and a lookup (an agent of ten realistic
/// tools took the API more CPU to compile than the rest of its run). A verdict is the
/// schema's own: whether it fits a request's limit beside that request's other schemas is
/// counted each time. Bounded (`api.max_remembered_schemas`): past it, an arbitrary verdict
/// makes room; a refused schema is never kept, so it is checked again each time.
#[derive(Debug)]
pub struct Verdicts {
    max: usize,
    known: Mutex<HashMap<SchemaDigest, Patterns>>,
}

impl Verdicts {
    pub fn new(max: usize) -> Arc<Verdicts> {
        Arc::new(Verdicts {
            max,
            known: Mutex::new(HashMap::new()),
        })
    }

    pub fn len(&self) -> usize {
        self.known.lock().expect("verdicts lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lookup<'d>(&self, digests: impl Iterator<Item = &'d SchemaDigest>) -> Vec<Option<Patterns>> {
        let known = self.known.lock().expect("verdicts lock");
        digests.map(|d| known.get(d).copied()).collect()
    }

    fn keep(&self, learned: Vec<(SchemaDigest, Patterns)>) {
        if self.max == 0 || learned.is_empty() {
            return;
        }
        let mut known = self.known.lock().expect("verdicts lock");
        for (digest, patterns) in learned {
            if known.len() >= self.max && !known.contains_key(&digest) {
                // Arbitrary ones (which is cheaper to lose is not known, and the map's order
                // is not the tenants' to choose), an eighth at once: a full map is not passed
                // over for every new schema.
                let mut drop = (self.max / 8).max(1);
                known.retain(|_, _| {
                    if drop == 0 {
                        return true;
                    }
                    drop -= 1;
                    false
                });
            }
            known.insert(digest, patterns);
        }
    }
}

/// One schema of a request as [`check_each`] takes it.
struct Entry<'s> {
    field: &'s str,
    schema: &'s Value,
    digest: SchemaDigest,
    /// Its patterns when it was accepted before: then only they are counted (it is walked
    /// again only to word a refusal as the walk words it).
    known: Option<Patterns>,
}

impl<'a> RequestSchemas<'a> {
    pub fn new(limits: Limits, what: &'static str) -> RequestSchemas<'a> {
        RequestSchemas {
            limits,
            what,
            seen: HashSet::new(),
            distinct: Vec::new(),
        }
    }

    /// Takes `schema` unless the request gave the same one before.
    pub fn add(&mut self, field: String, schema: &'a Value) {
        let digest: SchemaDigest =
            Sha256::digest(serde_json::to_vec(schema).expect("a Value serializes")).into();
        if self.seen.insert(digest) {
            self.distinct.push(Distinct {
                field,
                schema,
                digest,
            });
        }
    }

    /// Checks ([`inspect`]) and compiles every distinct schema that `verdicts` does not know,
    /// in order, the patterns of all counted together; the first refused is named by the
    /// field that gave it. When a new schema holds patterns this may take up to ~0.1 s at the
    /// default limits: it runs on a blocking thread, once a permit of `compiles` (the
    /// process's compiles at once) is granted. The schemas accepted are remembered.
    pub async fn compile(
        self,
        compiles: &Arc<tokio::sync::Semaphore>,
        verdicts: &Verdicts,
    ) -> Result<(), SchemaError> {
        let (limits, what) = (self.limits, self.what);
        let known = verdicts.lookup(self.distinct.iter().map(|d| &d.digest));
        let slow = self
            .distinct
            .iter()
            .zip(&known)
            .any(|(d, k)| k.is_none() && has_patterns(d.schema));
        if !slow {
            let entries = self.distinct.iter().zip(known).map(|(d, known)| Entry {
                field: &d.field,
                schema: d.schema,
                digest: d.digest,
                known,
            });
            let learned = check_each(&limits, what, entries)?;
            verdicts.keep(learned);
            return Ok(());
        }
        // Held by the blocking task, not by this future: a request given up (a client gone,
        // the request's deadline) does not free its place while its compile goes on.
        let permit = compiles
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        // The blocking task owns what it checks: the schemas, copied.
        let owned: Vec<(String, Value, SchemaDigest, Option<Patterns>)> = self
            .distinct
            .into_iter()
            .zip(known)
            .map(|(d, k)| (d.field, d.schema.clone(), d.digest, k))
            .collect();
        let learned = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let entries = owned.iter().map(|(field, schema, digest, known)| Entry {
                field,
                schema,
                digest: *digest,
                known: *known,
            });
            check_each(&limits, what, entries)
        })
        .await
        .unwrap_or_else(|e| {
            Err(SchemaError {
                field: String::new(),
                message: format!("the tool schemas could not be checked: {e}"),
            })
        })?;
        verdicts.keep(learned);
        Ok(())
    }
}

/// Counts each schema's patterns onto the request's total, walking and compiling the new
/// ones; returns the verdicts learned.
fn check_each<'s>(
    limits: &Limits,
    what: &str,
    entries: impl Iterator<Item = Entry<'s>>,
) -> Result<Vec<(SchemaDigest, Patterns)>, SchemaError> {
    let mut total = Patterns::default();
    let mut learned = Vec::new();
    for Entry {
        field,
        schema,
        digest,
        known,
    } in entries
    {
        let refuse = |message| SchemaError {
            field: field.to_owned(),
            message,
        };
        if let Some(patterns) = known {
            let before = total;
            total.add(patterns);
            if total.within(limits, what).is_err() {
                // Refused: worded by the walk, which meets the patterns one by one (it may
                // pass the limit on states where the whole schema's count says patterns).
                inspect(schema, limits, what, before).map_err(refuse)?;
                total.within(limits, what).map_err(refuse)?;
            }
            continue;
        }
        let found = inspect(schema, limits, what, total)
            .map_err(refuse)?
            .patterns;
        total.add(found);
        build(schema).map_err(refuse)?;
        learned.push((digest, found));
    }
    Ok(learned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Compiles `schemas` as one agent's tools (`agent.tools[i].parameters`).
    async fn agent_schemas(
        limits: Limits,
        schemas: &[&Value],
        compiles: &Arc<tokio::sync::Semaphore>,
        verdicts: &Verdicts,
    ) -> Result<(), SchemaError> {
        let mut request = RequestSchemas::new(limits, "the agent's tool schemas together");
        for (i, schema) in schemas.iter().enumerate() {
            request.add(format!("agent.tools[{i}].parameters"), schema);
        }
        request.compile(compiles, verdicts).await
    }

    #[tokio::test]
    async fn a_request_compiles_each_distinct_schema_once_within_one_limit() {
        let compiles = Arc::new(tokio::sync::Semaphore::new(1));
        // Nothing remembered: every request checks its schemas itself.
        let verdicts = Verdicts::new(0);
        let limits = Limits {
            max_patterns: 2,
            max_states: 100_000,
        };
        let one = json!({"type": "object", "properties": {"a": {"pattern": "^a+$"}}});
        let two = json!({"type": "object", "properties": {"b": {"pattern": "^b+$"}}});
        let three = json!({"type": "object", "properties": {"c": {"pattern": "^c+$"}}});
        // The same schema in every run of a batch counts once.
        let mut schemas = RequestSchemas::new(limits, "the batch's tool schemas together");
        for i in 0..1_000 {
            schemas.add(format!("runs[{i}].agent.tools[0].parameters"), &one);
        }
        schemas.add("runs[7].x".into(), &two);
        assert_eq!(schemas.distinct.len(), 2);
        schemas.compile(&compiles, &verdicts).await.unwrap();
        let mut schemas = RequestSchemas::new(limits, "the batch's tool schemas together");
        schemas.add("runs[0].agent.tools[0].parameters".into(), &one);
        schemas.add("runs[7].x".into(), &two);
        schemas.add("runs[9].agent.tools[1].parameters".into(), &three);
        let err = schemas.compile(&compiles, &verdicts).await.unwrap_err();
        assert_eq!(err.field, "runs[9].agent.tools[1].parameters");
        assert!(
            err.message.contains("more than 2 patterns") && err.message.contains("batch's"),
            "{}",
            err.message
        );
        // What does not compile is named by the field that gave it first.
        let bad = json!({"type": 12});
        let plain = json!({"type": "object"});
        let err = agent_schemas(limits, &[&plain, &bad, &bad], &compiles, &verdicts)
            .await
            .unwrap_err();
        assert_eq!(err.field, "agent.tools[1].parameters");
        assert!(
            err.message.contains("invalid JSON Schema"),
            "{}",
            err.message
        );
        // A reference the argument check could not follow is refused by the walk.
        let remote = json!({"properties": {"a": {"$ref": "https://x/s.json"}}});
        let err = agent_schemas(limits, &[&remote], &compiles, &verdicts)
            .await
            .unwrap_err();
        assert!(
            err.message.contains("`$ref` at /properties/a"),
            "{}",
            err.message
        );
        assert!(verdicts.is_empty(), "a bound of 0 keeps nothing");
    }

    /// A schema accepted once is not walked again: only its patterns are counted, and they
    /// still count against each request's limit beside its other schemas.
    #[tokio::test]
    async fn accepted_schemas_are_remembered_but_still_counted() {
        let compiles = Arc::new(tokio::sync::Semaphore::new(1));
        let verdicts = Verdicts::new(16);
        let limits = Limits {
            max_patterns: 2,
            max_states: 100_000,
        };
        let one = json!({"type": "object", "properties": {"a": {"pattern": "^a+$"}}});
        let two = json!({"type": "object", "properties": {"b": {"pattern": "^b+$"},
                                                          "c": {"pattern": "^c+$"}}});
        let plain = json!({"type": "object"});
        agent_schemas(limits, &[&one, &plain], &compiles, &verdicts)
            .await
            .unwrap();
        agent_schemas(limits, &[&two], &compiles, &verdicts)
            .await
            .unwrap();
        assert_eq!(verdicts.len(), 3);
        let digest =
            |v: &Value| -> SchemaDigest { Sha256::digest(serde_json::to_vec(v).unwrap()).into() };
        let states = |p: &str| super::super::pattern_states(p).unwrap();
        assert_eq!(
            verdicts.lookup([digest(&one), digest(&two)].iter()),
            vec![
                Some(Patterns {
                    count: 1,
                    states: states("^a+$")
                }),
                Some(Patterns {
                    count: 2,
                    states: states("^b+$") + states("^c+$")
                })
            ]
        );
        // Both known: together they hold three patterns, past the limit of two, and the
        // schema that passes it is named.
        let err = agent_schemas(limits, &[&one, &two], &compiles, &verdicts)
            .await
            .unwrap_err();
        assert_eq!(err.field, "agent.tools[1].parameters");
        assert!(
            err.message.contains("more than 2 patterns"),
            "{}",
            err.message
        );
        // A known schema is not walked again: a verdict planted for a schema the walk would
        // refuse is taken as it is (which is how the test sees that nothing re-checked it).
        let refused = json!({"properties": {"a": {"$ref": "https://x/s.json"}}});
        verdicts.keep(vec![(digest(&refused), Patterns::default())]);
        agent_schemas(limits, &[&refused], &compiles, &verdicts)
            .await
            .unwrap();
        // A refused schema is not remembered.
        let bad = json!({"type": 12});
        agent_schemas(limits, &[&bad], &compiles, &verdicts)
            .await
            .unwrap_err();
        assert_eq!(verdicts.lookup([digest(&bad)].iter()), vec![None]);
    }

    /// A remembered schema past the request's limit is refused with the walk's own words: the
    /// walk meets patterns one by one, and may pass the limit on states first where the
    /// schema's whole count would say patterns.
    #[tokio::test]
    async fn a_remembered_schema_is_refused_as_the_walk_refuses_it() {
        let compiles = Arc::new(tokio::sync::Semaphore::new(1));
        let limits = Limits {
            max_patterns: 2,
            max_states: 1_000,
        };
        let earlier = json!({"pattern": "a{600}"});
        let later = json!({"properties": {"p": {"pattern": "c"}, "q": {"pattern": "b{500}"}}});
        let refusal = |verdicts: Arc<Verdicts>| {
            let (earlier, later, compiles) = (&earlier, &later, &compiles);
            async move {
                agent_schemas(limits, &[earlier, later], compiles, &verdicts)
                    .await
                    .unwrap_err()
            }
        };
        let walked = refusal(Verdicts::new(0)).await;
        let remembering = Verdicts::new(16);
        agent_schemas(limits, &[&later], &compiles, &remembering)
            .await
            .unwrap();
        assert_eq!(remembering.len(), 1);
        assert_eq!(refusal(remembering).await, walked);
        assert_eq!(walked.field, "agent.tools[1].parameters");
    }

    #[test]
    fn verdicts_are_bounded() {
        let verdicts = Verdicts::new(3);
        let learned = (0..10u8).map(|i| ([i; 32], Patterns::default())).collect();
        verdicts.keep(learned);
        assert_eq!(verdicts.len(), 3);
        // The last one learned is always kept.
        assert_eq!(
            verdicts.lookup([[9u8; 32]].iter()),
            vec![Some(Patterns::default())]
        );
        // Learning a verdict already known evicts nothing.
        verdicts.keep(vec![([9u8; 32], Patterns::default())]);
        assert_eq!(verdicts.len(), 3);
    }
}
