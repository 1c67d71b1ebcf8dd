//! Tools: what the model is offered, how arguments are checked, and how the calls of one
//! iteration are settled (executed, paused for a decision or an answer, or skipped).

pub mod builtin;
pub mod catalog;
pub mod egress;
pub mod http;
pub mod mcp;
pub mod settle;

use serde_json::Value;

/// Parses and validates a call's arguments. The error text is what the model will see.
pub fn check_arguments(raw: &str, schema: &Value) -> Result<Value, String> {
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let mut args: Value =
        serde_json::from_str(raw).map_err(|e| format!("arguments are not valid JSON: {e}"))?;
    // An escaped NUL (`\u0000`) decodes to a character Postgres cannot store.
    agentfleet_shared::sanitize::strip_nul_value(&mut args);
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the tool's parameter schema is invalid: {e}"))?;
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
}
