//! `GET /openapi.json`: the API's OpenAPI 3.1 document, exact enough to generate valid and
//! invalid requests from (scripts/fuzz does, with schemathesis).
//!
//! The shapes come from the types (utoipa derives); then [`constrain`] writes in the rules
//! the handlers enforce, several of which are configuration (the models, the page and batch
//! sizes, the number of tools), so the served document is that of this deployment. Every
//! pattern here is the same rule the server applies (see `crate::validate`, `check_tool_url`),
//! and the error statuses each operation can answer are listed with the error schema.

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use agentfleet_shared::config::Settings;
use agentfleet_shared::domain::{AgentSpec, Risk, RunStatus, ToolKind, ToolSpec};

use super::view;
use crate::routes::runs::create::CreateRun;
use crate::routes::runs::resume::{DecisionBody, ResumeBody};
use crate::state::AppState;
use crate::validate::MAX_ID;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentfleet",
        description = "Runs LLM agents on a fleet of workers. Every error is `{\"error\": {\"code\", \"message\"}}`; validation errors name the field (`agent.tools[0].url: must name a host`)."
    ),
    paths(
        crate::routes::runs::create::create_run,
        crate::routes::runs::batch::create_batch,
        crate::routes::runs::list::list_runs,
        crate::routes::runs::list::count_runs,
        crate::routes::runs::get::get_run,
        crate::routes::runs::events::run_events,
        crate::routes::runs::resume::resume_run,
        crate::routes::runs::cancel::cancel_run,
        crate::routes::runs::stream_token::issue_stream_token,
        crate::routes::threads::messages::list_messages,
        crate::routes::threads::events::thread_events,
        super::usage::get_usage,
        crate::routes::batches::create::submit_batch,
        crate::routes::batches::get::list_batches,
        crate::routes::batches::get::get_batch,
        crate::routes::batches::results::batch_results,
        crate::routes::batches::cancel::cancel_batch,
        crate::routes::batches::events::batch_events,
        crate::routes::mcp_servers::create::create_mcp_server,
        crate::routes::mcp_servers::list::list_mcp_servers,
        crate::routes::mcp_servers::get::get_mcp_server,
        crate::routes::mcp_servers::delete::delete_mcp_server,
        crate::routes::webhooks::create::create_webhook,
        crate::routes::webhooks::list::list_webhooks,
        crate::routes::webhooks::get::get_webhook,
        crate::routes::webhooks::delete::delete_webhook,
        crate::routes::webhooks::deliveries::list_deliveries,
        crate::routes::webhooks::rotate::rotate_secret,
        crate::routes::webhooks::retry::retry_delivery,
        super::health::healthz,
        super::health::readyz,
        openapi,
        crate::routes::admin::tenants::create_tenant,
        crate::routes::admin::tenants::list_tenants,
        crate::routes::admin::tenants::get_tenant,
        crate::routes::admin::tenants::suspend_tenant,
        crate::routes::admin::tenants::resume_tenant,
        crate::routes::admin::tenants::update_limits,
        crate::routes::admin::keys::create_key,
        crate::routes::admin::keys::list_keys,
        crate::routes::admin::keys::get_key,
        crate::routes::admin::keys::revoke_key,
        crate::routes::admin::keys::rotate_key,
    ),
    components(schemas(
        CreateRun,
        crate::routes::runs::batch::CreateBatch,
        crate::routes::batches::create::SubmitBatch,
        crate::routes::batches::create::BatchItem,
        ResumeBody,
        DecisionBody,
        AgentSpec,
        ToolSpec,
        ToolKind,
        Risk,
        RunStatus,
        agentfleet_shared::store::double_text::IfBusy,
        view::Run,
        view::Usage,
        view::UsageReport,
        view::UsageDay,
        view::UsageFigures,
        view::RunPage,
        view::RunCounts,
        view::BatchCreated,
        view::Batch,
        view::BatchCounts,
        view::BatchUsage,
        view::BatchPage,
        view::Message,
        view::MessagePage,
        view::StreamToken,
        view::ErrorBody,
        view::ErrorDetail,
        view::Health,
        view::Readiness,
        crate::routes::mcp_servers::create::CreateMcpServer,
        crate::routes::mcp_servers::create::HeaderBody,
        crate::routes::mcp_servers::list::McpServerList,
        agentfleet_shared::store::mcp_servers::McpServer,
        crate::routes::webhooks::create::CreateWebhook,
        crate::routes::webhooks::create::WebhookCreated,
        crate::routes::webhooks::rotate::RotateSecret,
        crate::routes::webhooks::list::WebhookList,
        crate::routes::webhooks::deliveries::DeliveryPage,
        agentfleet_shared::store::webhooks::Endpoint,
        agentfleet_shared::store::webhook_deliveries::DeliveryInfo,
        crate::routes::admin::tenants::CreateTenant,
        crate::routes::admin::tenants::TenantView,
        crate::routes::admin::tenants::TenantCreated,
        crate::routes::admin::tenants::TenantPage,
        crate::routes::admin::keys::CreateKey,
        crate::routes::admin::keys::RotateKey,
        crate::routes::admin::keys::KeyList,
        agentfleet_shared::store::tenants::TenantInfo,
        agentfleet_shared::store::keys::KeyInfo,
        agentfleet_shared::store::keys::CreatedKey,
        agentfleet_shared::store::keys::Rotated
    ))
)]
pub struct ApiDoc;

