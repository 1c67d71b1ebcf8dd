//! What the OpenAPI document says of fields that several types share (here and in the API):
//! text Postgres can store, tool URLs, free-form JSON. Each is the rule the server applies,
//! next to the types that carry it (`#[schema(...)]`), so the document cannot say otherwise;
//! the API's tests hold every pattern to the check it stands for.

use std::borrow::Cow;

use serde_json::Value;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{
    AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{RefOr, schema::Ref};
use utoipa::{PartialSchema, ToSchema};

/// Text without NUL: Postgres stores none (the API's `validate::storable` refuses it).
pub const NO_NUL: &str = "^[^\u{0}]*$";

/// The largest magnitude of a JSON number the API stores (its `validate::MAX_NUMBER`).
pub const MAX_JSON_NUMBER: f64 = 1e300;

/// What `check_tool_url` accepts, as a pattern of its common forms: `http` or `https`, a DNS
/// name (whose last label starts with a letter, as WHATWG URLs require of names that are not
/// IPv4 addresses) or `ipv4` (a pattern of dotted IPv4 addresses), an optional port, then
/// printable ASCII without backslashes. Bracketed IPv6 addresses and internationalized names in
/// punycode are accepted too, beyond this pattern.
pub fn tool_url_pattern(schemes: &str, ipv4: &str) -> String {
    let label = "[A-Za-z0-9]+(-[A-Za-z0-9]+)*";
    let last = "[A-Za-z]([A-Za-z0-9]*(-[A-Za-z0-9]+)*)?";
    let port = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})";
    format!("^{schemes}://(({label}\\.)*{last}|{ipv4})(:{port})?([/?#][!-\\[\\]-~]*)?$")
}

/// `http` or `https`, in any case.
pub const HTTP_OR_HTTPS: &str = "[Hh][Tt][Tt][Pp][Ss]?";

/// Every dotted IPv4 address, each octet in decimal without leading zeros.
pub const ANY_IPV4: &str = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}";

/// A tool URL of at most `max_bytes` (the pattern is ASCII: characters are bytes).
pub fn tool_url(max_bytes: usize, description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(max_bytes))
        .pattern(Some(tool_url_pattern(HTTP_OR_HTTPS, ANY_IPV4)))
        .description(Some(description))
}

/// A keyword utoipa's schema model has no field for (`not`, `contentSchema`), carried in its
/// map of extensions, which is serialized as written.
pub fn keyword(schema: ObjectBuilder, name: &str, value: Value) -> ObjectBuilder {
    schema.extensions(Some(Extensions::from_iter([(name, value)])))
}

/// Text of this pattern, not one of `names`.
pub fn name_but_not(pattern: &str, names: &[&str], description: &str) -> Schema {
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .description(Some(description));
    keyword(schema, "not", serde_json::json!({ "enum": names })).into()
}

/// Any JSON value the API can store and read back: strings and object keys without NUL,
/// numbers within ±[`MAX_JSON_NUMBER`].
pub struct JsonValue;

impl PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        AnyOfBuilder::new()
            .description(Some(
                "Any JSON value whose strings and object keys hold no NUL character and whose numbers are within ±1e300",
            ))
            .item(ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::Null, Type::Boolean])))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .minimum(Some(-MAX_JSON_NUMBER))
                    .maximum(Some(MAX_JSON_NUMBER)),
            )
            .item(ObjectBuilder::new().schema_type(Type::String).pattern(Some(NO_NUL)))
            .item(ArrayBuilder::new().items(Ref::from_schema_name("JsonValue")))
            .item(Ref::from_schema_name("JsonObject"))
            .into()
    }
}

impl ToSchema for JsonValue {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonValue")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("JsonObject".into(), JsonObject::schema()));
    }
}

/// A JSON object of [`JsonValue`]s, its keys without NUL.
pub struct JsonObject;

impl PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property_names(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(NO_NUL)),
            ))
            .additional_properties(Some(Ref::from_schema_name("JsonValue")))
            .into()
    }
}

impl ToSchema for JsonObject {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonObject")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("JsonValue".into(), JsonValue::schema()));
    }
}
