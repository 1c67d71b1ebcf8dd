//! docs/configuration.md, generated: every key with its type, its default (`defaults.toml`),
//! its environment variable and its meaning (the doc comment of its field). The test fails
//! when the committed file differs from what the code says; `AGENTFLEET_BLESS=1` rewrites it.
//! Only the part below the marker is generated: the text above it is kept as written.
//!
//! The types are read from the sections' source (compiled in with `include_str!`), so a field
//! added without a doc comment, or of a type this file does not know how to show, fails here.

use std::collections::BTreeSet;

use super::{DEFAULTS, ModelSettings};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
const BLESS: &str = "run `AGENTFLEET_BLESS=1 cargo test -p agentfleet-shared config_reference` to regenerate docs/configuration.md";
const MARKER: &str = "<!-- Everything below is generated from shared/src/config (defaults.toml and the fields' doc comments) by `cargo test -p agentfleet-shared config_reference`; edit those, not this. -->";

/// The sources the types and their docs are read from.
const SOURCES: &[&str] = &[
    include_str!("mod.rs"),
    include_str!("amqp.rs"),
    include_str!("api.rs"),
    include_str!("context.rs"),
    include_str!("database.rs"),
    include_str!("egress.rs"),
    include_str!("erasure.rs"),
    include_str!("events.rs"),
    include_str!("export.rs"),
    include_str!("fair_share.rs"),
    include_str!("mcp.rs"),
    include_str!("models.rs"),
    include_str!("rate_limit.rs"),
    include_str!("redis.rs"),
    include_str!("retention.rs"),
    include_str!("startup.rs"),
    include_str!("telemetry.rs"),
    include_str!("webhooks.rs"),
    include_str!("worker.rs"),
    include_str!("../domain/limits.rs"),
];

/// A field of a struct as its source says.
#[derive(Debug)]
struct Field {
    name: String,
    ty: String,
    doc: String,
    /// It has a `#[serde(default…)]`: its default is in the code, not in `defaults.toml`.
    serde_default: bool,
}

/// The doc comment lines above line `at` (attributes skipped), joined.
fn doc_above(lines: &[&str], at: usize) -> String {
    let mut doc = Vec::new();
    for line in lines[..at].iter().rev() {
        let line = line.trim();
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim());
        } else if !line.starts_with("#[") {
            break;
        }
    }
    doc.reverse();
    join(&doc)
}

/// Doc lines as one line of Markdown: paragraphs joined, rustdoc links made code.
fn join(lines: &[&str]) -> String {
    let text = lines
        .iter()
        .map(|l| if l.is_empty() { "<br>" } else { l })
        .collect::<Vec<_>>()
        .join(" ");
    text.replace(" <br> ", "<br>")
        .replace("[`", "`")
        .replace("`]", "`")
        .replace('|', "\\|")
}

/// The line that opens `item` (`pub struct Name {`), in whichever source holds it.
fn find(item: &str) -> Option<(Vec<&'static str>, usize)> {
    SOURCES.iter().find_map(|source| {
        let lines: Vec<&str> = source.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim() == format!("{item} {{"))?;
        Some((lines, at))
    })
}

/// The struct `name`: its doc and its public fields, in order.
fn fields(name: &str) -> (String, Vec<Field>) {
    let (lines, at) = find(&format!("pub struct {name}")).unwrap_or_else(|| {
        panic!("no `pub struct {name}` in SOURCES: add the file that holds it (reference.rs)")
    });
    let mut fields = Vec::new();
    let mut serde_default = false;
    for (i, line) in lines.iter().enumerate().skip(at + 1) {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if line.starts_with("#[serde(default") {
            serde_default = true;
        }
        if line.starts_with("///") || line.starts_with("#[") {
            continue;
        }
        if let Some((field, ty)) = line
            .strip_prefix("pub ")
            .and_then(|l| l.strip_suffix(','))
            .and_then(|l| l.split_once(": "))
        {
            let doc = doc_above(&lines, i);
            assert!(
                !doc.is_empty(),
                "`{name}::{field}` has no doc comment: say what it means (it is the configuration reference)"
            );
            fields.push(Field {
                name: field.to_owned(),
                ty: ty.to_owned(),
                doc,
                serde_default,
            });
        }
        serde_default = false;
    }
    (doc_above(&lines, at), fields)
}