#[utoipa::path(get, path = "/openapi.json", tag = "operations", operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI document of this deployment", body = Object)))]
pub async fn openapi(State(state): State<AppState>) -> Json<Value> {
    Json(document(&state.settings))
}

/// The document served for these settings.
pub fn document(settings: &Settings) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    constrain(&mut doc, settings);
    if settings.api.admin_token.is_empty() {
        // The admin API does not exist in this deployment (its paths answer 404).
        if let Some(paths) = doc["paths"].as_object_mut() {
            paths.retain(|path, _| !path.starts_with("/admin/"));
        }
    }
    secure(&mut doc);
    add_error_responses(&mut doc);
    add_links(&mut doc);
    doc
}

/// Characters Rust's `char::is_whitespace` (and so `str::trim`) counts as white space, as a
/// regex class body written with literal characters, so that every regex dialect (ECMA-262,
/// Python, Rust) reads it alike.
const WHITE_SPACE: &str = "\t\n\u{b}\u{c}\r \u{85}\u{a0}\u{1680}\u{2000}-\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

/// Text without NUL (Postgres stores none: see `crate::validate::storable`).
fn no_nul() -> String {
    "^[^\u{0}]*$".to_owned()
}

/// A user message: no NUL, and not blank.
fn user_text() -> String {
    format!("^[^\u{0}]*[^\u{0}{WHITE_SPACE}][^\u{0}]*$")
}

const UUID: &str = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";

/// What `check_tool_url` accepts, written as a pattern for its common forms: `http` or
/// `https`, a DNS name (whose last label starts with a letter, as WHATWG URLs require of names
/// that are not IPv4 addresses) or a dotted IPv4 address, an optional port, then printable
/// ASCII without backslashes. Bracketed IPv6 addresses and internationalized names in
/// punycode are accepted too, beyond this pattern.
fn tool_url() -> String {
    let label = "[A-Za-z0-9]+(-[A-Za-z0-9]+)*";
    let last = "[A-Za-z]([A-Za-z0-9]*(-[A-Za-z0-9]+)*)?";
    let octet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let port = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})";
    format!(
        "^[Hh][Tt][Tt][Pp][Ss]?://(({label}\\.)*{last}|{octet}(\\.{octet}){{3}})(:{port})?([/?#][!-\\[\\]-~]*)?$"
    )
}

/// JSON whose strings and keys hold no NUL, at any depth.
fn json_value_schema() -> Value {
    json!({
        "description": "Any JSON value whose strings and object keys hold no NUL character and whose numbers are within ±1e300",
        "anyOf": [
            {"type": ["null", "boolean"]},
            {"type": "number", "minimum": -crate::validate::MAX_NUMBER, "maximum": crate::validate::MAX_NUMBER},
            {"type": "string", "pattern": no_nul()},
            {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
            {"$ref": "#/components/schemas/JsonObject"},
        ]
    })
}

fn json_object_schema() -> Value {
    json!({
        "type": "object",
        "propertyNames": {"pattern": no_nul()},
        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
    })
}

/// Sets `key` of the object at `pointer` (which must exist: the test below reads the whole
/// document, so a renamed field fails there, not in production).
fn set(doc: &mut Value, pointer: &str, key: &str, value: Value) {
    match doc.pointer_mut(pointer).and_then(Value::as_object_mut) {
        Some(object) => {
            object.insert(key.to_owned(), value);
        }
        None => panic!("openapi: no object at {pointer}"),
    }
}

/// Replaces the schema at `pointer` (keeping its description).
fn replace(doc: &mut Value, pointer: &str, mut schema: Value) {
    let slot = doc
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("openapi: nothing at {pointer}"));
    if let (Some(d), Some(s)) = (slot.get("description").cloned(), schema.as_object_mut()) {
        s.entry("description").or_insert(d);
    }
    *slot = schema;
}

