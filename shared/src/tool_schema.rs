//! A tool's parameter schema, as strangers write it: compiled with bounded patterns, limited
//! to the references the argument check can follow, and priced before arguments are checked.
//!
//! Both sides of an argument check are hostile: the schema is a tenant's (an agent's
//! `parameters`) or a remote MCP server's, the arguments are the model's. `jsonschema`
//! validates without a budget, and in-place applicators (`anyOf`, `oneOf`, `allOf`, `not`,
//! `if`/`then`/`else`, `$ref`) that reach the same subschema more than once multiply at every
//! level of the instance: a 2 KB chain of `anyOf`s of two references each takes hours on a
//! one-word instance, on whatever thread checks it. So before validating, [`cost`] walks the
//! schema over the arguments as a validator would at worst (every branch taken, no
//! short-circuit) and counts the checks; arguments that would need more than the budget are
//! refused without being validated. The walk follows local JSON-pointer references only, so
//! [`check_supported`] refuses the constructs that would move them elsewhere (`$id` below the
//! root, anchors, dynamic and recursive references, other documents) — tool schemas of
//! OpenAI-compatible models use `#/$defs/...` and `#` references and nothing else.

use serde_json::{Map, Value};

/// Backtracking steps one `pattern` match may take (`fancy-regex`, used only for patterns
/// with look-around or back-references; others run on the linear-time `regex` engine). A
/// match that needs more fails the check.
pub const PATTERN_BACKTRACK_LIMIT: usize = 10_000;

/// What one match of a pattern with look-around or back-references counts for in [`cost`]:
/// up to [`PATTERN_BACKTRACK_LIMIT`] steps, where an ordinary check is a handful.
const BACKTRACKING_MATCH_COST: u64 = 100;

/// Compiles a tool's parameter schema as the worker checks arguments against it: no remote
/// references (none are resolved), patterns bounded, and only the constructs [`cost`] can
/// price. The error is a sentence naming what is wrong and where.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    check_supported(schema)?;
    jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::fancy_regex().backtrack_limit(PATTERN_BACKTRACK_LIMIT),
        )
        .build(schema)
        .map_err(|e| format!("invalid JSON Schema: {e}"))
}

