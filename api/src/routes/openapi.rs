//! `GET /openapi.json`: the API's OpenAPI 3.1 document, exact enough to generate valid and
//! invalid requests from (scripts/fuzz does, with schemathesis).
//!
//! The shapes and their rules come from the types (utoipa derives, `#[schema(...)]` on their
//! fields, `crate::schema` and `agentfleet_shared::domain::schema` for those several share);
//! then [`this_deployment`] writes in what configuration decides (the models, the page, batch
//! and input sizes, ...), so the served document is that of this deployment. Every pattern is
//! the rule the server applies (see `crate::validate`, `check_tool_url`; the tests hold them
//! together), and the error statuses each operation can answer are listed with the error
//! schema.

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use agentfleet_shared::config::Settings;
use agentfleet_shared::domain::schema::{self, JsonObject, JsonValue};
use agentfleet_shared::domain::{AgentSpec, Risk, RunStatus, ToolKind, ToolSpec};
use agentfleet_shared::egress::EgressPolicy;

use super::view;
use crate::routes::runs::create::CreateRun;
use crate::routes::runs::resume::{DecisionBody, ResumeBody};
use crate::state::AppState;

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
        crate::routes::runs::counts::count_runs,
        crate::routes::runs::get::get_run,
        crate::routes::runs::events::run_events,
        crate::routes::runs::resume::resume_run,
        crate::routes::runs::cancel::cancel_run,
        crate::routes::runs::tasks::list_tasks,
        crate::routes::runs::stream_token::issue_stream_token,
        crate::routes::threads::messages::list_messages,
        crate::routes::threads::events::thread_events,
        super::usage::get_usage,
        super::export::export,
        crate::routes::batches::create::submit_batch,
        crate::routes::batches::list::list_batches,
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
        crate::routes::admin::tenants::create::create_tenant,
        crate::routes::admin::tenants::list::list_tenants,
        crate::routes::admin::tenants::get::get_tenant,
        crate::routes::admin::tenants::suspend::suspend_tenant,
        crate::routes::admin::tenants::resume::resume_tenant,
        crate::routes::admin::tenants::limits::update_limits,
        crate::routes::admin::tenants::retention::update_retention,
        crate::routes::admin::tenants::erase::erase_tenant,
        crate::routes::admin::tenants::erasure::get_erasure,
        crate::routes::admin::keys::create::create_key,
        crate::routes::admin::keys::list::list_keys,
        crate::routes::admin::keys::get::get_key,
        crate::routes::admin::keys::revoke::revoke_key,
        crate::routes::admin::keys::rotate::rotate_key,
    ),
    components(schemas(
        JsonValue,
        JsonObject,
        super::sse::EventEnvelope,
        CreateRun,
        crate::routes::runs::batch::CreateBatch,
        crate::routes::batches::create::SubmitBatch,
        crate::routes::batches::create::BatchItem,
        crate::routes::batches::results::ResultsFilter,
        ResumeBody,
        DecisionBody,
        AgentSpec,
        agentfleet_shared::domain::AgentMode,
        agentfleet_shared::domain::PlanSpec,
        ToolSpec,
        ToolKind,
        Risk,
        RunStatus,
        agentfleet_shared::store::double_text::IfBusy,
        view::Run,
        view::TaskPlace,
        view::PlanView,
        view::PlanRound,
        view::Task,
        view::TaskList,
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
        crate::routes::admin::tenants::create::CreateTenant,
        crate::routes::admin::tenants::view::TenantView,
        crate::routes::admin::tenants::create::TenantCreated,
        crate::routes::admin::tenants::list::TenantPage,
        crate::routes::admin::keys::create::CreateKey,
        crate::routes::admin::keys::rotate::RotateKey,
        crate::routes::admin::keys::list::KeyList,
        agentfleet_shared::store::tenants::TenantInfo,
        agentfleet_shared::store::erasure::Erasure,
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
    plan_needs_its_mode(&mut doc);
    this_deployment(&mut doc, settings);
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

/// `agent.plan` only with `mode: plan_and_solve`: a rule between two properties, which the
/// derived schema cannot state (`if`/`then` on the object).
fn plan_needs_its_mode(doc: &mut Value) {
    let pointer = "/components/schemas/AgentSpec";
    set(
        doc,
        pointer,
        "if",
        json!({"required": ["plan"], "properties": {"plan": {"type": "object"}}}),
    );
    set(
        doc,
        pointer,
        "then",
        json!({"required": ["mode"], "properties": {"mode": {"const": "plan_and_solve"}}}),
    );
}

/// What this deployment's configuration decides, which no type can say: the models
/// (`models.<name>`), the limits an operator sets (the page, batch and tool-list sizes, the
/// token budget, the MCP header limits, the webhook URL's length; the input's bytes, in words:
/// a character is one byte or more), and what the egress policy leaves a URL's literal host and
/// a webhook's scheme (`egress.allow`; plain `http://` only to what it lists). Every other
/// rule is on the types (`#[schema(...)]`), the same for every deployment.
fn this_deployment(doc: &mut Value, settings: &Settings) {
    let (api, mcp, webhooks) = (&settings.api, &settings.mcp, &settings.webhooks);
    let mut field = |pointer: &str, key: &str, value: Value| {
        set(doc, &format!("/components/schemas/{pointer}"), key, value);
    };
    let models: Vec<&String> = settings.models.keys().collect();
    field("AgentSpec/properties/model", "enum", json!(models));
    field(
        "AgentSpec/properties/tools",
        "maxItems",
        json!(api.max_tools_per_agent),
    );
    field(
        "AgentSpec/properties/max_tokens_total",
        "maximum",
        json!(api.max_tokens_total),
    );
    for (property, cap) in [
        ("max_rounds", api.max_plan_rounds),
        ("max_tasks", api.max_plan_tasks),
        ("max_parallel", api.max_plan_parallel),
    ] {
        field(
            &format!("PlanSpec/properties/{property}"),
            "maximum",
            json!(cap),
        );
    }
    field(
        "SubmitBatch/properties/runs",
        "maxItems",
        json!(api.max_batch_items),
    );
    field(
        "CreateBatch/properties/runs",
        "maxItems",
        json!(api.max_batch_runs),
    );
    // Without `mcp.encryption_key` no header can be stored: none is accepted.
    let headers = if mcp.encryption_key.is_empty() {
        0
    } else {
        mcp.max_headers
    };
    field(
        "CreateMcpServer/properties/headers",
        "maxItems",
        json!(headers),
    );
    field(
        "HeaderBody/properties/value",
        "maxLength",
        json!(mcp.max_header_value_bytes),
    );
    field(
        "CreateWebhook/properties/url",
        "maxLength",
        json!(webhooks.max_url_bytes),
    );
    let bytes = format!(
        "at most {} bytes of UTF-8 (`api.max_input_bytes`)",
        api.max_input_bytes
    );
    for (pointer, what) in [
        (
            "CreateRun/properties/input",
            "The user message: not blank, no NUL",
        ),
        (
            "BatchItem/properties/input",
            "The user message: not blank, no NUL",
        ),
        (
            "ResumeBody/properties/input",
            "Answers a question: not blank, no NUL",
        ),
        ("DecisionBody/properties/reason", "Why: no NUL"),
    ] {
        field(pointer, "description", json!(format!("{what}, {bytes}")));
    }
    // By default only public addresses: a literal IPv4 host is one of them (names are judged
    // when they resolve, and what an allowlist opens depends on ports: left to the server).
    let policy = settings.egress_policy();
    if policy == EgressPolicy::default() {
        let ipv4 = agentfleet_shared::egress::public_ipv4_pattern();
        for (pointer, schemes) in [
            ("ToolSpec/properties/url", schema::HTTP_OR_HTTPS),
            ("CreateMcpServer/properties/url", schema::HTTP_OR_HTTPS),
            ("CreateWebhook/properties/url", "[Hh][Tt][Tt][Pp][Ss]"),
        ] {
            field(
                pointer,
                "pattern",
                json!(schema::tool_url_pattern(schemes, &ipv4)),
            );
        }
    }
    let page = |default: u32| {
        json!({"type": "integer", "minimum": 1, "maximum": api.max_page_size,
               "description": format!("Page size, 1 to {} (`api.max_page_size`); {default} when absent",
                                      api.max_page_size)})
    };
    for path in [
        "/v1/runs",
        "/v1/threads/{id}/messages",
        "/v1/batches",
        "/v1/webhooks/{id}/deliveries",
        "/admin/v1/tenants",
    ] {
        parameter(doc, path, "get", "limit")["schema"] = page(api.default_page_size);
    }
}

/// Sets `key` of the object at `pointer` (which must exist: the tests read the whole
/// document, so a renamed field fails there, not in production).
fn set(doc: &mut Value, pointer: &str, key: &str, value: Value) {
    match doc.pointer_mut(pointer).and_then(Value::as_object_mut) {
        Some(object) => {
            object.insert(key.to_owned(), value);
        }
        None => panic!("openapi: no object at {pointer}"),
    }
}

/// The parameter `name` of an operation, whose schema this deployment bounds.
fn parameter<'a>(doc: &'a mut Value, path: &str, method: &str, name: &str) -> &'a mut Value {
    doc["paths"][path][method]["parameters"]
        .as_array_mut()
        .and_then(|ps| ps.iter_mut().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("openapi: no parameter {name} of {method} {path}"))
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
                      "description": "`Authorization: Bearer <api.admin_token>`, on the admin listener (`api.admin_listen`); the admin API answers 404 when the token is empty"},
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
        if admin {
            add(
                "429",
                "`too_many_attempts`: this address failed `api.admin_max_failures` times within \
                 `api.admin_failure_window_ms`; `Retry-After` says when to try again",
            );
        }
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
            error("`rate_limited`: the tenant's request rate (`limits.requests_per_second`) is used up; or `too_many_attempts`: this address presented `api.auth_max_failures` unknown API keys within `api.auth_failure_window_ms`; retry after `Retry-After`")
        });
        let seconds = |description: &str| json!({"description": description, "schema": {"type": "integer", "minimum": 0}});
        limited["headers"] = json!({
            "Retry-After": {"required": true, "description": "Whole seconds to wait (at least 1)",
                "schema": {"type": "integer", "minimum": 1}},
            "RateLimit-Limit": seconds("Requests the tenant's bucket holds (its burst)"),
            "RateLimit-Remaining": seconds("Requests left now"),
            "RateLimit-Reset": seconds("Seconds until the bucket is full again"),
        });
        let mut unavailable = error(
            "`unavailable`: a backing service cannot be reached; or `overloaded`: this API process holds as many request bodies as `api.body_budget_bytes` allows (nothing was read); retry after `Retry-After`",
        );
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
mod tests;