fn parameter<'a>(doc: &'a mut Value, path: &str, method: &str, name: &str) -> &'a mut Value {
    doc["paths"][path][method]["parameters"]
        .as_array_mut()
        .and_then(|ps| ps.iter_mut().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("openapi: no parameter {name} of {method} {path}"))
}

/// The rules the handlers enforce, several of them from configuration.
fn constrain(doc: &mut Value, settings: &Settings) {
    let api = &settings.api;
    let schemas = "/components/schemas";
    set(doc, schemas, "JsonValue", json_value_schema());
    set(doc, schemas, "JsonObject", json_object_schema());
    let json_object = || json!({"$ref": "#/components/schemas/JsonObject"});

    // A run request.
    let p = format!("{schemas}/CreateRun/properties");
    replace(
        doc,
        &format!("{p}/input"),
        json!({"type": "string", "pattern": user_text(), "description": format!(
            "The user message: not blank, no NUL, at most {} bytes of UTF-8 (`api.max_input_bytes`)",
            api.max_input_bytes)}),
    );
    replace(
        doc,
        &format!("{p}/metadata"),
        json!({"anyOf": [json_object(), {"type": "null"}], "description": format!(
            "Free-form; at most {} bytes as JSON (`api.max_metadata_bytes`)", api.max_metadata_bytes)}),
    );
    // A batch's item: the same rules as a run request, and its `custom_id`.
    let p = format!("{schemas}/BatchItem/properties");
    replace(
        doc,
        &format!("{p}/input"),
        json!({"type": "string", "pattern": user_text(), "description": format!(
            "The user message: not blank, no NUL, at most {} bytes of UTF-8 (`api.max_input_bytes`)",
            api.max_input_bytes)}),
    );
    replace(
        doc,
        &format!("{p}/metadata"),
        json!({"anyOf": [json_object(), {"type": "null"}], "description": format!(
            "Free-form; at most {} bytes as JSON (`api.max_metadata_bytes`)", api.max_metadata_bytes)}),
    );
    replace(
        doc,
        &format!("{p}/custom_id"),
        json!({"type": "string", "minLength": 1,
               "maxLength": crate::routes::batches::create::MAX_CUSTOM_ID_CHARS, "pattern": no_nul(),
               "description": "Unique within the batch; the results name the item by it"}),
    );
    let p = format!("{schemas}/SubmitBatch/properties");
    replace(
        doc,
        &format!("{p}/metadata"),
        json!({"anyOf": [json_object(), {"type": "null"}], "description": format!(
            "Free-form; at most {} bytes as JSON (`api.max_metadata_bytes`)", api.max_metadata_bytes)}),
    );
    set(doc, &format!("{p}/runs"), "minItems", json!(1));
    set(
        doc,
        &format!("{p}/runs"),
        "maxItems",
        json!(api.max_batch_items),
    );
    set(doc, &format!("{p}/runs"), "uniqueItems", json!(true));
    let p = format!("{schemas}/AgentSpec/properties");
    let models: Vec<&String> = settings.models.keys().collect();
    replace(
        doc,
        &format!("{p}/model"),
        json!({"type": "string", "enum": models,
               "description": "A model configured on this deployment (`models.<name>`)"}),
    );
    replace(
        doc,
        &format!("{p}/system_prompt"),
        json!({"type": ["string", "null"], "pattern": no_nul(),
               "description": "At most 200000 bytes of UTF-8, no NUL"}),
    );
    set(
        doc,
        &format!("{p}/tools"),
        "maxItems",
        json!(api.max_tools_per_agent),
    );
    set(
        doc,
        &format!("{p}/tools"),
        "description",
        json!(format!(
            "At most {} tools (`api.max_tools_per_agent`), with distinct names",
            api.max_tools_per_agent
        )),
    );
    replace(
        doc,
        &format!("{p}/max_iterations"),
        json!({"type": ["integer", "null"], "minimum": 1, "maximum": 10000,
               "description": "Model calls at most; `worker.default_max_iterations` when null"}),
    );
    replace(
        doc,
        &format!("{p}/max_tokens_total"),
        json!({"type": ["integer", "null"], "minimum": 1, "maximum": api.max_tokens_total,
               "description": format!(
                   "The run's token budget (prompt + completion); once reached the run fails with `budget_exceeded` between iterations. At most {} (`api.max_tokens_total`)",
                   api.max_tokens_total)}),
    );
    let p = format!("{schemas}/ToolSpec/properties");
    replace(
        doc,
        &format!("{p}/name"),
        json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$",
               "not": {"enum": agentfleet_shared::domain::BUILTIN_TOOLS},
               "description": "Unique within the agent; not a built-in tool (`complete`, `ask`, `expand_message`)"}),
    );
    replace(
        doc,
        &format!("{p}/description"),
        json!({"type": "string", "pattern": no_nul()}),
    );
    replace(
        doc,
        &format!("{p}/parameters"),
        json!({"allOf": [json_object()], "description":
            "The JSON Schema (draft 2020-12 unless `$schema` says otherwise) of the arguments object"}),
    );
    replace(
        doc,
        &format!("{p}/url"),
        json!({"type": "string", "maxLength": agentfleet_shared::domain::MAX_TOOL_URL_BYTES,
               "pattern": tool_url(), "description":
            "Absolute `http` or `https` URL with a host: no whitespace, control characters, backslashes or `user:password@`"}),
    );
    replace(
        doc,
        &format!("{p}/timeout_ms"),
        json!({"type": ["integer", "null"], "minimum": 1, "maximum": 3_600_000,
               "description": "Deadline of one call; `worker.tool_timeout_ms` when null"}),
    );
    set(
        doc,
        &format!("{schemas}/CreateBatch/properties/runs"),
        "minItems",
        json!(1),
    );
    set(
        doc,
        &format!("{schemas}/CreateBatch/properties/runs"),
        "maxItems",
        json!(api.max_batch_runs),
    );

    // A resume: exactly one of `input` and `decisions`.
    let p = format!("{schemas}/ResumeBody");
    replace(
        doc,
        &format!("{p}/properties/input"),
        json!({"type": "string", "pattern": user_text(), "description": format!(
            "Answers a question: not blank, no NUL, at most {} bytes", api.max_input_bytes)}),
    );
    replace(
        doc,
        &format!("{p}/properties/decisions"),
        json!({"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/DecisionBody"},
               "description": "Settles every pending confirmation"}),
    );
    set(
        doc,
        &p,
        "oneOf",
        json!([{"required": ["input"]}, {"required": ["decisions"]}]),
    );
    let p = format!("{schemas}/DecisionBody/properties");
    replace(
        doc,
        &format!("{p}/tool_call_id"),
        json!({"type": "string", "pattern": no_nul()}),
    );
    replace(
        doc,
        &format!("{p}/reason"),
        json!({"type": ["string", "null"], "pattern": no_nul(), "description": format!(
            "Why; at most {} bytes", api.max_input_bytes)}),
    );

    replace(
        doc,
        &format!("{schemas}/Batch/properties/status"),
        json!({"type": "string",
               "enum": ["creating", "in_progress", "completed", "cancelling", "cancelled"]}),
    );
    // Answers: the pending and error objects, and message bodies, are free-form JSON.
    replace(
        doc,
        &format!("{schemas}/Run/properties/error"),
        json!({"type": ["object", "null"], "required": ["code", "message"],
               "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}),
    );

    // Parameters.
    let page = |default: u32| {
        json!({"type": "integer", "minimum": 1, "maximum": api.max_page_size,
               "description": format!("Page size, 1 to {} (`api.max_page_size`); {default} when absent",
                                      api.max_page_size)})
    };
    parameter(doc, "/v1/runs", "get", "limit")["schema"] = page(api.default_page_size);
    parameter(doc, "/v1/threads/{id}/messages", "get", "limit")["schema"] =
        page(api.default_page_size);
    let day =
        json!({"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"});
    parameter(doc, "/v1/usage", "get", "from")["schema"] = day.clone();
    parameter(doc, "/v1/usage", "get", "to")["schema"] = day;
    parameter(doc, "/v1/runs", "get", "cursor")["schema"] =
        json!({"type": "string", "pattern": crate::routes::runs::list::CURSOR_PATTERN});
    parameter(doc, "/v1/batches", "get", "limit")["schema"] = page(api.default_page_size);
    parameter(doc, "/v1/batches", "get", "before")["schema"] =
        json!({"type": "string", "pattern": crate::routes::runs::list::CURSOR_PATTERN});
    parameter(doc, "/v1/batches/{id}/results", "get", "status")["schema"] =
        json!({"type": "string", "enum": ["finished"]});
    parameter(doc, "/v1/batches", "post", "Idempotency-Key")["schema"] = json!({
        "type": "string", "minLength": 1, "maxLength": crate::routes::batches::create::MAX_KEY_CHARS,
        "pattern": "^[!-~]([\t -~]{0,198}[!-~])?$",
    });
    doc["paths"]["/v1/batches/{id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
        ["schema"] = json!({
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "enum": ["progress", "batch_completed"]},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"$ref": "#/components/schemas/Batch"}},
            "retry": {"type": "integer", "minimum": 0},
        },
    });
    let id = json!({"type": "integer", "minimum": 0, "maximum": MAX_ID});
    parameter(doc, "/v1/threads/{id}/messages", "get", "after")["schema"] = id.clone();
    parameter(doc, "/v1/runs/{id}/events", "get", "after")["schema"] = id;
    parameter(doc, "/v1/runs/{id}/events", "get", "Last-Event-ID")["schema"] =
        json!({"type": "string", "pattern": "^[0-9]{1,18}$"});
    parameter(doc, "/v1/threads/{id}/events", "get", "Last-Event-ID")["schema"] =
        json!({"type": "string", "pattern": format!("^{UUID}:[0-9]{{1,18}}$")});
    // Event streams: each event as schemathesis and browsers read it, its data a JSON envelope.
    set(doc, schemas, "EventEnvelope", event_envelope_schema());
    for (path, id_pattern) in [
        ("/v1/runs/{id}/events", "^[0-9]+$".to_owned()),
        ("/v1/threads/{id}/events", format!("^{UUID}:[0-9]+$")),
    ] {
        doc["paths"][path]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"] =
            sse_event_schema(&id_pattern);
    }
    constrain_webhooks(doc, settings);
    constrain_mcp(doc, settings);
    parameter(doc, "/v1/runs", "post", "Idempotency-Key")["schema"] = json!({
        "type": "string", "minLength": 1, "maxLength": 255,
        "pattern": "^[!-~]([\t -~]{0,253}[!-~])?$",
    });
}

