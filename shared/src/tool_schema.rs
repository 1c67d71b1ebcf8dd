//! A tool's parameter schema, as strangers write it: compiled with bounded patterns, limited
//! to the references the argument check can follow, and priced before arguments are checked.
//!
//! Both sides of an argument check are hostile: the schema is a tenant's (an agent's
//! `parameters`) or a remote MCP server's, the arguments are the model's. `jsonschema`
//! validates without a budget, and in-place applicators (`anyOf`, `oneOf`, `allOf`, `not`,
//! `if`/`then`/`else`, `$ref`) that reach the same subschema more than once multiply at every
//! level of the instance: a 3 KB chain of `anyOf`s of two references each takes days on a
//! one-word instance, on whatever thread checks it. So before validating, [`cost`] walks the
//! schema over the arguments as a validator would at worst (every branch taken, no
//! short-circuit) and counts the checks; arguments that would need more than the budget, or
//! nest deeper than a thread's stack allows, are refused without being validated. The walk
//! follows local JSON-pointer references only, so [`check_supported`] refuses what would
//! move them elsewhere (`$id` below the root, anchors, dynamic and recursive references,
//! other documents, a nested `$schema`, `$vocabulary`) and what jsonschema compiles in exponential time
//! (`unevaluatedProperties`, `unevaluatedItems`). Tool schemas of OpenAI-compatible models use
//! `#/$defs/...` and `#` references and none of the rest.

mod request;

pub use request::{RequestSchemas, SchemaError, Verdicts};
use serde_json::{Map, Value};

/// Compiled size one pattern may reach (the `regex` engine's `size_limit`, a tenth of its
/// default): compiling costs about its size, so a pattern past it is refused early instead of
/// taking a thread for a second.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Cache of a pattern's lazy DFA, per thread that matched it (the engine's default is 2 MiB:
/// 256 patterns on a few threads could hold gigabytes). Past it the engine matches with its
/// NFA, in the states × text steps [`cost`] prices anyway.
pub const DFA_SIZE_LIMIT: usize = 64 * 1024;

/// Longest part of jsonschema's own message a compile error keeps.
const MAX_ERROR_BYTES: usize = 300;

/// How much of a schema's patterns is allowed: compiling a pattern costs time and memory
/// in proportion to the states it compiles to (measured with jsonschema 0.61: about 0.5 µs
/// and 40–80 bytes a state; 256 distinct patterns of ~20,000 states each took 2.5 s and
/// 400 MiB), so both their number and their estimated states are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_patterns: usize,
    /// [`Patterns::states`] of every pattern together.
    pub max_states: u64,
}

impl Limits {
    /// For schemas whose patterns were bounded elsewhere (an agent's, at submission).
    pub const NONE: Limits = Limits {
        max_patterns: usize::MAX,
        max_states: u64::MAX,
    };
}

/// A schema's patterns (each `pattern`, each key of a `patternProperties`, counted once
/// wherever references reach them) and the states they are estimated to compile to
/// ([`pattern_states`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Patterns {
    pub count: usize,
    pub states: u64,
}

impl Patterns {
    pub fn add(&mut self, other: Patterns) {
        self.count = self.count.saturating_add(other.count);
        self.states = self.states.saturating_add(other.states);
    }

    /// `what` names where the patterns are in the refusal ("the schema", "the agent's tool
    /// schemas together").
    pub fn within(&self, limits: &Limits, what: &str) -> Result<(), String> {
        if self.count > limits.max_patterns {
            return Err(format!(
                "more than {} patterns (`pattern` and `patternProperties` keys) in {what}",
                limits.max_patterns
            ));
        }
        if self.states > limits.max_states {
            return Err(format!(
                "patterns estimated to compile to more than {} states in {what} (counted \
                 repetitions such as `{{1000}}` multiply what they repeat)",
                limits.max_states
            ));
        }
        Ok(())
    }

