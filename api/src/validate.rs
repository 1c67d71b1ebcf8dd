//! Checks shared by every endpoint, so a rule is written once: JSON that cannot be stored and
//! read back, the limits of a user message, and query parameters. Every error names the field.

use serde_json::Value;

use crate::error::ApiError;

const NUL_MESSAGE: &str = "must not contain NUL characters";

/// The largest magnitude of a JSON number in a request. Postgres keeps a `jsonb` number as a
/// decimal and prints it in full, and a number within a few units in the last place of the
/// largest double prints as more digits than serde_json reads back ("number out of range"): a
/// run holding one could be stored but never read. Far below that edge, with room to spare.
pub const MAX_NUMBER: f64 = 1e300;

/// Refuses a JSON document that could be stored but not read back, naming the first offending
/// field as `a.b[2].c`: a NUL character (`\u0000`) in any string or object key (Postgres
/// stores neither `text` nor `jsonb` with NUL: "unsupported Unicode escape sequence"), or a
/// number beyond [`MAX_NUMBER`].
pub fn storable(value: &Value, path: &mut String) -> Result<(), ApiError> {
    match value {
        Value::String(s) if s.contains('\0') => Err(ApiError::invalid(at(path), NUL_MESSAGE)),
        Value::Number(n) if n.as_f64().is_some_and(|f| f.abs() > MAX_NUMBER) => Err(
            ApiError::invalid(at(path), "must be a number within -1e300..=1e300"),
        ),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                storable(item, path)?;
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
                storable(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Whether `body` may hold more than `limit` JSON values (object keys counted as values),
/// counted without parsing: every value but the first follows a `[`, `{`, `,` or `:` outside
/// a string, so this over-counts (an empty `[]` counts one) and never under-counts. A parse
/// builds each value as a `serde_json::Value` of 32 bytes and more: `[0,0,…]` is ~16 times its
/// size in memory, and a body may be read untyped besides its typed read (the storable check,
/// the whole-floats retry of `JsonBody`).
pub fn more_json_values_than(body: &[u8], limit: usize) -> bool {
    // Each value counted past the first takes a byte: a body this short needs no scan (with
    // the defaults, none but a batch's).
    if body.len() < limit {
        return false;
    }
    let mut values = 1usize;
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' | b',' | b':' => {
                values += 1;
                if values > limit {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// Whether a JSON text may hold what [`storable`] refuses, so that most bodies need no walk:
/// JSON can only spell a NUL as the escape `\u0000` (a raw control character is a syntax
/// error), and a number beyond 1e300 needs an exponent (a digit then `e`) or 300 digits.
pub fn may_be_unstorable(body: &[u8]) -> bool {
    let mut run = 0;
    for (i, &b) in body.iter().enumerate() {
        if b.is_ascii_digit() {
            run += 1;
            if run >= 300 {
                return true;
            }
            continue;
        }
        if run > 0 && (b == b'e' || b == b'E') {
            return true;
        }
        run = 0;
        if b == b'\\' && body[i..].starts_with(b"\\u0000") {
            return true;
        }
    }
    false
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

/// The largest event or message id a parameter may name: 18 decimal digits (ids are counts,
/// far below it), so that the rule is a plain pattern in the OpenAPI document.
pub const MAX_ID: u64 = 999_999_999_999_999_999;

/// Plain decimal digits, nothing else (no sign, no spaces): `^[0-9]{1,max_digits}$`.
fn digits(raw: &str, max_digits: usize) -> Option<u64> {
    let ok = !raw.is_empty() && raw.len() <= max_digits && raw.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| raw.parse().ok()).flatten()
}

/// A page size: absent means `default`, otherwise an integer within `1..=max`.
pub fn page_limit(raw: Option<&str>, default: u32, max: u32) -> Result<u32, ApiError> {
    let Some(raw) = raw else { return Ok(default) };
    digits(raw, 10)
        .filter(|n| (1..=u64::from(max)).contains(n))
        .map(|n| n as u32)
        .ok_or_else(|| ApiError::invalid("limit", format!("must be an integer within 1..={max}")))
}

/// An event or message id parameter: an integer within `0..=MAX_ID`.
pub fn non_negative(field: &str, raw: Option<&str>) -> Result<Option<u64>, ApiError> {
    raw.map(|r| {
        digits(r, 18).ok_or_else(|| {
            ApiError::invalid(field, format!("must be an integer within 0..={MAX_ID}"))
        })
    })
    .transpose()
}

/// A UUID parameter, in its canonical hyphenated form (`format: uuid`), any case.
pub fn uuid(field: &str, raw: &str) -> Result<uuid::Uuid, ApiError> {
    parse_uuid(raw).ok_or_else(|| ApiError::invalid(field, "must be a UUID"))
}

/// Only the hyphenated form: the braced, URN and plain-hex forms the `uuid` crate also reads
/// are not `format: uuid`.
pub fn parse_uuid(raw: &str) -> Option<uuid::Uuid> {
    if raw.len() != 36 {
        return None;
    }
    uuid::Uuid::try_parse(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nul_at(v: Value) -> Option<String> {
        storable(&v, &mut String::new()).err().map(|e| e.message)
    }

    #[test]
    fn json_values_are_counted_outside_strings_and_never_under() {
        let body = br#"{"a": [1, 2, {"b": "x,y:[{\"z"}], "c": []}"#;
        // Values and keys: the object, a, the list, 1, 2, the inner object, b, its string,
        // c, the empty list (counted once more for its `[`): at most 11.
        assert!(!more_json_values_than(body, 11));
        assert!(more_json_values_than(body, 9));
        let zeros = format!("[{}0]", "0,".repeat(5000));
        assert!(more_json_values_than(zeros.as_bytes(), 5000));
        assert!(!more_json_values_than(zeros.as_bytes(), 5002));
        // Shorter than the limit: not scanned, and could not exceed it.
        assert!(!more_json_values_than(b"[0,0,0]", 8));
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
    fn numbers_that_could_not_be_read_back_are_refused() {
        assert_eq!(nul_at(json!({"a": [1e300, -1e300, 5, 1.5e-300]})), None);
        assert_eq!(
            nul_at(json!({"metadata": {"x": [0, -1.7976931348623157e308]}})).as_deref(),
            Some("metadata.x[1]: must be a number within -1e300..=1e300")
        );
        let big: Value = serde_json::from_str(&format!("{{\"n\": 1{}}}", "0".repeat(301))).unwrap();
        assert!(nul_at(big).is_some());
    }

    #[test]
    fn the_fast_path_only_skips_bodies_that_need_no_walk() {
        assert!(may_be_unstorable(br#"{"a": "\u0000"}"#));
        assert!(!may_be_unstorable(
            br#"{"a": "\u0001", "b": 12.5, "c": "e1"}"#
        ));
        assert!(may_be_unstorable(br#"{"a": 1e301}"#));
        assert!(may_be_unstorable(br#"{"a": 1.5E+7}"#));
        assert!(may_be_unstorable(
            format!("[{}]", "9".repeat(300)).as_bytes()
        ));
        assert!(!may_be_unstorable(
            format!("[{}]", "9".repeat(299)).as_bytes()
        ));
        // An escaped backslash before `u0000` is text, not NUL: the walk decides.
        assert!(may_be_unstorable(br#"{"a": "\\u0000"}"#));
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
        for bad in ["+5", " 5", "5 ", "0x5", "1e3"] {
            assert!(page_limit(Some(bad), 50, 500).is_err(), "{bad}");
        }
        assert_eq!(non_negative("after", Some("5")).unwrap(), Some(5));
        assert_eq!(
            non_negative("after", Some("999999999999999999")).unwrap(),
            Some(MAX_ID)
        );
        for bad in [
            "-5",
            "+5",
            "",
            "1.0",
            "1000000000000000000",
            "18446744073709551616",
        ] {
            let e = non_negative("after", Some(bad)).unwrap_err();
            assert_eq!(
                e.message,
                format!("after: must be an integer within 0..={MAX_ID}")
            );
        }
        let id = "67e55044-10b1-426f-9247-bb680e5fe0c8";
        assert!(uuid("id", id).is_ok());
        assert!(uuid("id", &id.to_uppercase()).is_ok());
        for bad in [
            "67e5504410b1426f9247bb680e5fe0c8",
            "{67e55044-10b1-426f-9247-bb680e5fe0c8}",
            "urn:uuid:67e55044-10b1-426f-9247-bb680e5fe0c8",
            "x",
        ] {
            assert!(uuid("id", bad).is_err(), "{bad}");
        }
    }
}