/// The rules of `POST /v1/mcp-servers` (`mcp_servers::check`) and of `mcp` tool entries.
fn constrain_mcp(doc: &mut Value, settings: &Settings) {
    let mcp = &settings.mcp;
    let name = json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"});
    let p = "/components/schemas/CreateMcpServer/properties";
    replace(doc, &format!("{p}/name"), name.clone());
    replace(
        doc,
        &format!("{p}/url"),
        json!({"type": "string", "maxLength": agentfleet_shared::domain::MAX_TOOL_URL_BYTES,
               "pattern": tool_url(),
               "description": "The streamable-HTTP endpoint; an address the egress policy refuses is refused"}),
    );
    replace(
        doc,
        &format!("{p}/description"),
        json!({"type": ["string", "null"], "maxLength": crate::routes::mcp_servers::create::MAX_DESCRIPTION_CHARS,
               "pattern": no_nul()}),
    );
    replace(
        doc,
        &format!("{p}/headers"),
        json!({"type": ["array", "null"], "maxItems": mcp.max_headers,
               "items": {"$ref": "#/components/schemas/HeaderBody"},
               "description": "Write-only; needs `mcp.encryption_key` on the deployment"}),
    );
    let p = "/components/schemas/HeaderBody/properties";
    replace(
        doc,
        &format!("{p}/name"),
        json!({"type": "string", "pattern": format!(
            "^[A-Za-z0-9!#$%&'*+.^_`|~-]{{1,{}}}$", crate::routes::mcp_servers::create::MAX_HEADER_NAME_BYTES),
            "not": {"enum": crate::routes::mcp_servers::create::RESERVED_HEADERS}}),
    );
    replace(
        doc,
        &format!("{p}/value"),
        json!({"type": "string", "maxLength": mcp.max_header_value_bytes,
               "pattern": "^[\t -~]*$",
               "description": "Visible ASCII, spaces and tabs"}),
    );
    for path in ["/v1/mcp-servers/{name}"] {
        for method in ["get", "delete"] {
            parameter(doc, path, method, "name")["schema"] = name.clone();
        }
    }
    let p = "/components/schemas/ToolSpec/properties";
    replace(
        doc,
        &format!("{p}/server"),
        json!({"type": ["string", "null"], "pattern": "^[A-Za-z0-9_-]{1,64}$",
               "description": "`mcp`: a server registered under `/v1/mcp-servers` (instead of `url`)"}),
    );
    replace(
        doc,
        &format!("{p}/tools"),
        json!({"type": ["array", "null"], "minItems": 1,
               "maxItems": agentfleet_shared::domain::MAX_MCP_TOOL_PICKS,
               "items": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": no_nul()},
               "description": "`mcp`: the server's tools to offer (all when absent)"}),
    );
    replace(
        doc,
        "/components/schemas/AgentSpec/properties/max_parallel_tool_calls",
        json!({"type": ["integer", "null"], "minimum": 1, "maximum": 1024, "description":
            "Tool calls of one response that run at once; `worker.max_parallel_tool_calls` when null, and never more"}),
    );
}