/// The variants of `pub enum name` as configured (snake case), with their docs; `None` when
/// `name` is no enum of the sources.
fn variants(name: &str) -> Option<Vec<(String, String)>> {
    let (lines, at) = find(&format!("pub enum {name}"))?;
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(at + 1) {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if line.starts_with("///") || line.starts_with("#[") {
            continue;
        }
        if let Some(variant) = line.strip_suffix(',') {
            out.push((snake(variant), doc_above(&lines, i)));
        }
    }
    Some(out)
}

fn snake(camel: &str) -> String {
    let mut out = String::new();
    let mut prev_lower = false;
    for c in camel.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// How the reference names a field's type.
fn type_name(ty: &str) -> String {
    match ty {
        "String" => "string".into(),
        "bool" => "boolean".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => "integer".into(),
        "NonZeroU16" | "NonZeroU32" | "NonZeroU64" | "NonZeroUsize" => "integer ≥ 1".into(),
        "Option<u32>" => "integer, optional".into(),
        "Option<f32>" => "number, optional".into(),
        other => match variants(other) {
            Some(values) => values
                .iter()
                .map(|(v, _)| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(" \\| "),
            None => panic!("the configuration reference does not know how to show `{other}`"),
        },
    }
}

/// A field's meaning, with its values' docs when it is an enum whose variants have some.
fn meaning(field: &Field) -> String {
    let mut text = field.doc.clone();
    if let Some(values) = variants(&field.ty)
        && values.iter().all(|(_, doc)| !doc.is_empty())
    {
        for (value, doc) in values {
            text.push_str(&format!("<br>`{value}`: {doc}"));
        }
    }
    text
}

/// A value of `defaults.toml` as the reference shows it.
fn shown(value: &config::ValueKind) -> String {
    match value {
        config::ValueKind::String(s) if s.is_empty() => "(empty)".into(),
        config::ValueKind::String(s) => format!("`{}`", s.replace('|', "\\|")),
        config::ValueKind::Boolean(_) | config::ValueKind::I64(_) | config::ValueKind::U64(_) => {
            format!("`{value}`")
        }
        other => panic!("the configuration reference does not know how to show {other:?}"),
    }
}

/// The sections of `Settings`, in order: (name, struct, doc).
fn sections() -> Vec<(String, String, String)> {
    fields("Settings")
        .1
        .into_iter()
        .map(|f| {
            let ty = f.ty.rsplit("::").next().unwrap_or(&f.ty).to_owned();
            (f.name, ty, f.doc)
        })
        .collect()
}

/// The defaults of a model's keys, read from a model configured with its required keys only.
fn model_default(model: &ModelSettings, field: &Field) -> String {
    if !field.serde_default {
        return "(required)".into();
    }
    let variant = |debug: String| format!("`{}`", snake(&debug));
    match field.name.as_str() {
        "api_key" if model.api_key.is_empty() => "(empty)".into(),
        "max_tokens" if model.max_tokens.is_none() => "(none)".into(),
        "temperature" if model.temperature.is_none() => "(none)".into(),
        "context_tokens" => format!("`{}`", model.context_tokens),
        "tokenizer" => variant(format!("{:?}", model.tokenizer)),
        "tool_calling" => variant(format!("{:?}", model.tool_calling)),
        "http2" => format!("`{}`", model.http2),
        other => panic!("models.<name>.{other}: say here how the reference shows its default"),
    }
}

fn minimal_model() -> ModelSettings {
    serde_json::from_value(serde_json::json!({"base_url": "http://127.0.0.1:1/v1", "model": "m"}))
        .expect("a model needs only base_url and model")
}

const HEADER: &str =
    "| key | type | default | environment variable | meaning |\n| --- | --- | --- | --- | --- |\n";

/// The generated part of the reference.
fn render() -> String {
    let defaults = config::Config::builder()
        .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml))
        .build()
        .expect("defaults.toml parses");
    let mut out = String::new();
    for (section, ty, doc) in sections() {
        if section == "models" {
            continue;
        }
        let table = defaults
            .get_table(&section)
            .unwrap_or_else(|_| panic!("defaults.toml has no [{section}]"));
        out.push_str(&format!("\n## `[{section}]`\n\n{doc}\n\n{HEADER}"));
        for field in fields(&ty).1 {
            let value = table.get(&field.name).unwrap_or_else(|| {
                panic!("`{section}.{}` has no default in defaults.toml", field.name)
            });
            out.push_str(&format!(
                "| `{section}.{name}` | {ty} | {default} | `AGENTFLEET__{upper_section}__{upper}` | {meaning} |\n",
                name = field.name,
                ty = type_name(&field.ty),
                default = shown(&value.kind),
                upper_section = section.to_uppercase(),
                upper = field.name.to_uppercase(),
                meaning = meaning(&field),
            ));
        }
    }
    let model_doc = sections()
        .into_iter()
        .find_map(|(section, _, doc)| (section == "models").then_some(doc))
        .expect("Settings has models");
    let model_fields = fields("ModelSettings").1;
    let model = minimal_model();
    out.push_str(&format!(
        "\n## `[models.<name>]`\n\n{model_doc}\n\n{}",
        HEADER.replace("| default |", "| default (of a model) |")
    ));
    for field in &model_fields {
        out.push_str(&format!(
            "| `models.<name>.{name}` | {ty} | {default} | `AGENTFLEET__MODELS__<NAME>__{upper}` | {meaning} |\n",
            name = field.name,
            ty = type_name(&field.ty),
            default = model_default(&model, field),
            upper = field.name.to_uppercase(),
            meaning = meaning(field),
        ));
    }
    out
}