/// Refuses what the argument check cannot follow: a `$ref` that is not a local JSON pointer
/// (`#` or `#/...`), `$dynamicRef`, `$recursiveRef`, anchors, and `$id` below the root (it
/// would move the base that `#/...` resolves against).
pub fn check_supported(schema: &Value) -> Result<(), String> {
    let mut stack: Vec<(&Value, String)> = vec![(schema, String::new())];
    while let Some((node, path)) = stack.pop() {
        let Value::Object(map) = node else { continue };
        for key in [
            "$dynamicRef",
            "$recursiveRef",
            "$anchor",
            "$dynamicAnchor",
            "$recursiveAnchor",
        ] {
            if map.contains_key(key) {
                return Err(format!("`{key}` at {} is not supported", at(&path)));
            }
        }
        if !path.is_empty() && map.contains_key("$id") {
            return Err(format!(
                "`$id` is supported at the root only, not at {}",
                at(&path)
            ));
        }
        if let Some(reference) = map.get("$ref") {
            let local = reference
                .as_str()
                .is_some_and(|r| r == "#" || r.starts_with("#/"));
            if !local {
                return Err(format!(
                    "`$ref` at {} must be a local JSON pointer (\"#\" or \"#/...\")",
                    at(&path)
                ));
            }
        }
        for (key, value) in map {
            let here = |rest: &str| format!("{path}/{}{rest}", escape(key));
            match key.as_str() {
                "additionalProperties"
                | "additionalItems"
                | "unevaluatedProperties"
                | "unevaluatedItems"
                | "contains"
                | "propertyNames"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contentSchema" => stack.push((value, here(""))),
                "items" if value.is_object() || value.is_boolean() => stack.push((value, here(""))),
                "allOf" | "anyOf" | "oneOf" | "prefixItems" | "items" => {
                    if let Value::Array(subs) = value {
                        for (i, sub) in subs.iter().enumerate() {
                            stack.push((sub, here(&format!("/{i}"))));
                        }
                    }
                }
                "properties" | "patternProperties" | "$defs" | "definitions"
                | "dependentSchemas" | "dependencies" => {
                    if let Value::Object(subs) = value {
                        for (name, sub) in subs {
                            stack.push((sub, here(&format!("/{}", escape(name)))));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// More checks than the budget allows (see [`cost`]).
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub budget: u64,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checking these arguments against the tool's schema would take more than {} checks",
            self.budget
        )
    }
}

/// The checks that validating `instance` against `schema` may take at worst, or
/// [`OverBudget`] as soon as they pass `budget`: one per subschema applied to one value, with
/// every in-place applicator taken (a validator stops an `anyOf` at its first match; a
/// failing instance, or an error report, takes them all), plus the keywords that cost by
/// size (`pattern`, `enum`, `uniqueItems`). Never recursive, so neither a reference cycle nor
/// a deep instance can exhaust the stack: each step costs at least one check, so the walk
/// ends within `budget` steps. A `$ref` that does not resolve costs its check and goes no
/// further (the compiled validator has refused it already).
///
/// Calibrated against jsonschema 0.61 on adversarial schemas (chains of `anyOf`, `oneOf`,
/// `allOf`, `if`/`then`/`else`, `dependentSchemas`, nested `unevaluated…`, many patterns,
/// long strings, large `enum`s): validating took at most ~1.3 µs per check counted, so a budget
/// of 50,000 bounds a check to ~65 ms.
pub fn cost(schema: &Value, instance: &Value, budget: u64) -> Result<u64, OverBudget> {
    let mut spent: u64 = 0;
    let mut stack: Vec<(&Value, Instance<'_>)> = vec![(schema, Instance::Value(instance))];
    let mut charge = |n: u64| {
        spent = spent.saturating_add(n);
        if spent > budget {
            Err(OverBudget { budget })
        } else {
            Ok(spent)
        }
    };
    while let Some((node, value)) = stack.pop() {
        charge(1)?;
        let Value::Object(s) = node else { continue };
        // `unevaluatedProperties` and `unevaluatedItems` evaluate the schema's other
        // subschemas once more to learn what they evaluated: nested, that doubles per level
        // (measured with jsonschema 0.61), so they are counted twice.
        let passes =
            if s.contains_key("unevaluatedProperties") || s.contains_key("unevaluatedItems") {
                2
            } else {
                1
            };
        for _ in 0..passes {
            in_place(schema, s, value, &mut stack);
            let own = match value {
                Instance::Value(Value::Object(object)) => object_keywords(s, object, &mut stack),
                Instance::Value(Value::Array(items)) => array_keywords(s, items, &mut stack),
                Instance::Value(Value::String(text)) => string_keywords(s, text),
                Instance::Key(text) => string_keywords(s, text),
                Instance::Value(_) => 0,
            };
            let options = match s.get("enum") {
                Some(Value::Array(options)) => options.len() as u64,
                _ => 0,
            };
            charge(own + options)?;
        }
    }
    Ok(spent)
}

/// A value the walk applies a subschema to: part of the instance, or one of its objects'
/// keys (`propertyNames`).
#[derive(Clone, Copy)]
enum Instance<'a> {
    Value(&'a Value),
    Key(&'a str),
}

/// Subschemas applied to the same value.
fn in_place<'a>(
    root: &'a Value,
    s: &'a Map<String, Value>,
    value: Instance<'a>,
    stack: &mut Vec<(&'a Value, Instance<'a>)>,
) {
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(subs)) = s.get(key) {
            stack.extend(subs.iter().map(|sub| (sub, value)));
        }
    }
    for key in ["not", "if", "then", "else"] {
        if let Some(sub) = s.get(key) {
            stack.push((sub, value));
        }
    }
    if let Some(target) = s
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| resolve(root, r))
    {
        stack.push((target, value));
    }
    if let Instance::Value(Value::Object(_)) = value {
        for key in ["dependentSchemas", "dependencies"] {
            if let Some(Value::Object(subs)) = s.get(key) {
                stack.extend(
                    subs.values()
                        .filter(|sub| !sub.is_array())
                        .map(|sub| (sub, value)),
                );
            }
        }
    }
}

/// Subschemas applied to an object's members and keys; returns the checks of its own
/// (pattern matches of `patternProperties`).
fn object_keywords<'a>(
    s: &'a Map<String, Value>,
    object: &'a Map<String, Value>,
    stack: &mut Vec<(&'a Value, Instance<'a>)>,
) -> u64 {
    let mut own = 0;
    if let Some(Value::Object(properties)) = s.get("properties") {
        for (name, member) in object {
            if let Some(sub) = properties.get(name) {
                stack.push((sub, Instance::Value(member)));
            }
        }
    }
    if let Some(Value::Object(patterns)) = s.get("patternProperties") {
        for (pattern, sub) in patterns {
            for (name, member) in object {
                own += pattern_cost(pattern, name);
                stack.push((sub, Instance::Value(member)));
            }
        }
    }
    for key in ["additionalProperties", "unevaluatedProperties"] {
        if let Some(sub) = s.get(key) {
            stack.extend(object.values().map(|member| (sub, Instance::Value(member))));
        }
    }
    if let Some(sub) = s.get("propertyNames") {
        stack.extend(object.keys().map(|name| (sub, Instance::Key(name))));
    }
    own
}

/// Subschemas applied to an array's items; returns the checks of its own (`uniqueItems`).
fn array_keywords<'a>(
    s: &'a Map<String, Value>,
    items: &'a [Value],
    stack: &mut Vec<(&'a Value, Instance<'a>)>,
) -> u64 {
    for key in ["prefixItems", "items"] {
        if let Some(Value::Array(subs)) = s.get(key) {
            stack.extend(
                subs.iter()
                    .zip(items)
                    .map(|(sub, item)| (sub, Instance::Value(item))),
            );
        }
    }
    for key in ["items", "additionalItems", "unevaluatedItems", "contains"] {
        if let Some(sub @ (Value::Object(_) | Value::Bool(_))) = s.get(key) {
            stack.extend(items.iter().map(|item| (sub, Instance::Value(item))));
        }
    }
    if s.get("uniqueItems") == Some(&Value::Bool(true)) {
        items.len() as u64
    } else {
        0
    }
}