/// The rules of `POST /v1/webhooks` (`webhooks_create::check`) and the deliveries' page.
fn constrain_webhooks(doc: &mut Value, settings: &Settings) {
    let api = &settings.api;
    let p = "/components/schemas/CreateWebhook/properties";
    replace(
        doc,
        &format!("{p}/url"),
        json!({"type": "string", "maxLength": settings.webhooks.max_url_bytes, "pattern": tool_url(),
               "description": "`https://`, or `http://` to an address `egress.allow` lists; no credentials; an address the egress policy refuses is refused"}),
    );
    replace(
        doc,
        &format!("{p}/events"),
        json!({"type": "array", "minItems": 1, "uniqueItems": true,
               "items": {"type": "string", "enum": agentfleet_shared::store::webhooks::EVENTS}}),
    );
    replace(
        doc,
        &format!("{p}/secret"),
        json!({"type": ["string", "null"], "pattern": "^whsec_[A-Za-z0-9+/]{32,88}={0,2}$",
               "description": "`whsec_` and the standard base64 of 24 to 64 bytes; generated when absent"}),
    );
    replace(
        doc,
        &format!("{p}/description"),
        json!({"type": ["string", "null"], "maxLength": crate::routes::webhooks::create::MAX_DESCRIPTION_CHARS,
               "pattern": no_nul()}),
    );
    replace(
        doc,
        "/components/schemas/RotateSecret/properties/secret",
        json!({"type": ["string", "null"], "pattern": "^whsec_[A-Za-z0-9+/]{32,88}={0,2}$",
               "description": "`whsec_` and the standard base64 of 24 to 64 bytes; generated when absent"}),
    );
    let path = "/v1/webhooks/{id}/deliveries";
    parameter(doc, path, "get", "limit")["schema"] = json!({"type": "integer", "minimum": 1,
        "maximum": api.max_page_size,
        "description": format!("Page size, 1 to {} (`api.max_page_size`); {} when absent",
                               api.max_page_size, api.default_page_size)});
    parameter(doc, path, "get", "cursor")["schema"] =
        json!({"type": "string", "pattern": crate::routes::runs::list::CURSOR_PATTERN});
}

