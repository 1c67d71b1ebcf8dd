//! Checks shared by every endpoint, so a rule is written once: text that Postgres cannot store,
//! the limits of a user message, and query parameters. Every error names the field.

use serde_json::Value;

use crate::error::ApiError;

const NUL_MESSAGE: &str = "must not contain NUL characters";

/// Refuses a JSON document with a NUL character (`\u0000`) in any string or object key,
/// naming the first offending field as `a.b[2].c`. Postgres stores neither `text` nor `jsonb`
/// with NUL ("unsupported Unicode escape sequence"), so such a request could only fail late.
pub fn no_nul(value: &Value, path: &mut String) -> Result<(), ApiError> {
    match value {
        Value::String(s) if s.contains('\0') => Err(ApiError::invalid(at(path), NUL_MESSAGE)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                no_nul(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(map) => {
            for (key, item) in map {
                if key.contains('\0') {
                    return Err(ApiError::invalid(
                        at(path),
                        "keys must not contain NUL characters",
                    ));
                }
                let len = path.len();
                push_key(path, key);
                no_nul(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Whether a JSON text may hold a NUL: JSON can only spell one as the escape `\u0000` (a raw
/// control character is a syntax error), so a body without those six bytes needs no walk.
pub fn may_hold_nul(body: &[u8]) -> bool {
    body.windows(6).any(|w| w == b"\\u0000")
}

fn at(path: &str) -> &str {
    if path.is_empty() { "body" } else { path }
}

/// `a.key`, or `a["odd key"]` for a key that is not a plain name.
fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&serde_json::to_string(key).unwrap_or_default());
        path.push(']');
    }
}

/// A user message (`input` of a run or of a resume): not blank, within `max_bytes`.
pub fn user_text(field: &str, text: &str, max_bytes: usize) -> Result<(), ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::invalid(field, "must not be empty"));
    }
    if text.len() > max_bytes {
        return Err(ApiError::invalid(
            field,
            format!("longer than {max_bytes} bytes"),
        ));
    }
    Ok(())
}

/// A page size: absent means `default`, otherwise an integer within `1..=max`.
pub fn page_limit(raw: Option<&str>, default: u32, max: u32) -> Result<u32, ApiError> {
    let Some(raw) = raw else { return Ok(default) };
    raw.parse::<u32>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| ApiError::invalid("limit", format!("must be an integer within 1..={max}")))
}

/// A non-negative integer parameter.
pub fn non_negative(field: &str, raw: Option<&str>) -> Result<Option<u64>, ApiError> {
    raw.map(|r| {
        r.parse::<u64>()
            .ok()
            .filter(|n| i64::try_from(*n).is_ok())
            .ok_or_else(|| ApiError::invalid(field, "must be a non-negative integer"))
    })
    .transpose()
}

/// A UUID parameter.
pub fn uuid(field: &str, raw: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(raw).map_err(|_| ApiError::invalid(field, "must be a UUID"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nul_at(v: Value) -> Option<String> {
        no_nul(&v, &mut String::new()).err().map(|e| e.message)
    }

    #[test]
    fn nul_is_found_anywhere_and_named() {
        assert_eq!(
            nul_at(json!({"input": "ok", "metadata": {"a": [1, "x"]}})),
            None
        );
        assert_eq!(
            nul_at(json!({"input": "a\u{0}b"})).as_deref(),
            Some("input: must not contain NUL characters")
        );
        assert_eq!(
            nul_at(json!({"metadata": {"deep": {"list": ["ok", "\u{0}"]}}})).as_deref(),
            Some("metadata.deep.list[1]: must not contain NUL characters")
        );
        assert_eq!(
            nul_at(json!({"metadata": {"k\u{0}": 1}})).as_deref(),
            Some("metadata: keys must not contain NUL characters")
        );
        assert_eq!(
            nul_at(json!({"metadata": {"odd key": "\u{0}"}})).as_deref(),
            Some("metadata[\"odd key\"]: must not contain NUL characters")
        );
        assert_eq!(
            nul_at(json!({"runs": [{}, {"agent": {"tools": [{"description": "\u{0}"}]}}]}))
                .as_deref(),
            Some("runs[1].agent.tools[0].description: must not contain NUL characters")
        );
        assert_eq!(
            nul_at(json!("\u{0}")).as_deref(),
            Some("body: must not contain NUL characters")
        );
    }

    #[test]
    fn the_fast_path_only_skips_bodies_without_the_escape() {
        assert!(may_hold_nul(br#"{"a": "\u0000"}"#));
        assert!(!may_hold_nul(br#"{"a": "\u0001"}"#));
        // An escaped backslash before `u0000` is text, not NUL: the walk decides.
        assert!(may_hold_nul(br#"{"a": "\\u0000"}"#));
        assert_eq!(
            nul_at(serde_json::from_slice(br#"{"a": "\\u0000"}"#).unwrap()),
            None
        );
    }

    #[test]
    fn query_values_name_the_parameter() {
        assert_eq!(page_limit(None, 50, 500).unwrap(), 50);
        assert_eq!(page_limit(Some("7"), 50, 500).unwrap(), 7);
        for bad in ["abc", "0", "501", "-1", ""] {
            let e = page_limit(Some(bad), 50, 500).unwrap_err();
            assert_eq!(
                e.message, "limit: must be an integer within 1..=500",
                "{bad}"
            );
        }
        assert_eq!(non_negative("after", Some("5")).unwrap(), Some(5));
        assert!(
            non_negative("after", Some("-5"))
                .unwrap_err()
                .message
                .starts_with("after:")
        );
        assert!(non_negative("after", Some("18446744073709551615")).is_err());
    }
}
