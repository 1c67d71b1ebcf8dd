//! What the OpenAPI document says of fields that several request types share, written once
//! beside the checks they stand for (`crate::validate`): the types name these in
//! `#[schema(schema_with = ...)]`, and `routes::openapi`'s tests hold each pattern to its check.

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Ref, Type};

/// Characters Rust's `char::is_whitespace` (and so `str::trim`) counts as white space, as a
/// regex class body written with literal characters, so that every regex dialect (ECMA-262,
/// Python, Rust) reads it alike.
const WHITE_SPACE: &str = "\t\n\u{b}\u{c}\r \u{85}\u{a0}\u{1680}\u{2000}-\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

/// A user message (`validate::user_text`): no NUL, and not blank.
pub fn user_text_pattern() -> String {
    format!("^[^\u{0}]*[^\u{0}{WHITE_SPACE}][^\u{0}]*$")
}

/// A user message; its byte limit (`api.max_input_bytes`) is this deployment's.
pub fn user_text() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(user_text_pattern()))
        .description(Some(
            "The user message: not blank, no NUL, at most `api.max_input_bytes` bytes of UTF-8",
        ))
}

/// A list of at least one `item`; its most (a setting) is this deployment's.
pub fn non_empty_list(item: impl Into<Ref>) -> ArrayBuilder {
    ArrayBuilder::new().min_items(Some(1)).items(item.into())
}
