use super::*;
use serde_json::json;

/// At most `n` patterns, of any size.
fn most(n: usize) -> Limits {
    Limits {
        max_patterns: n,
        max_states: u64::MAX,
    }
}

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
        Err(OverBudget::Checks { budget: 100_000 })
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    // A few levels cost what they cost: 2^(d+1) - 1 subschemas, each a $ref away.
    let small = cost(&doubling(4), &json!("x"), 100_000).unwrap();
    assert!((31..=150).contains(&small), "{small}");
    // And the same schema compiles: refusing it is the budget's job, not the compiler's.
    assert!(compile(&doubling(40), &most(0)).is_ok());
}

#[test]
fn a_reference_cycle_in_place_ends_at_the_budget() {
    let schema = json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"});
    // By depth or by checks, whichever comes first: never forever.
    assert!(cost(&schema, &json!(1), 10_000).is_err());
    assert!(cost(&schema, &json!(1), 100).is_err());
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
    // A recursive schema costs a few checks per level (a tree 100 deep; arguments are
    // parsed with serde_json's limit of 128 levels).
    let tree = json!({"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#"}}}});
    let mut node = json!({"children": []});
    for _ in 0..99 {
        node = json!({"children": [node]});
    }
    let spent = cost(&tree, &node, 100_000).unwrap();
    assert!((300..=800).contains(&spent), "{spent}");
}

#[test]
fn patterns_cost_by_length_and_backtracking_ones_are_refused() {
    let long = "a".repeat(64 * 1024);
    let schema = json!({"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,100}$"}});
    let args = Value::Array(vec![json!(long); 100]);
    assert_eq!(
        cost(&schema, &args, 50_000),
        Err(OverBudget::Checks { budget: 50_000 })
    );
    let short = Value::Array(vec![json!("aaaa"); 100]);
    assert!(cost(&schema, &short, 50_000).unwrap() < 3_000);
    // A Unicode class weighs what its ranges take in UTF-8 (`\p{L}`: thousands).
    let err = compile(&json!({"pattern": "(\\p{L}){1000}"}), &most(1)).unwrap_err();
    assert!(err.contains("states; at most 100000"), "{err}");
    assert!(compile(&json!({"pattern": "(\\w){1000}"}), &most(1)).is_ok());
    // A pattern whose states times text could be vast is refused outright.
    let err = compile(&json!({"pattern": "[ab]*a[ab]{200000}"}), &most(1)).unwrap_err();
    assert!(err.contains("states; at most 100000"), "{err}");
    // Look-around and back-references need a backtracking engine: refused.
    let long = format!("(?=a){}", "[ab]".repeat(10_000));
    let err = compile(&json!({"pattern": long}), &most(1)).unwrap_err();
    assert!(
        err.len() < 400,
        "the message quotes at most a part: {}",
        err.len()
    );
    for pattern in ["^(a+)+\\1$", "^(?=a)a+$"] {
        let err = compile(&json!({"type": "string", "pattern": pattern}), &most(1)).unwrap_err();
        assert!(
            err.contains("look-around and back-references"),
            "{pattern}: {err}"
        );
    }
}

/// The validator recurses per level: a long chain of references is refused by depth
/// (30,000 of them overflowed a 2 MiB stack while collecting errors), before its checks
/// could reach the budget.
#[test]
fn a_chain_deeper_than_the_limit_is_refused() {
    let mut defs = Map::new();
    for i in 0..1_000 {
        defs.insert(
            format!("a{i}"),
            json!({"$ref": format!("#/$defs/a{}", i + 1)}),
        );
    }
    defs.insert("a1000".into(), json!({"type": "string"}));
    let schema = json!({"$defs": defs, "$ref": "#/$defs/a0"});
    assert_eq!(cost(&schema, &json!(1), 1_000_000), Err(OverBudget::Depth));
    // Each level charges its entry when scheduled: a wide `anyOf` over a self-reference
    // stops at the budget, not after scheduling a million entries.
    let empties = vec![json!({}); 10_000];
    let wide = json!({"anyOf": empties, "$ref": "#"});
    assert_eq!(
        cost(&wide, &json!(1), 50_000),
        Err(OverBudget::Checks { budget: 50_000 })
    );
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
        (
            json!({"allOf": [{"unevaluatedProperties": false}]}),
            "`unevaluatedProperties` at /allOf/0",
        ),
        (
            json!({"$id": "urn:m", "$schema": "urn:m", "$vocabulary": {}}),
            "`$vocabulary` at the root",
        ),
        // Readings of a pointer that jsonschema's resolver and ours could differ on.
        (
            json!({"allOf": [{}, {}], "$ref": "#/allOf/01"}),
            "`$ref` at the root",
        ),
        (
            json!({"$defs": {"a/b": {}}, "$ref": "#/$defs/a%2Fb"}),
            "`$ref` at the root",
        ),
        (
            json!({"properties": {"q": {"$ref": "#/$defs/none"}}}),
            "`$ref` at /properties/q",
        ),
        (
            json!({"$defs": {"~/": {}, "~~1": {}}, "$ref": "#/$defs/~~1"}),
            "`$ref` at the root",
        ),
        (
            json!({"properties": {"q": {"$schema": "http://json-schema.org/draft-04/schema#",
                                            "id": "urn:x"}}}),
            "`$schema` is supported at the root only, not at /properties/q",
        ),
        // A reference's target is checked wherever it sits, under an unknown keyword too.
        (
            json!({"$ref": "#/x", "x": {"unevaluatedProperties": false}}),
            "`unevaluatedProperties` at /x",
        ),
        (
            json!({"properties": {"q": {"$ref": "#/x/0"}}, "x": [{"$ref": "#/x/01"}]}),
            "`$ref` at /x/0",
        ),
    ] {
        let err = compile(&schema, &most(8)).unwrap_err();
        assert!(err.contains(named), "{err} should name {named}");
    }
    for schema in [
        json!({"$id": "https://example.com/tool.json", "$ref": "#/$defs/a", "$defs": {"a": {}}}),
        json!({"properties": {"$id": {"type": "string"}, "a": {"$ref": "#"}}}),
        json!({"properties": {"a/b": {"$ref": "#/properties/a~1b"}}}),
    ] {
        compile(&schema, &most(8)).unwrap_or_else(|e| panic!("{schema}: {e}"));
    }
}