/// Every event type (docs/events.md); the match fails to compile when a type is added.
fn event_types() -> Vec<&'static str> {
    use agentfleet_shared::events::EventType as E;
    let all = [
        E::RunQueued,
        E::RunStarted,
        E::IterationStarted,
        E::MessageDelta,
        E::MessageCompleted,
        E::ToolStarted,
        E::ToolCompleted,
        E::InputRequired,
        E::ConfirmationRequired,
        E::RunResumed,
        E::RunRecovered,
        E::RunCompleted,
        E::RunFailed,
        E::RunCancelled,
        E::StreamRebuilt,
        E::ContextCompacted,
    ];
    for e in all {
        match e {
            E::RunQueued
            | E::RunStarted
            | E::IterationStarted
            | E::MessageDelta
            | E::MessageCompleted
            | E::ToolStarted
            | E::ToolCompleted
            | E::InputRequired
            | E::ConfirmationRequired
            | E::RunResumed
            | E::RunRecovered
            | E::RunCompleted
            | E::RunFailed
            | E::RunCancelled
            | E::StreamRebuilt
            | E::ContextCompacted => {}
        }
    }
    all.iter().map(|e| e.as_str()).collect()
}

/// The JSON of every event (docs/events.md).
fn event_envelope_schema() -> Value {
    json!({
        "type": "object",
        "required": ["id", "run_id", "thread_id", "type", "at", "data"],
        "properties": {
            "id": {"type": "integer", "minimum": 1, "description": "Gap-free from 1 within the run"},
            "run_id": {"type": "string", "format": "uuid"},
            "thread_id": {"type": "string", "format": "uuid"},
            "type": {"type": "string", "enum": event_types()},
            "at": {"type": "string", "format": "date-time"},
            "data": {"description": "Per type: see docs/events.md"},
        },
    })
}

/// One Server-Sent Event: `id` as `Last-Event-ID` takes it back, `event` the type, `data` the
/// envelope. (Comments, the `retry` hint and keep-alives carry no data.)
fn sse_event_schema(id_pattern: &str) -> Value {
    json!({
        "type": "object",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {"type": "string", "pattern": id_pattern},
            "event": {"type": "string", "enum": event_types()},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"$ref": "#/components/schemas/EventEnvelope"}},
            "retry": {"type": "integer", "minimum": 0},
        },
    })
}

