//! Making what strangers send storable. Postgres refuses the NUL character in `text` and in
//! `jsonb` strings; a model or a tool that sends one would make every attempt to record the
//! turn fail the same way. NUL carries no meaning in a chat, so it is removed on the way in.

use std::borrow::Cow;

use serde_json::Value;

/// `s` without NUL characters (borrowed when there are none, the usual case).
pub fn strip_nul(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', ""))
    } else {
        Cow::Borrowed(s)
    }
}

/// Removes NUL characters from `s` in place.
pub fn strip_nul_in(s: &mut String) {
    if s.contains('\0') {
        s.retain(|c| c != '\0');
    }
}

/// Removes NUL characters from every string and key of `v`.
pub fn strip_nul_value(v: &mut Value) {
    match v {
        Value::String(s) => strip_nul_in(s),
        Value::Array(items) => items.iter_mut().for_each(strip_nul_value),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    strip_nul_value(&mut v);
                    map.insert(k.replace('\0', ""), v);
                }
            } else {
                map.values_mut().for_each(strip_nul_value);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_is_removed_everywhere_and_nothing_else_changes() {
        assert!(matches!(strip_nul("plain"), Cow::Borrowed("plain")));
        assert_eq!(strip_nul("a\0b"), "ab");
        let mut v: Value =
            serde_json::from_str(r#"{"k\u0000": ["x\u0000y", 1, {"z": "\u0000"}]}"#).unwrap();
        strip_nul_value(&mut v);
        assert_eq!(v, json!({"k": ["xy", 1, {"z": ""}]}));
    }
}