    /// Memory the compiled patterns may take, in KiB: ~32 KiB a pattern and up to ~80 bytes a
    /// state (measured with jsonschema 0.61; see [`Limits`]), plus one thread's lazy DFA
    /// caches (forward and reverse, [`DFA_SIZE_LIMIT`] each; a pattern matched on more
    /// threads keeps one pair per thread, and its other engines' caches are not counted).
    pub fn compiled_kib(&self) -> u64 {
        let per_pattern = 32 + 2 * (DFA_SIZE_LIMIT as u64 / 1024);
        (self.count as u64)
            .saturating_mul(per_pattern)
            .saturating_add(self.states.saturating_mul(80) / 1024)
    }
}

/// Compiles a tool's parameter schema as the worker checks arguments against it: no remote
/// references (none are resolved), patterns within `limits`, each on the `regex` engine (no
/// look-around or back-references: a backtracking engine's limit counts backtracks, not
/// time, and jsonschema re-runs a whole validation for each match that hit it), and only the
/// constructs [`cost`] can price. The error is a sentence naming what is wrong and where.
pub fn compile(schema: &Value, limits: &Limits) -> Result<jsonschema::Validator, String> {
    inspect(schema, limits, "the schema", Patterns::default())?;
    build(schema)
}

/// Compiles a schema [`check_supported`] has accepted (and whose patterns the caller has
/// counted): [`compile`] less the walk, for a caller that walked it already.
pub fn build(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        // Read as draft 2020-12 whatever its `$schema` says: no draft-4 `id` moving the base,
        // `format` and `content…` annotations only (never a parse of the value per check).
        .with_draft(jsonschema::Draft::Draft202012)
        .with_pattern_options(
            jsonschema::PatternOptions::regex()
                .size_limit(PATTERN_SIZE_LIMIT)
                .dfa_size_limit(DFA_SIZE_LIMIT),
        )
        .build(schema)
        .map_err(|e| {
            // jsonschema's message quotes the offending part, which may be most of the schema.
            let mut text = e.to_string();
            if text.len() > MAX_ERROR_BYTES {
                let mut cut = MAX_ERROR_BYTES;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                text.push('…');
            }
            format!("invalid JSON Schema: {text}")
        })
}

/// Refuses what the argument check cannot follow: a `$ref` that is not a local JSON pointer
/// (`#` or `#/...`) resolving within the schema as [`cost`] resolves it (so no two readings
/// of a pointer differ), `$dynamicRef`, `$recursiveRef`, anchors, `$id` below the root (it
/// would move the base that `#/...` resolves against), `$schema` below the root (it would
/// switch the draft), `$vocabulary` (it could turn `format` into an assertion) and
/// `unevaluated…`; every reference's target is held to the same rules wherever it sits.
/// Returns the patterns the schema holds, each estimated by [`pattern_states`] (refused past
/// [`MAX_PATTERN_STATES`]), with no limit on them: [`inspect`] holds them to one.
pub fn check_supported(schema: &Value) -> Result<Patterns, String> {
    inspect(schema, &Limits::NONE, "the schema", Patterns::default()).map(|i| i.patterns)
}

/// Each pattern of a schema with its [`pattern_states`], for [`cost_with`] (estimating a
/// pattern parses it: done once per schema, not per call).
pub type PatternTable = std::collections::HashMap<String, u64>;

/// What [`inspect`] found: the schema's patterns, and each one's states.
#[derive(Debug, Default)]
pub struct Inspected {
    pub patterns: Patterns,
    pub states: PatternTable,
}