/// Every `/v1` operation needs the API key; a run's event stream also takes a stream token.
fn secure(doc: &mut Value) {
    let components = doc["components"].as_object_mut().expect("components");
    components.insert(
        "securitySchemes".to_owned(),
        json!({
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "`Authorization: Bearer <api key>` (`agentfleet-api keys create`)"},
            "stream_token": {"type": "apiKey", "in": "query", "name": "token",
                             "description": "From `POST /v1/runs/{id}/stream-token`, for that run's events only"},
            "admin": {"type": "http", "scheme": "bearer",
                      "description": "`Authorization: Bearer <api.admin_token>`; the admin API answers 404 when that is empty"},
        }),
    );
    for_each_operation(doc, |path, method, op| {
        let security = if path.starts_with("/admin/") {
            json!([{"admin": []}])
        } else if !path.starts_with("/v1/") {
            json!([])
        } else if path == "/v1/runs/{id}/events" {
            json!([{"bearer": []}, {"stream_token": []}])
        } else {
            json!([{"bearer": []}])
        };
        let _ = method;
        op.insert("security".to_owned(), security);
        if path == "/v1/runs/{id}/events"
            && let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut)
        {
            // The token is the `stream_token` scheme, not a parameter of its own.
            params.retain(|p| p["name"] != "token");
        }
    });
}

fn for_each_operation(doc: &mut Value, mut f: impl FnMut(&str, &str, &mut Map<String, Value>)) {
    let paths = doc["paths"].as_object_mut().expect("paths");
    for (path, item) in paths.iter_mut() {
        for (method, op) in item.as_object_mut().expect("path item").iter_mut() {
            if let Some(op) = op.as_object_mut() {
                f(path, method, op);
            }
        }
    }
}

