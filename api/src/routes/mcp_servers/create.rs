//! `POST /v1/mcp-servers`: registers an MCP server, for the tenant's agents' `mcp` tools to name
//! (`{"kind": "mcp", "server": "<name>"}`). Header values (auth tokens) are write-only: sealed
//! at rest under `mcp.encryption_key`, never answered; only their names are. The URL is held
//! to the egress policy as tool URLs are: an address the policy refuses is refused here when
//! written literally, and host names are judged again when the worker resolves them. A server
//! with headers must be `https://` unless its address is one `egress.allow` lists: the headers
//! are credentials, and plain `http://` would carry them in clear across networks.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::ToSchema;

use agentfleet_shared::domain::{check_mcp_server_name, check_tool_url};
use agentfleet_shared::store::mcp_servers::{self, CreateMcpServerError, McpServer, NewMcpServer};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Longest description, in characters (as `mcp_servers.description` checks).
pub const MAX_DESCRIPTION_CHARS: usize = 1000;
/// Longest header name.
pub const MAX_HEADER_NAME_BYTES: usize = 128;
/// Headers the MCP transport sets itself; a registration may not override them.
pub const RESERVED_HEADERS: [&str; 8] = [
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "transfer-encoding",
];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateMcpServer {
    /// How agents name it: 1-64 characters of `[A-Za-z0-9_-]`, unique within the tenant.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    /// The server's streamable-HTTP endpoint: absolute `http(s)://`, no credentials.
    #[schema(schema_with = server_url)]
    pub url: String,
    /// Free text, at most 1000 characters.
    #[serde(default)]
    #[schema(max_length = 1000, pattern = "^[^\u{0}]*$")]
    pub description: Option<String>,
    /// Sent with every request to the server (e.g. `Authorization`), at most `mcp.max_headers`,
    /// their names distinct in any case. Write-only: stored sealed, answered as names only.
    /// Needs `mcp.encryption_key`.
    #[serde(default)]
    pub headers: Option<Vec<HeaderBody>>,
}

fn server_url() -> utoipa::openapi::schema::ObjectBuilder {
    agentfleet_shared::domain::schema::tool_url(
        agentfleet_shared::domain::MAX_TOOL_URL_BYTES,
        "The streamable-HTTP endpoint; an address the egress policy refuses is refused",
    )
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderBody {
    /// An HTTP header name (1-128 token characters), not one the MCP transport sets itself
    /// ([`RESERVED_HEADERS`], in any case).
    #[schema(schema_with = header_name)]
    pub name: String,
    /// Visible ASCII, spaces and tabs; at most `mcp.max_header_value_bytes`.
    #[schema(pattern = "^[\t -~]*$")]
    pub value: String,
}

/// A token (RFC 9110) of at most [`MAX_HEADER_NAME_BYTES`], not a reserved name in any case.
fn header_name() -> utoipa::openapi::schema::ObjectBuilder {
    let any_case = |name: &str| -> String {
        name.chars()
            .map(|c| match c.is_ascii_alphabetic() {
                true => format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase()),
                false => regex_escape(c),
            })
            .collect()
    };
    let reserved: Vec<String> = RESERVED_HEADERS.iter().map(|h| any_case(h)).collect();
    agentfleet_shared::domain::schema::keyword(
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(format!(
                "^[A-Za-z0-9!#$%&'*+.^_`|~-]{{1,{MAX_HEADER_NAME_BYTES}}}$"
            ))),
        "not",
        serde_json::json!({"pattern": format!("^({})$", reserved.join("|"))}),
    )
}

