//! Tools: what the model is offered, how arguments are checked, and how the calls of one
//! iteration are settled (executed, paused for a decision or an answer, or skipped).

pub mod builtin;
pub mod catalog;
pub mod compiled;
pub mod egress;
pub mod http;
pub mod mcp;
pub mod offer;
pub mod schema_memory;
pub mod settle;
pub mod weak_map;

use std::sync::Arc;

use agentfleet_shared::tool_schema::Limits;
use serde_json::Value;
use uuid::Uuid;

use compiled::{Compiled, Schemas};
pub use schema_memory::SchemaMemory;

/// A tool's parameter schema with its validator, compiled at the first call that needs it and
/// then kept with the catalog (once per holding, not once per call). The schema is a
/// stranger's (a tenant's agent, an MCP server): it is compiled by
/// [`agentfleet_shared::tool_schema::compile`] (on a blocking thread when it holds patterns:
/// tens of milliseconds at the limits), and each call's arguments are priced against it
/// before they are validated.
pub struct Parameters {
    schema: Arc<Value>,
    /// What the schema's patterns may add up to ([`agentfleet_shared::tool_schema::compile`]).
    limits: Limits,
    /// The worker's compiled schemas, and the tenant whose share of their memory this one
    /// counts against; none for the built-in tools' own schemas.
    within: Option<(Arc<Schemas>, Uuid)>,
    compiled: tokio::sync::OnceCell<Result<Arc<Compiled>, String>>,
}

/// Checks up to this many are validated on the runtime's thread (well under a millisecond
/// for ordinary arguments), a refusal explained; dearer ones on a blocking thread, only
/// decided, so a stranger's schema holds up the worker's other runs no longer than the
/// price walk takes.
const CHECKS_INLINE: u64 = 2_000;

impl Parameters {
    /// `limits`: `mcp.max_schema_patterns` and `mcp.max_schema_pattern_states` for an MCP
    /// server's schema; an agent's own were bounded when the run was submitted
    /// ([`Limits::NONE`] here).
    pub fn new(schema: Value, limits: Limits) -> Parameters {
        Parameters {
            schema: Arc::new(schema),
            limits,
            within: None,
            compiled: tokio::sync::OnceCell::new(),
        }
    }

    /// Compiled with patterns, this schema is shared with `schemas`' other holdings, and
    /// counts against their memory as `tenant`'s.
    pub fn within(mut self, schemas: &Arc<Schemas>, tenant: Uuid) -> Parameters {
        self.within = Some((schemas.clone(), tenant));
        self
    }

    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Parses and validates a call's arguments, refusing them unvalidated when checking them
    /// could take more than `max_checks` checks (`worker.max_argument_checks`; see
    /// [`agentfleet_shared::tool_schema::cost`]). The error text is what the model will see.
    pub async fn check(&self, raw: &str, max_checks: u64) -> Result<Value, String> {
        let args = parse(raw)?;
        // A compile refused for memory is not kept: a later call may find room.
        let compiled = self
            .compiled
            .get_or_try_init(|| {
                compiled::compile(self.schema.clone(), self.limits, self.within.clone())
            })
            .await?;
        let compiled = compiled.as_ref().map_err(Clone::clone)?;
        let validator = &compiled.validator;
        let checks = agentfleet_shared::tool_schema::cost_with(
            &self.schema,
            &args,
            max_checks,
            &compiled.states,
        )
        .map_err(|e| e.to_string())?;
        if checks <= CHECKS_INLINE {
            return validate(args, validator, true);
        }
        let validator = validator.clone();
        tokio::task::spawn_blocking(move || validate(args, &validator, false))
            .await
            .map_err(|_| "the arguments could not be checked".to_owned())?
    }
}

/// Parses and validates a call's arguments against `schema`, compiled for this call only: for
/// the built-in tools' own schemas, which are small and never branch, so no budget is needed.
pub fn check_arguments(raw: &str, schema: &Value) -> Result<Value, String> {
    let args = parse(raw)?;
    validate(args, &compile(schema, &Limits::NONE)?, true)
}

fn compile(schema: &Value, limits: &Limits) -> Result<jsonschema::Validator, String> {
    agentfleet_shared::tool_schema::compile(schema, limits)
        .map_err(|e| format!("the tool's parameter schema is not usable: {e}"))
}

fn parse(raw: &str) -> Result<Value, String> {
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let mut args: Value =
        serde_json::from_str(raw).map_err(|e| format!("arguments are not valid JSON: {e}"))?;
    // An escaped NUL (`\u0000`) decodes to a character Postgres cannot store.
    agentfleet_shared::sanitize::strip_nul_value(&mut args);
    Ok(args)
}