/// The errors every operation can answer, beyond those it documents itself.
fn add_error_responses(doc: &mut Value) {
    let error = |description: &str| {
        json!({"description": description, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    };
    for_each_operation(doc, |path, _method, op| {
        let admin = path.starts_with("/admin/");
        if !path.starts_with("/v1/") && !admin {
            return;
        }
        let has_body = op.contains_key("requestBody");
        let has_id = path.contains("{id}");
        let starts_work = matches!(
            op.get("operationId").and_then(Value::as_str),
            Some("create_run" | "create_batch" | "submit_batch" | "resume_run")
        );
        let responses = op
            .entry("responses")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("responses");
        let mut add = |status: &str, description: &str| {
            responses
                .entry(status.to_owned())
                .or_insert_with(|| error(description));
        };
        if has_body {
            add("400", "`malformed_json`: the body is not JSON");
            add(
                "413",
                "`payload_too_large`: the body is over `api.max_body_bytes`",
            );
            add(
                "415",
                "`unsupported_media_type`: the body is not `application/json`",
            );
        }
        add(
            "401",
            "`unauthorized`: no, or no valid, credentials (checked before anything else)",
        );
        if has_id {
            add("404", "Not found");
        } else if admin {
            add(
                "404",
                "The admin API is disabled (`api.admin_token` is empty)",
            );
        }
        if starts_work {
            add(
                "403",
                "`tenant_suspended`: the tenant is suspended (it may read and cancel, not start)",
            );
        }
        add(
            "408",
            "`request_timeout`: no answer within `api.request_timeout_ms`",
        );
        add(
            "422",
            "`invalid_request`: a parameter or field is invalid; the message names it",
        );
        add(
            "500",
            "`internal`: an unexpected failure (the detail is logged)",
        );
        // Any `/v1` request of a tenant with a request rate may be refused (`rate_limit`);
        // the create operations document their own 429 (`too_many_active_runs`) as well.
        let limited = responses.entry("429").or_insert_with(|| {
            error("`rate_limited`: the tenant's request rate (`limits.requests_per_second`) is used up; retry after `Retry-After`")
        });
        let seconds = |description: &str| json!({"description": description, "schema": {"type": "integer", "minimum": 0}});
        limited["headers"] = json!({
            "Retry-After": {"required": true, "description": "Whole seconds to wait (at least 1)",
                "schema": {"type": "integer", "minimum": 1}},
            "RateLimit-Limit": seconds("Requests the tenant's bucket holds (its burst)"),
            "RateLimit-Remaining": seconds("Requests left now"),
            "RateLimit-Reset": seconds("Seconds until the bucket is full again"),
        });
        let mut unavailable = error("`unavailable`: a backing service cannot be reached; retry");
        unavailable["headers"] = json!({"Retry-After": {"required": true,
            "description": "Seconds to wait", "schema": {"type": "integer", "minimum": 0}}});
        responses.entry("503").or_insert(unavailable);
    });
}

/// How answers lead to other operations (for clients, and for stateful testing).
fn add_links(doc: &mut Value) {
    let run_links = json!({
        "GetRun": {"operationId": "get_run", "parameters": {"id": "$response.body#/id"}},
        "CancelRun": {"operationId": "cancel_run", "parameters": {"id": "$response.body#/id"}},
        "ResumeRun": {"operationId": "resume_run", "parameters": {"id": "$response.body#/id"}},
        "RunEvents": {"operationId": "run_events", "parameters": {"id": "$response.body#/id"}},
        "IssueStreamToken": {"operationId": "issue_stream_token", "parameters": {"id": "$response.body#/id"}},
        "ListMessages": {"operationId": "list_messages", "parameters": {"id": "$response.body#/thread_id"}},
    });
    for (path, method, status) in [
        ("/v1/runs", "post", "202"),
        ("/v1/runs/{id}", "get", "200"),
        ("/v1/runs/{id}/cancel", "post", "200"),
    ] {
        doc["paths"][path][method]["responses"][status]["links"] = run_links.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::load_with(
            None,
            [
                (
                    "models.mock.base_url".to_owned(),
                    "http://127.0.0.1:1/v1".to_owned(),
                ),
                ("models.mock.model".to_owned(), "m".to_owned()),
            ],
            false,
        )
        .unwrap()
    }

    #[test]
    fn the_document_builds_and_every_operation_is_complete() {
        let doc = document(&settings());
        assert_eq!(doc["openapi"], "3.1.0");
        let mut operations = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                operations += 1;
                let responses = op["responses"].as_object().unwrap();
                for (status, r) in responses {
                    let content = r["content"].as_object();
                    assert!(
                        content.is_some_and(|c| c.values().all(|m| m["schema"].is_object())),
                        "{method} {path} {status} has a schema"
                    );
                }
                if path.starts_with("/v1/") || path.starts_with("/admin/") {
                    for s in ["401", "408", "422", "500", "503"] {
                        assert!(responses.contains_key(s), "{method} {path} documents {s}");
                    }
                    assert!(!op["security"].as_array().unwrap().is_empty());
                }
                if path.contains("{id}") {
                    let id = op["parameters"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|p| p["name"] == "id")
                        .unwrap();
                    assert_eq!(id["schema"]["format"], "uuid", "{method} {path}");
                    assert!(responses.contains_key("404"));
                }
            }
        }
        assert_eq!(
            operations, 32,
            "the admin API is absent without api.admin_token"
        );
        let mut with_admin = settings();
        with_admin.api.admin_token = "0123456789abcdef".into();
        let doc = document(&with_admin);
        let admin: Vec<_> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(p, _)| p.starts_with("/admin/"))
            .flat_map(|(_, item)| item.as_object().unwrap().values())
            .collect();
        assert_eq!(admin.len(), 11);
        for op in admin {
            assert_eq!(op["security"], json!([{"admin": []}]));
            for s in ["401", "404", "422", "500"] {
                assert!(op["responses"].get(s).is_some(), "{op} documents {s}");
            }
        }
        assert_eq!(
            doc["components"]["schemas"]["AgentSpec"]["properties"]["model"]["enum"],
            json!(["mock"])
        );
    }

    #[test]
    fn the_patterns_say_what_the_server_checks() {
        let user = regex_lite(&user_text());
        assert!(user("hi"));
        assert!(!user(" \t\u{3000}"));
        assert!(!user("a\u{0}"));
        assert!(user("\u{feff}"), "not white space for str::trim either");
        let url = regex_lite(&tool_url());
        for ok in [
            "http://tools.example/add",
            "HTTPS://Tools.Example:8443/a?b#c",
            "http://127.0.0.1:9000/t",
            "http://a-b.c-d.example",
        ] {
            assert!(url(ok), "{ok}");
            assert!(
                agentfleet_shared::domain::check_tool_url(ok).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "http://",
            "http://a.0/",
            "http://256.1.1.1/",
            "http://u:p@h/",
            "http://h/a b",
            "http://h:65536/",
            "ftp://h/",
        ] {
            assert!(!url(bad), "{bad}");
            assert!(
                agentfleet_shared::domain::check_tool_url(bad).is_err(),
                "{bad}"
            );
        }
    }

    /// Matches as JSON Schema validators do (ECMA-262 patterns), through `jsonschema`.
    fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool + use<> {
        let validator =
            jsonschema::validator_for(&json!({"type": "string", "pattern": pattern})).unwrap();
        move |s| validator.is_valid(&json!(s))
    }
}