/// [`check_supported`], with the patterns counted from `already` (a request's other schemas)
/// and held to `limits` as they are met: the walk stops at the first pattern past them, so a
/// schema of a million patterns costs what `limits` allow, not a million parses. `what` names
/// where the patterns are in the refusal. Iterative, and a node's path is spelled only for an
/// error.
pub fn inspect(
    schema: &Value,
    limits: &Limits,
    what: &str,
    already: Patterns,
) -> Result<Inspected, String> {
    // Each node: its value and its place in `steps` (parent, key); the root is `usize::MAX`.
    let mut steps: Vec<(usize, Step<'_>)> = Vec::new();
    let mut stack: Vec<(&Value, usize)> = vec![(schema, usize::MAX)];
    // A `$ref` may point anywhere, under a keyword this walk does not know too: its target is
    // visited as a schema of its own, once.
    let mut visited: std::collections::HashSet<*const Value> = std::collections::HashSet::new();
    let mut found = Inspected::default();
    let mut total = already;
    let mut count = |pattern: &str, states: u64, total: &mut Patterns| {
        let one = Patterns { count: 1, states };
        found.patterns.add(one);
        found.states.insert(pattern.to_owned(), states);
        total.add(one);
        total.within(limits, what)
    };
    let path = |steps: &[(usize, Step<'_>)], mut at: usize| {
        let mut parts = Vec::new();
        while at != usize::MAX {
            let (parent, step) = steps[at];
            parts.push(match step {
                Step::Key(key) => escape(key),
                Step::Index(i) => i.to_string(),
                Step::Target(pointer) => pointer.trim_start_matches('/').to_owned(),
            });
            at = parent;
        }
        if parts.is_empty() {
            return "the root".to_owned();
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    };
    while let Some((node, at)) = stack.pop() {
        let Value::Object(map) = node else { continue };
        if !visited.insert(node as *const Value) {
            continue;
        }
        if let Some(Value::String(pattern)) = map.get("pattern") {
            let states = pattern_states(pattern)
                .map_err(|e| format!("`pattern` at {}: {e}", path(&steps, at)))?;
            count(pattern, states, &mut total)?;
        }
        if let Some(Value::Object(keys)) = map.get("patternProperties") {
            for key in keys.keys() {
                let states = pattern_states(key)
                    .map_err(|e| format!("`patternProperties` at {}: {e}", path(&steps, at)))?;
                count(key, states, &mut total)?;
            }
        }
        if at != usize::MAX && map.contains_key("$schema") {
            return Err(format!(
                "`$schema` is supported at the root only, not at {}",
                path(&steps, at)
            ));
        }
        // `unevaluated…` make jsonschema's compiling exponential in nested branches (an
        // `if`/`then`/`else` chain of 10 took 27 s to compile) and its validating too.
        for key in [
            "$dynamicRef",
            "$recursiveRef",
            "$anchor",
            "$dynamicAnchor",
            "$recursiveAnchor",
            "unevaluatedProperties",
            "unevaluatedItems",
            "$vocabulary",
        ] {
            if map.contains_key(key) {
                return Err(format!("`{key}` at {} is not supported", path(&steps, at)));
            }
        }
        if at != usize::MAX && map.contains_key("$id") {
            return Err(format!(
                "`$id` is supported at the root only, not at {}",
                path(&steps, at)
            ));
        }
        if let Some(reference) = map.get("$ref") {
            // An escaped `/` or `~` would split the pointer differently depending on whether
            // it is decoded before or after splitting, and a `~` not followed by `0` or `1` is
            // read differently by serde_json and by jsonschema: refused, so both readings
            // agree.
            let target = reference
                .as_str()
                .filter(|r| *r == "#" || r.starts_with("#/"))
                .filter(|r| {
                    let lower = r.to_ascii_lowercase();
                    !lower.contains("%2f") && !lower.contains("%7e") && tildes_escape(r)
                })
                .and_then(|r| resolve(schema, r).map(|target| (r, target)));
            let Some((pointer, target)) = target else {
                return Err(format!(
                    "`$ref` at {} must be a local JSON pointer (\"#\" or \"#/...\") to a place \
                     in the schema",
                    path(&steps, at)
                ));
            };
            steps.push((usize::MAX, Step::Target(&pointer[1..])));
            stack.push((target, steps.len() - 1));
        }
        for (key, value) in map {
            match key.as_str() {
                "additionalProperties"
                | "additionalItems"
                | "contains"
                | "propertyNames"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contentSchema" => {
                    steps.push((at, Step::Key(key)));
                    stack.push((value, steps.len() - 1));
                }
                "items" if value.is_object() || value.is_boolean() => {
                    steps.push((at, Step::Key(key)));
                    stack.push((value, steps.len() - 1));
                }
                "allOf" | "anyOf" | "oneOf" | "prefixItems" | "items" => {
                    if let Value::Array(subs) = value {
                        steps.push((at, Step::Key(key)));
                        let list = steps.len() - 1;
                        for (i, sub) in subs.iter().enumerate() {
                            steps.push((list, Step::Index(i)));
                            stack.push((sub, steps.len() - 1));
                        }
                    }
                }
                "properties" | "patternProperties" | "$defs" | "definitions"
                | "dependentSchemas" | "dependencies" => {
                    if let Value::Object(subs) = value {
                        steps.push((at, Step::Key(key)));
                        let map_at = steps.len() - 1;
                        for (name, sub) in subs {
                            steps.push((map_at, Step::Key(name)));
                            stack.push((sub, steps.len() - 1));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(found)
}

/// Whether `schema` has a `pattern` or `patternProperties` anywhere (a scan, no parsing):
/// whether checking and compiling it may take long enough for a blocking thread.
pub fn has_patterns(schema: &Value) -> bool {
    let mut stack = vec![schema];
    while let Some(node) = stack.pop() {
        match node {
            Value::Object(map) => {
                if map.get("pattern").is_some_and(Value::is_string)
                    || map
                        .get("patternProperties")
                        .and_then(Value::as_object)
                        .is_some_and(|keys| !keys.is_empty())
                {
                    return true;
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    false
}

/// One step of a path into a schema; a reference's target is spelled by its pointer.
#[derive(Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
    Target(&'a str),
}

/// Every `~` of a pointer starts `~0` or `~1`.
fn tildes_escape(pointer: &str) -> bool {
    pointer
        .match_indices('~')
        .all(|(i, _)| matches!(pointer.as_bytes().get(i + 1), Some(b'0' | b'1')))
}

/// Most states one pattern may be estimated to compile to ([`pattern_states`]): about
/// 5 MiB and 40 ms to compile; a match may take states × text steps.
pub const MAX_PATTERN_STATES: u64 = 100_000;

/// Longest pattern read: estimating one parses it (a Unicode class such as `\pL` expands to
/// ~5 KB of ranges), so its length is bounded first. Tool schemas' patterns are tens of bytes.
pub const MAX_PATTERN_BYTES: usize = 4096;

/// `\c` escapes a pattern may hold ([`pattern_states`]).
const MAX_CONTROL_ESCAPES: usize = 16;

/// Nesting a pattern may have (groups, repetitions, alternations within one another); the
/// estimate recurses once per level.
const PATTERN_NEST_LIMIT: u32 = 100;

/// An estimate of the states a pattern compiles to, read from the pattern as the `regex`
/// engine will read it (jsonschema's ECMA-262 translation, then `regex-syntax`): a literal
/// byte or a byte range is a state, a Unicode class as many as its ranges take in UTF-8
/// (`.` about 40, `\p{L}` about 2,800), a counted repetition multiplies what it repeats by
/// its bound, nested or in sequence. Refused past [`MAX_PATTERN_STATES`], and when the
/// engine could not compile it (look-around, back-references, bad syntax).
pub fn pattern_states(pattern: &str) -> Result<u64, String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!("is longer than {MAX_PATTERN_BYTES} bytes"));
    }
    // jsonschema's translation parses the whole pattern again for each `\c` it rewrites.
    if pattern.matches("\\c").count() > MAX_CONTROL_ESCAPES {
        return Err(format!(
            "holds more than {MAX_CONTROL_ESCAPES} control escapes (`\\c`)"
        ));
    }
    let unreadable = || {
        "is not a regular expression the `regex` engine accepts (look-around and \
         back-references are not supported)"
            .to_owned()
    };
    let translated = jsonschema_regex::to_rust_regex(pattern).map_err(|()| unreadable())?;
    let hir = regex_syntax::ParserBuilder::new()
        .nest_limit(PATTERN_NEST_LIMIT)
        .build()
        .parse(&translated)
        .map_err(|_| unreadable())?;
    let states = hir_states(&hir);
    if states > MAX_PATTERN_STATES {
        return Err(format!(
            "is estimated to compile to {states} states; at most {MAX_PATTERN_STATES} are \
             allowed (counted repetitions such as `{{1000}}` multiply what they repeat)"
        ));
    }
    Ok(states)
}

/// Recursive, at most [`PATTERN_NEST_LIMIT`] deep (the parser refused deeper).
fn hir_states(hir: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::{Class, HirKind};
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => 1,
        HirKind::Literal(literal) => literal.0.len() as u64,
        HirKind::Class(Class::Bytes(class)) => class.ranges().len() as u64,
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .flat_map(|r| regex_syntax::utf8::Utf8Sequences::new(r.start(), r.end()))
            .map(|sequence| sequence.len() as u64)
            .sum::<u64>()
            .max(1),
        HirKind::Repetition(repetition) => {
            // `{n,m}` compiles m copies, `{n,}` n copies and a loop.
            let copies = match repetition.max {
                Some(max) => u64::from(max.max(1)),
                None => u64::from(repetition.min) + 1,
            };
            hir_states(&repetition.sub)
                .saturating_mul(copies)
                .saturating_add(1)
        }
        HirKind::Capture(capture) => hir_states(&capture.sub).saturating_add(2),
        HirKind::Concat(subs) => subs
            .iter()
            .fold(0u64, |n, sub| n.saturating_add(hir_states(sub))),
        HirKind::Alternation(subs) => subs.iter().fold(subs.len() as u64, |n, sub| {
            n.saturating_add(hir_states(sub))
        }),
    }
}

/// Why arguments were refused unvalidated (see [`cost`]).
#[derive(Debug, PartialEq, Eq)]
pub enum OverBudget {
    /// More checks than the budget.
    Checks { budget: u64 },
    /// Subschemas nested deeper than [`MAX_DEPTH`] over the arguments: the validator recurses
    /// once per level, and a thread's stack is finite.
    Depth,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OverBudget::Checks { budget } => write!(
                f,
                "checking these arguments against the tool's schema would take more than \
                 {budget} checks"
            ),
            OverBudget::Depth => write!(
                f,
                "checking these arguments against the tool's schema would nest more than \
                 {MAX_DEPTH} subschemas deep"
            ),
        }
    }
}

/// Subschemas applied within one another (in place or to a member) that [`cost`] allows.
/// jsonschema recurses once per level or so: 30,000 levels of `$ref` overflowed a 2 MiB
/// stack while collecting errors (5,000 did not); 512 leaves a wide margin.
pub const MAX_DEPTH: u32 = 512;

/// The checks that validating `instance` against `schema` may take at worst, or
/// [`OverBudget`] as soon as they pass `budget` (or nest past [`MAX_DEPTH`]): one per
/// subschema applied to one value, charged when it is scheduled, with every in-place
/// applicator taken (a validator stops an `anyOf` at its first match; a failing instance
/// takes them all), plus what costs by size (patterns by the length of pattern and text,
/// `required`, `enum`, `uniqueItems`, a reference's length). Never recursive, and every step
/// is charged, so the walk ends within `budget` steps whatever the schema. A `$ref` that
/// does not resolve here (refused by [`check_supported`]) is priced as the whole budget.
///
/// It prices [`jsonschema::Validator::is_valid`]: error reports cost more (every branch's
/// errors are collected, an `anyOf` of one branch is run twice), so the worker collects them
/// only for arguments whose price is small. Calibrated against jsonschema 0.61 on adversarial
/// schemas (chains of `anyOf`, `oneOf`, `allOf`, `if`/`then`/`else`, `dependentSchemas`,
/// many patterns, long strings, large `enum`s).
pub fn cost(schema: &Value, instance: &Value, budget: u64) -> Result<u64, OverBudget> {
    let states = inspect(schema, &Limits::NONE, "the schema", Patterns::default())
        .map(|i| i.states)
        .unwrap_or_default();
    cost_with(schema, instance, budget, &states)
}

/// [`cost`] with each pattern's states given ([`inspect`]); a pattern not in `states` is
/// priced at [`MAX_PATTERN_STATES`]. Parses nothing: what a worker calls per tool call.
pub fn cost_with(
    schema: &Value,
    instance: &Value,
    budget: u64,
    states: &PatternTable,
) -> Result<u64, OverBudget> {
    let mut walk = Walk {
        root: schema,
        budget,
        spent: 0,
        stack: Vec::new(),
        states,
    };
    walk.push(schema, Instance::Value(instance), 0)?;
    while let Some((node, value, depth)) = walk.stack.pop() {
        let Value::Object(s) = node else { continue };
        walk.in_place(s, value, depth + 1)?;
        match value {
            Instance::Value(Value::Object(object)) => walk.object(s, object, depth + 1)?,
            Instance::Value(Value::Array(items)) => walk.array(s, items, depth + 1)?,
            Instance::Value(Value::String(text)) => walk.string(s, text)?,
            Instance::Key(text) => walk.string(s, text)?,
            Instance::Value(_) => {}
        }
        if let Some(Value::Array(options)) = s.get("enum") {
            walk.charge(options.len() as u64)?;
        }
    }
    Ok(walk.spent)
}

/// A value the walk applies a subschema to: part of the instance, or one of its objects'
/// keys (`propertyNames`).
#[derive(Clone, Copy)]
enum Instance<'a> {
    Value(&'a Value),
    Key(&'a str),
}

struct Walk<'a> {
    root: &'a Value,
    budget: u64,
    spent: u64,
    stack: Vec<(&'a Value, Instance<'a>, u32)>,
    /// Each pattern's [`pattern_states`] ([`inspect`]).
    states: &'a PatternTable,
}

impl<'a> Walk<'a> {
    fn charge(&mut self, n: u64) -> Result<(), OverBudget> {
        self.spent = self.spent.saturating_add(n);
        if self.spent > self.budget {
            return Err(OverBudget::Checks {
                budget: self.budget,
            });
        }
        Ok(())
    }

    /// Schedules `sub` over `value`, charging its check now: the stack never holds more
    /// entries than the budget.
    fn push(&mut self, sub: &'a Value, value: Instance<'a>, depth: u32) -> Result<(), OverBudget> {
        if depth > MAX_DEPTH {
            return Err(OverBudget::Depth);
        }
        self.charge(1)?;
        self.stack.push((sub, value, depth));
        Ok(())
    }

    /// Subschemas applied to the same value.
    fn in_place(
        &mut self,
        s: &'a Map<String, Value>,
        value: Instance<'a>,
        depth: u32,
    ) -> Result<(), OverBudget> {
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(subs)) = s.get(key) {
                for sub in subs {
                    self.push(sub, value, depth)?;
                }
            }
        }
        for key in ["not", "if", "then", "else"] {
            if let Some(sub) = s.get(key) {
                self.push(sub, value, depth)?;
            }
        }
        if let Some(reference) = s.get("$ref").and_then(Value::as_str) {
            self.charge(1 + reference.len() as u64 / 64)?;
            // `check_supported` refused a reference that does not resolve; one that does
            // not here is priced as the whole budget rather than as nothing.
            let Some(target) = resolve(self.root, reference) else {
                return Err(OverBudget::Checks {
                    budget: self.budget,
                });
            };
            self.push(target, value, depth)?;
        }
        if let Instance::Value(Value::Object(_)) = value {
            for key in ["dependentSchemas", "dependencies"] {
                if let Some(Value::Object(subs)) = s.get(key) {
                    for sub in subs.values().filter(|sub| !sub.is_array()) {
                        self.push(sub, value, depth)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Subschemas applied to an object's members and keys, and `required`.
    fn object(
        &mut self,
        s: &'a Map<String, Value>,
        object: &'a Map<String, Value>,
        depth: u32,
    ) -> Result<(), OverBudget> {
        if let Some(Value::Array(required)) = s.get("required") {
            self.charge(required.len() as u64)?;
        }
        if let Some(Value::Object(properties)) = s.get("properties") {
            for (name, member) in object {
                if let Some(sub) = properties.get(name) {
                    self.push(sub, Instance::Value(member), depth)?;
                }
            }
        }
        if let Some(Value::Object(patterns)) = s.get("patternProperties") {
            for (pattern, sub) in patterns {
                for (name, member) in object {
                    let price = self.pattern_cost(pattern, name);
                    self.charge(price)?;
                    self.push(sub, Instance::Value(member), depth)?;
                }
            }
        }
        if let Some(sub) = s.get("additionalProperties") {
            for member in object.values() {
                self.push(sub, Instance::Value(member), depth)?;
            }
        }
        if let Some(sub) = s.get("propertyNames") {
            for name in object.keys() {
                self.push(sub, Instance::Key(name), depth)?;
            }
        }
        Ok(())
    }

    /// Subschemas applied to an array's items, and `uniqueItems`.
    fn array(
        &mut self,
        s: &'a Map<String, Value>,
        items: &'a [Value],
        depth: u32,
    ) -> Result<(), OverBudget> {
        for key in ["prefixItems", "items"] {
            if let Some(Value::Array(subs)) = s.get(key) {
                for (sub, item) in subs.iter().zip(items) {
                    self.push(sub, Instance::Value(item), depth)?;
                }
            }
        }
        for key in ["items", "additionalItems", "contains"] {
            if let Some(sub @ (Value::Object(_) | Value::Bool(_))) = s.get(key) {
                for item in items {
                    self.push(sub, Instance::Value(item), depth)?;
                }
            }
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) {
            // Hashed, but nested arrays can be made to collide: priced as pairwise.
            let n = items.len() as u64;
            self.charge(n + n.saturating_mul(n) / 64)?;
        }
        Ok(())
    }

    /// One match of `pattern` against `text` on the `regex` engine: states × text steps at
    /// worst ([`pattern_states`]), a few ns each when the lazy DFA gives up (a review's
    /// estimate from the engine's design), so a check (~1–2 µs) per 256; plus a scan of the
    /// pattern. The estimate is coarse both ways: a counted pattern on short strings costs
    /// tens of checks a match.
    fn pattern_cost(&mut self, pattern: &'a str, text: &str) -> u64 {
        let states = self
            .states
            .get(pattern)
            .copied()
            .unwrap_or(MAX_PATTERN_STATES);
        1 + pattern.len() as u64 / 64 + states.saturating_mul(text.len() as u64) / 256
    }

    fn string(&mut self, s: &'a Map<String, Value>, text: &str) -> Result<(), OverBudget> {
        if let Some(pattern) = s.get("pattern").and_then(Value::as_str) {
            let price = self.pattern_cost(pattern, text);
            self.charge(price)?;
        }
        if s.contains_key("minLength") || s.contains_key("maxLength") {
            self.charge(text.len() as u64 / 64)?;
        }
        Ok(())
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
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
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

#[cfg(test)]
mod tests;