/// `-` is the only character of a reserved name that is not a letter; escaped anyway.
fn regex_escape(c: char) -> String {
    match c.is_ascii_alphanumeric() {
        true => c.to_string(),
        false => format!("\\{c}"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum McpServerError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("the tenant has {0} MCP servers, the most allowed")]
    TooMany(i64),
    #[error("an MCP server named `{0}` exists")]
    Duplicate(String),
    #[error("MCP server not found")]
    NotFound,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<McpServerError> for ApiError {
    fn from(e: McpServerError) -> ApiError {
        match e {
            McpServerError::Invalid { field, message } => ApiError::invalid(&field, message),
            McpServerError::TooMany(max) => ApiError::new(
                StatusCode::CONFLICT,
                "too_many_mcp_servers",
                format!(
                    "name: the tenant has {max} MCP servers, the most allowed \
                     (mcp.max_servers_per_tenant); delete one first"
                ),
            ),
            McpServerError::Duplicate(name) => ApiError::new(
                StatusCode::CONFLICT,
                "mcp_server_exists",
                format!("name: the tenant has an MCP server named `{name}` already"),
            ),
            McpServerError::NotFound => ApiError::not_found("MCP server"),
            McpServerError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> McpServerError {
    McpServerError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Every rule of a registration; errors name the field.
pub fn check(state: &AppState, body: &CreateMcpServer) -> Result<(), McpServerError> {
    let mcp = &state.settings.mcp;
    check_mcp_server_name(&body.name).map_err(|m| invalid("name", m))?;
    let url = check_tool_url(&body.url).map_err(|m| invalid("url", m))?;
    let policy = state.settings.egress_policy();
    if policy.refuses_literal(&body.url) {
        return Err(invalid(
            "url",
            "this address is not allowed by the deployment's egress policy",
        ));
    }
    if let Some(d) = &body.description
        && d.chars().count() > MAX_DESCRIPTION_CHARS
    {
        return Err(invalid(
            "description",
            format!("longer than {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    let headers = body.headers.as_deref().unwrap_or_default();
    if headers.is_empty() {
        return Ok(());
    }
    if state.mcp_key.is_none() {
        return Err(invalid(
            "headers",
            "this deployment stores no MCP server headers (mcp.encryption_key is not configured)",
        ));
    }
    if url.scheme() != "https" && !policy.lists(&url) {
        return Err(invalid(
            "url",
            "a server with headers must be https:// (plain http:// only to an address \
             egress.allow lists): the headers would cross the network in clear text",
        ));
    }
    if headers.len() > mcp.max_headers {
        return Err(invalid(
            "headers",
            format!("more than {} headers (mcp.max_headers)", mcp.max_headers),
        ));
    }
    for (i, h) in headers.iter().enumerate() {
        let token = !h.name.is_empty()
            && h.name.len() <= MAX_HEADER_NAME_BYTES
            && h.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(invalid(
                format!("headers[{i}].name"),
                format!("must be an HTTP header name (1-{MAX_HEADER_NAME_BYTES} token characters)"),
            ));
        }
        let lower = h.name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(invalid(
                format!("headers[{i}].name"),
                "is set by the MCP transport itself",
            ));
        }
        if headers[..i]
            .iter()
            .any(|o| o.name.eq_ignore_ascii_case(&h.name))
        {
            return Err(invalid(format!("headers[{i}].name"), "named twice"));
        }
        // Visible ASCII, spaces and tabs: what every HTTP stack sends as it is.
        if h.value.len() > mcp.max_header_value_bytes.get()
            || !h
                .value
                .bytes()
                .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return Err(invalid(
                format!("headers[{i}].value"),
                format!(
                    "must be at most {} characters of visible ASCII, spaces and tabs \
                     (mcp.max_header_value_bytes)",
                    mcp.max_header_value_bytes
                ),
            ));
        }
    }
    Ok(())
}

#[utoipa::path(post, path = "/v1/mcp-servers", tag = "mcp", operation_id = "create_mcp_server",
    request_body = CreateMcpServer,
    responses((status = 201, description = "Registered; header values are never answered", body = McpServer),
              (status = 409, description = "`mcp_server_exists`, or `too_many_mcp_servers` (`mcp.max_servers_per_tenant`)", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming the field (`name`, `url`, `headers[i].name`, …)", body = crate::routes::view::ErrorBody)))]
pub async fn create_mcp_server(
    State(state): State<AppState>,
    Caller(caller): Caller,
    JsonBody(body): JsonBody<CreateMcpServer>,
) -> Result<(StatusCode, Json<McpServer>), ApiError> {
    check(&state, &body)?;
    let new = NewMcpServer {
        tenant_id: caller.tenant_id,
        name: body.name,
        url: body.url,
        description: body.description.unwrap_or_default(),
        headers: body
            .headers
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.name, h.value))
            .collect(),
    };
    let max = state.settings.mcp.max_servers_per_tenant;
    match mcp_servers::create(&state.pool, new, state.mcp_key.as_ref(), max).await {
        Ok(server) => Ok((StatusCode::CREATED, Json(server))),
        Err(CreateMcpServerError::TooMany(n)) => Err(McpServerError::TooMany(n).into()),
        Err(CreateMcpServerError::Duplicate(n)) => Err(McpServerError::Duplicate(n).into()),
        // `check` refused headers without a key already.
        Err(CreateMcpServerError::NoKey) => Err(invalid(
            "headers",
            "this deployment stores no MCP server headers (mcp.encryption_key is not configured)",
        )
        .into()),
        Err(CreateMcpServerError::Store(e)) => Err(McpServerError::Unexpected(e.into()).into()),
    }
}