/// Validates `args`; with `explain`, a refusal lists (up to five of) the errors. Collecting
/// errors costs more than deciding (every branch's errors are gathered, and jsonschema runs
/// a one-branch `anyOf` twice), more than [`agentfleet_shared::tool_schema::cost`] prices, so
/// dear arguments are only decided.
fn validate(
    args: Value,
    validator: &jsonschema::Validator,
    explain: bool,
) -> Result<Value, String> {
    if validator.is_valid(&args) {
        return Ok(args);
    }
    if !explain {
        return Err("arguments do not match the tool's schema".to_owned());
    }
    let errors: Vec<String> = validator
        .iter_errors(&args)
        .take(5)
        .map(|e| {
            let path = e.instance_path().to_string();
            if path.is_empty() {
                e.to_string()
            } else {
                format!("{path}: {e}")
            }
        })
        .collect();
    Err(format!(
        "arguments do not match the tool's schema: {}",
        errors.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]});
        assert_eq!(
            check_arguments(r#"{"a": 1}"#, &schema).unwrap(),
            json!({"a": 1})
        );
        assert!(
            check_arguments("{not json", &schema)
                .unwrap_err()
                .contains("not valid JSON")
        );
        let err = check_arguments(r#"{"a": "x"}"#, &schema).unwrap_err();
        assert!(err.contains("/a"), "{err}");
        assert!(
            check_arguments("", &schema)
                .unwrap_err()
                .contains("required")
        );
    }

    fn most(patterns: usize) -> Limits {
        Limits {
            max_patterns: patterns,
            max_states: u64::MAX,
        }
    }

    /// Compiling a schema with patterns (tens of milliseconds at the limits, more in a debug
    /// build) leaves the runtime's thread to the worker's other runs: on a one-thread runtime,
    /// a task that only counts and yields goes on counting while the schema compiles (done in
    /// place, nothing else would run until it ended).
    #[tokio::test]
    async fn a_schema_with_patterns_compiles_off_the_runtime_thread() {
        let mut properties = serde_json::Map::new();
        for i in 0..16 {
            properties.insert(
                format!("p{i}"),
                json!({"type": "string", "pattern": format!("(ab|cd|ef){{500}}x{i}")}),
            );
        }
        let parameters = Parameters::new(
            json!({"type": "object", "properties": properties}),
            Limits::NONE,
        );
        let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = {
            let counted = counted.clone();
            tokio::spawn(async move {
                loop {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        // The counter has started before the compile.
        while counted.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let before = counted.load(std::sync::atomic::Ordering::Relaxed);
        let refused = parameters.check(r#"{"p0": "x"}"#, 100_000).await;
        let during = counted.load(std::sync::atomic::Ordering::Relaxed) - before;
        counter.abort();
        assert!(refused.unwrap_err().contains("does not match"));
        assert!(during > 0, "the runtime's thread was held by the compile");
    }

    /// Compiled patterns share the worker's memory for them: a schema that does not fit is
    /// refused for now (not kept), and fits once another holding lets go of its share.
    #[tokio::test]
    async fn compiled_patterns_share_the_workers_memory_for_them() {
        let two_patterns = |tag: &str| {
            json!({"type": "object", "properties": {
                "a": {"type": "string", "pattern": format!("^a{tag}$")},
                "b": {"type": "string", "pattern": format!("^b{tag}$")}}})
        };
        // Two patterns are estimated at 2 × 160 KiB: one such schema fits, two do not.
        let memory = Arc::new(Schemas::new(SchemaMemory::new(500, 500)));
        let tenant = Uuid::now_v7();
        let first = Parameters::new(two_patterns("1"), Limits::NONE).within(&memory, tenant);
        assert_eq!(
            first.check(r#"{"a": "a1"}"#, 1_000).await,
            Ok(json!({"a": "a1"}))
        );
        assert_eq!(memory.memory().available(), 500 - 320);
        // Another holding giving the same schema shares the compiled one: no second share.
        let same = Parameters::new(two_patterns("1"), Limits::NONE).within(&memory, tenant);
        assert_eq!(
            same.check(r#"{"a": "a1"}"#, 1_000).await,
            Ok(json!({"a": "a1"}))
        );
        assert_eq!(memory.memory().available(), 500 - 320);
        let second = Parameters::new(two_patterns("2"), Limits::NONE).within(&memory, tenant);
        let refused = second.check(r#"{"a": "a2"}"#, 1_000).await.unwrap_err();
        assert!(refused.contains("try it again later"), "{refused}");
        assert!(
            second.compiled.get().is_none(),
            "a refusal for memory is not kept"
        );
        // Without patterns a schema takes no share.
        let plain =
            Parameters::new(json!({"type": "object"}), Limits::NONE).within(&memory, tenant);
        assert_eq!(plain.check("{}", 1_000).await, Ok(json!({})));
        drop(first);
        assert_eq!(
            memory.memory().available(),
            500 - 320,
            "still used by `same`"
        );
        drop(same);
        assert_eq!(memory.memory().available(), 500);
        // More than the whole share: refused for good (kept), not "try again later".
        let small = Arc::new(Schemas::new(SchemaMemory::new(100, 100)));
        let never = Parameters::new(two_patterns("3"), Limits::NONE).within(&small, tenant);
        let refused = never.check(r#"{"a": "a3"}"#, 1_000).await.unwrap_err();
        assert!(
            refused.contains("more memory compiled than this worker allows"),
            "{refused}"
        );
        assert!(matches!(never.compiled.get(), Some(Err(_))), "kept");
        assert_eq!(
            second.check(r#"{"a": "a2"}"#, 1_000).await,
            Ok(json!({"a": "a2"}))
        );
    }

    /// A tool's parameters check as a one-off check would, with the validator compiled at
    /// the first check and kept; a bad schema is named, after bad JSON.
    #[tokio::test]
    async fn a_tools_parameters_are_compiled_at_the_first_check_and_kept() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]});
        let parameters = Parameters::new(schema.clone(), most(1));
        assert!(parameters.compiled.get().is_none(), "nothing compiled yet");
        for raw in [
            r#"{"a": 1}"#,
            "{not json",
            r#"{"a": "x"}"#,
            "",
            r#"{"a": "\u0000"}"#,
        ] {
            assert_eq!(
                parameters.check(raw, 1_000).await,
                check_arguments(raw, &schema),
                "{raw}"
            );
        }
        assert!(matches!(parameters.compiled.get(), Some(Ok(_))));
        let bad = Parameters::new(json!({"type": 12}), most(1));
        assert!(
            bad.check("{}", 1_000)
                .await
                .unwrap_err()
                .contains("invalid JSON Schema")
        );
        assert!(
            bad.check("{not", 1_000)
                .await
                .unwrap_err()
                .contains("not valid JSON")
        );
    }

    /// Parameters whose `q` is a chain of `levels` `anyOf`s of two references each, ending in
    /// `leaf`: 2^levels applications of `leaf` to `q`.
    fn doubling(levels: usize, leaf: Value) -> Parameters {
        let mut defs = serde_json::Map::new();
        for i in 0..levels {
            let next = format!("#/$defs/a{}", i + 1);
            defs.insert(
                format!("a{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert(format!("a{levels}"), leaf);
        Parameters::new(
            json!({"type": "object", "$defs": defs,
                "properties": {"q": {"$ref": "#/$defs/a0"}}}),
            most(0),
        )
    }

    /// Arguments whose check would pass the budget are refused before the validator runs:
    /// with this schema the validator would take hours on a one-word argument.
    #[tokio::test]
    async fn arguments_too_dear_to_check_are_refused_unchecked() {
        let parameters = doubling(40, json!({"type": "null"}));
        let started = std::time::Instant::now();
        let err = parameters.check(r#"{"q": "x"}"#, 10_000).await.unwrap_err();
        assert!(err.contains("more than 10000 checks"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // Arguments that never reach the branches cost a few checks and are validated.
        assert_eq!(parameters.check("{}", 10_000).await, Ok(json!({})));
        // Dearer than the inline share but within the budget: validated on a blocking thread,
        // with the same answer (ten levels are ~2^12 checks of one value, over the share).
        let parameters = doubling(10, json!({"type": "string"}));
        let dear = r#"{"q": [1]}"#;
        let checks = agentfleet_shared::tool_schema::cost(
            parameters.schema(),
            &serde_json::from_str(dear).unwrap(),
            u64::MAX,
        )
        .unwrap();
        assert!(checks > CHECKS_INLINE, "{checks}");
        // Only decided, not explained: error reports cost more than the price says.
        let err = parameters.check(dear, 10_000).await.unwrap_err();
        assert_eq!(err, "arguments do not match the tool's schema");
        assert_eq!(
            parameters.check(r#"{"q": "a"}"#, 10_000).await,
            Ok(json!({"q": "a"}))
        );
    }
}