#[test]
fn config_reference_is_current() {
    let generated = render();
    let committed = std::fs::read_to_string(DOC).unwrap_or_default();
    let head = committed
        .split_once(MARKER)
        .map(|(head, _)| head)
        .unwrap_or("# Configuration\n\n");
    let expected = format!("{head}{MARKER}\n{generated}");
    if committed == expected {
        return;
    }
    if std::env::var_os("AGENTFLEET_BLESS").is_some() {
        std::fs::write(DOC, &expected).expect("write docs/configuration.md");
        return;
    }
    let first = committed
        .lines()
        .zip(expected.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(committed.lines().count().min(expected.lines().count()));
    panic!(
        "docs/configuration.md differs from the configuration types and defaults.toml at line {}:\n  committed: {}\n  generated: {}\n{BLESS}",
        first + 1,
        committed.lines().nth(first).unwrap_or("(end of file)"),
        expected.lines().nth(first).unwrap_or("(end of file)"),
    );
}

/// Every field of every section has its default in `defaults.toml`, and `defaults.toml` holds
/// nothing else: no default is hidden in the code (`#[serde(default)]`).
#[test]
fn config_reference_defaults_toml_holds_every_key_and_only_those() {
    let defaults = config::Config::builder()
        .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml))
        .build()
        .unwrap();
    let mut sections_seen = BTreeSet::new();
    for (section, ty, _) in sections() {
        if section == "models" {
            continue;
        }
        sections_seen.insert(section.clone());
        let fields = fields(&ty).1;
        for field in &fields {
            assert!(
                !field.serde_default,
                "`{section}.{}` has a default in the code: put it in defaults.toml",
                field.name
            );
        }
        let declared: BTreeSet<String> = fields.into_iter().map(|f| f.name).collect();
        let given: BTreeSet<String> = defaults.get_table(&section).unwrap().into_keys().collect();
        assert_eq!(
            declared, given,
            "[{section}]: the fields against defaults.toml"
        );
    }
    let tables: BTreeSet<String> = defaults
        .try_deserialize::<std::collections::BTreeMap<String, serde_json::Value>>()
        .unwrap()
        .into_keys()
        .filter(|k| k != "models")
        .collect();
    assert_eq!(tables, sections_seen, "the sections of defaults.toml");
}

/// The values the reference lists for an enum are the ones the configuration takes, and every
/// key it calls `integer ≥ 1` (a `NonZero*`) refuses 0 with a message naming the key.
#[test]
fn config_reference_types_are_what_loading_accepts() {
    use super::tests::load;
    for (section, ty, _) in sections() {
        if section == "models" {
            continue;
        }
        for field in fields(&ty).1 {
            let key = format!("{section}.{}", field.name);
            if let Some(values) = variants(&field.ty) {
                for (value, _) in values {
                    load(&[(&key, &value)]).unwrap_or_else(|e| panic!("{key} = {value}: {e}"));
                }
            }
            if type_name(&field.ty) == "integer ≥ 1" {
                let err = load(&[(&key, "0")]).unwrap_err().to_string();
                assert!(err.contains(&format!("`{key}`")), "{err}");
            }
        }
    }
    for field in fields("ModelSettings").1 {
        for (value, _) in variants(&field.ty).unwrap_or_default() {
            let model = serde_json::json!({"base_url": "http://h/v1", "model": "m", field.name.as_str(): value});
            serde_json::from_value::<ModelSettings>(model)
                .unwrap_or_else(|e| panic!("models.<name>.{} = {value}: {e}", field.name));
        }
    }
}
