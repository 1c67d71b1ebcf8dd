//! Tools: what the model is offered, how arguments are checked, and how the calls of one
//! iteration are settled (executed, paused for a decision or an answer, or skipped).

pub mod builtin;
pub mod catalog;
pub mod egress;
pub mod http;
pub mod mcp;
pub mod settle;

use std::sync::OnceLock;

use serde_json::Value;

/// A tool's parameter schema with its validator, compiled at the first call that needs it and
/// then kept with the catalog (once per holding, not once per call).
pub struct Parameters {
    schema: Value,
    compiled: OnceLock<Result<jsonschema::Validator, String>>,
}

impl Parameters {
    pub fn new(schema: Value) -> Parameters {
        Parameters {
            schema,
            compiled: OnceLock::new(),
        }
    }

    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Parses and validates a call's arguments. The error text is what the model will see.
    pub fn check(&self, raw: &str) -> Result<Value, String> {
        let args = parse(raw)?;
        let validator = self.compiled.get_or_init(|| compile(&self.schema));
        validate(args, validator.as_ref()?)
    }
}

/// Parses and validates a call's arguments against `schema`, compiled for this call only.
pub fn check_arguments(raw: &str, schema: &Value) -> Result<Value, String> {
    let args = parse(raw)?;
    validate(args, &compile(schema)?)
}

fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(schema)
        .map_err(|e| format!("the tool's parameter schema is invalid: {e}"))
}

fn parse(raw: &str) -> Result<Value, String> {
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let mut args: Value =
        serde_json::from_str(raw).map_err(|e| format!("arguments are not valid JSON: {e}"))?;
    // An escaped NUL (`\u0000`) decodes to a character Postgres cannot store.
    agentfleet_shared::sanitize::strip_nul_value(&mut args);
    Ok(args)
}

fn validate(args: Value, validator: &jsonschema::Validator) -> Result<Value, String> {
    let errors: Vec<String> = validator
        .iter_errors(&args)
        .take(5)
        .map(|e| {
            let path = e.instance_path.to_string();
            if path.is_empty() {
                e.to_string()
            } else {
                format!("{path}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(args)
    } else {
        Err(format!(
            "arguments do not match the tool's schema: {}",
            errors.join("; ")
        ))
    }
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

    /// A tool's parameters check as a one-off check would, with the validator compiled at
    /// the first check and kept; a bad schema is named, after bad JSON.
    #[test]
    fn a_tools_parameters_are_compiled_at_the_first_check_and_kept() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]});
        let parameters = Parameters::new(schema.clone());
        assert!(parameters.compiled.get().is_none(), "nothing compiled yet");
        for raw in [
            r#"{"a": 1}"#,
            "{not json",
            r#"{"a": "x"}"#,
            "",
            r#"{"a": "\u0000"}"#,
        ] {
            assert_eq!(
                parameters.check(raw),
                check_arguments(raw, &schema),
                "{raw}"
            );
        }
        assert!(matches!(parameters.compiled.get(), Some(Ok(_))));
        let bad = Parameters::new(json!({"type": 12}));
        assert!(bad.check("{}").unwrap_err().contains("schema is invalid"));
        assert!(bad.check("{not").unwrap_err().contains("not valid JSON"));
    }
}