#[test]
fn patterns_are_counted_and_bounded() {
    let schema = json!({"properties": {
            "a": {"type": "string", "pattern": "^a$"},
            "b": {"patternProperties": {"^x": {"pattern": "y"}, "^z": true}}}});
    assert_eq!(check_supported(&schema).map(|p| p.count), Ok(4));
    // Patterns behind a reference count once, wherever they sit.
    let hidden = json!({"properties": {"a": {"$ref": "#/x"}, "b": {"$ref": "#/x"}},
                            "x": {"pattern": "^a$"}});
    assert_eq!(check_supported(&hidden).map(|p| p.count), Ok(1));
    assert!(compile(&schema, &most(4)).is_ok());
    let err = compile(&schema, &most(3)).unwrap_err();
    assert!(err.contains("more than 3 patterns"), "{err}");
    // A pattern whose compiled form passes the size limit is refused quickly (Unicode
    // `\w` ×300 ×300 would compile to tens of MiB).
    let started = std::time::Instant::now();
    assert!(compile(&json!({"pattern": "(\\w{300}){300}"}), &most(1)).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

/// Sequential repetitions add up, nested ones multiply: a UUID's pattern (five counted
/// repetitions in a row) was refused while every counted repetition multiplied.
#[test]
fn a_patterns_states_follow_its_structure() {
    let uuid = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
    let states = pattern_states(uuid).unwrap();
    assert!((40..=200).contains(&states), "{states}");
    let date = pattern_states("^\\d{4}-\\d{2}-\\d{2}$").unwrap();
    assert!(date < 50, "{date}");
    // Nested repetitions multiply; `{n,}` is n copies and a loop.
    let nested = pattern_states("(a{10}){10}").unwrap();
    assert!((100..=150).contains(&nested), "{nested}");
    let open = pattern_states("a{100,}").unwrap();
    assert!((100..=110).contains(&open), "{open}");
    // A class of most of Unicode is many states; an ASCII one a few.
    assert!(pattern_states("\\p{L}").unwrap() > 1_000);
    assert!(pattern_states("[a-z]").unwrap() < 5);
    assert!(pattern_states("^\\p{L}{1,64}$").is_err());
    // The total is what a schema is held to.
    let schema = json!({"properties": {
            "id": {"type": "string", "pattern": uuid},
            "blob": {"type": "string", "pattern": "a{50000}"}}});
    let patterns = check_supported(&schema).unwrap();
    assert_eq!(patterns.count, 2);
    assert!(patterns.states > 50_000, "{patterns:?}");
    let limits = Limits {
        max_patterns: 8,
        max_states: 50_000,
    };
    let err = compile(&schema, &limits).unwrap_err();
    assert!(
        err.contains("more than 50000 states in the schema"),
        "{err}"
    );
    assert!(compile(&json!({"pattern": uuid}), &limits).is_ok());
}

/// Estimating a pattern parses it, so what is parsed is bounded first: a pattern's bytes,
/// its `\c` escapes (each one a new parse of the whole pattern in the translation), and
/// the patterns of a schema, whose walk stops at the first one past the limits (it parsed
/// every one before counting).
#[test]
fn what_an_estimate_parses_is_bounded() {
    let long = "\\pL".repeat(2_000);
    let err = pattern_states(&long).unwrap_err();
    assert!(err.contains("longer than 4096 bytes"), "{err}");
    let controls = "\\cA".repeat(17);
    let err = pattern_states(&controls).unwrap_err();
    assert!(err.contains("control escapes"), "{err}");
    assert!(pattern_states(&"\\cA".repeat(16)).is_ok());
    // The walk stops at the root's third pattern: had it gone on, the children's
    // patterns (which cannot be read) would have been the refusal.
    let mut properties = Map::new();
    for i in 0..1_000 {
        properties.insert(format!("p{i}"), json!({"pattern": "(?=a)"}));
    }
    let schema = json!({"pattern": "^a$", "patternProperties": {"^b$": {}, "^c$": {}},
                            "properties": properties});
    let limits = Limits {
        max_patterns: 2,
        max_states: u64::MAX,
    };
    let err = inspect(&schema, &limits, "the schema", Patterns::default()).unwrap_err();
    assert!(err.contains("more than 2 patterns"), "{err}");
    let limits = Limits {
        max_patterns: 3,
        ..limits
    };
    let err = inspect(&schema, &limits, "the schema", Patterns::default()).unwrap_err();
    assert!(err.contains("look-around"), "{err}");
    assert!(has_patterns(&schema));
    assert!(!has_patterns(
        &json!({"properties": {"pattern": {"type": "string"}}})
    ));
}

#[test]
fn percent_encoded_pointers_resolve() {
    let root = json!({"$defs": {"a b": {"type": "string"}}});
    assert_eq!(
        resolve(&root, "#/$defs/a%20b"),
        Some(&json!({"type": "string"}))
    );
    assert_eq!(resolve(&root, "#/$defs/a%2"), None);
    assert_eq!(
        resolve(&root, "#/$defs/a%+1"),
        None,
        "two hex digits, no sign"
    );
    assert_eq!(resolve(&root, "#"), Some(&root));
}