fn string_keywords(s: &Map<String, Value>, text: &str) -> u64 {
    match s.get("pattern").and_then(Value::as_str) {
        Some(pattern) => pattern_cost(pattern, text),
        None => 0,
    }
}

/// One match of `pattern` against `text`: linear in the text on the `regex` engine; a
/// pattern only `fancy-regex` can run (look-around, back-references) may backtrack up to
/// its limit.
fn pattern_cost(pattern: &str, text: &str) -> u64 {
    let backtracking = ["(?=", "(?!", "(?<=", "(?<!", "\\k<"]
        .iter()
        .any(|construct| pattern.contains(construct))
        || pattern
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'\\' && w[1].is_ascii_digit() && w[1] != b'0');
    if backtracking {
        BACKTRACKING_MATCH_COST
    } else {
        1 + text.len() as u64 / 64
    }
}

/// A local reference (`#` or a JSON pointer after `#`) in `root`.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    let decoded = percent_decode(pointer)?;
    root.pointer(&decoded)
}

fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn at(path: &str) -> &str {
    if path.is_empty() { "the root" } else { path }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A chain of `anyOf`s of two references each: 2^depth checks of one value.
    fn doubling(depth: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..depth {
            let next = format!("#/$defs/a{}", i + 1);
            defs.insert(
                format!("a{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert(format!("a{depth}"), json!({"type": "null"}));
        json!({"$defs": defs, "$ref": "#/$defs/a0"})
    }

    #[test]
    fn a_schema_whose_branches_multiply_is_priced_before_it_is_run() {
        // 40 levels would take a validator days; the walk stops at the budget.
        let started = std::time::Instant::now();
        assert_eq!(
            cost(&doubling(40), &json!("x"), 100_000),
            Err(OverBudget { budget: 100_000 })
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // A few levels cost what they cost: 2^(d+1) - 1 subschemas, each a $ref away.
        let small = cost(&doubling(4), &json!("x"), 100_000).unwrap();
        assert!((31..=70).contains(&small), "{small}");
        // And the same schema compiles: refusing it is the budget's job, not the compiler's.
        assert!(compile(&doubling(40)).is_ok());
    }

    #[test]
    fn a_reference_cycle_in_place_ends_at_the_budget() {
        let schema =
            json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"});
        assert_eq!(
            cost(&schema, &json!(1), 10_000),
            Err(OverBudget { budget: 10_000 })
        );
    }

    #[test]
    fn ordinary_arguments_cost_about_their_size() {
        let schema = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "pattern": "^[a-z ]+$"},
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
                "filter": {"$ref": "#/$defs/filter"}
            },
            "$defs": {"filter": {"type": "object", "additionalProperties": {"type": "number"}}},
            "required": ["query"]
        });
        let args = json!({"query": "rust", "tags": ["a", "b", "c"], "filter": {"x": 1, "y": 2}});
        let spent = cost(&schema, &args, 1_000).unwrap();
        assert!((10..=30).contains(&spent), "{spent}");
        // A recursive schema costs one walk per level (a tree of 200 nodes).
        let tree = json!({"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#"}}}});
        let mut node = json!({"children": []});
        for _ in 0..199 {
            node = json!({"children": [node]});
        }
        let spent = cost(&tree, &node, 100_000).unwrap();
        assert!((500..=1_000).contains(&spent), "{spent}");
    }

    #[test]
    fn many_values_under_a_backtracking_pattern_cost_their_matches() {
        let schema = json!({"type": "array", "items": {"type": "string", "pattern": "^(a+)+\\1$"}});
        let args = Value::Array(vec![json!("aaaaaaaaaaaaaaaaaaaaaaaaa!"); 2_000]);
        assert_eq!(
            cost(&schema, &args, 100_000),
            Err(OverBudget { budget: 100_000 })
        );
        let plain = json!({"type": "array", "items": {"type": "string", "pattern": "^a+$"}});
        assert!(cost(&plain, &args, 100_000).is_ok());
    }

    #[test]
    fn a_backtracking_pattern_is_cut_off_at_its_limit() {
        let validator = compile(&json!({"type": "string", "pattern": "^(a+)+\\1$"})).unwrap();
        let started = std::time::Instant::now();
        for _ in 0..100 {
            assert!(!validator.is_valid(&json!("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!")));
        }
        // 100 matches of a pattern that would take ~2^30 steps each without a limit.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn only_local_references_are_supported() {
        for (schema, named) in [
            (
                json!({"$ref": "https://example.com/s.json"}),
                "`$ref` at the root",
            ),
            (
                json!({"properties": {"a": {"$ref": "#foo"}}}),
                "`$ref` at /properties/a",
            ),
            (
                json!({"$defs": {"a": {"$id": "x.json"}}}),
                "`$id` is supported at the root only, not at /$defs/a",
            ),
            (
                json!({"anyOf": [{"$anchor": "x"}]}),
                "`$anchor` at /anyOf/0",
            ),
            (
                json!({"items": {"$dynamicRef": "#meta"}}),
                "`$dynamicRef` at /items",
            ),
        ] {
            let err = compile(&schema).unwrap_err();
            assert!(err.contains(named), "{err} should name {named}");
        }
        for schema in [
            json!({"$id": "https://example.com/tool.json", "$ref": "#/$defs/a", "$defs": {"a": {}}}),
            json!({"properties": {"$id": {"type": "string"}, "a": {"$ref": "#"}}}),
            json!({"properties": {"a/b": {"$ref": "#/properties/a~1b"}}}),
        ] {
            compile(&schema).unwrap_or_else(|e| panic!("{schema}: {e}"));
        }
    }

    #[test]
    fn percent_encoded_pointers_resolve() {
        let root = json!({"$defs": {"a b": {"type": "string"}}});
        assert_eq!(
            resolve(&root, "#/$defs/a%20b"),
            Some(&json!({"type": "string"}))
        );
        assert_eq!(resolve(&root, "#/$defs/a%2"), None);
        assert_eq!(resolve(&root, "#"), Some(&root));
    }
}
