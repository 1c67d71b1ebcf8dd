//! MCP tools over streamable HTTP, with the official SDK (`rmcp`). The transport runs on the
//! worker's egress-held reqwest client (`tools_http`: resolved addresses checked, no
//! redirects, connect timeout), with rmcp's own bounded reads (`max_json_response_size`,
//! `max_sse_event_size`). Each listing and each call opens a session, does its one request
//! and closes it: no connection outlives the step that needed it.
//!
//! A server's tools are listed once per TTL (`mcp.tools_ttl_ms`) per tenant, URL and headers
//! ([`ToolCache`]); a listing is bounded in tool count and schema size.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, MetaObject, PaginatedRequestParams, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::NeverRetry;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use agentfleet_shared::egress::{DENIED_MESSAGE, EgressDenied, EgressPolicy};

use super::http::{HttpOutcome, answer_outcome, error_outcome, truncated_outcome};

/// A server as the worker reaches it.
#[derive(Debug, Clone)]
pub struct Server {
    /// Whose server it is: the tool cache's share.
    pub tenant: Uuid,
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// Tenant, URL and a hash of the headers: the tool cache's key.
    pub key: String,
}

impl Server {
    pub fn new(tenant: Uuid, url: String, headers: Vec<(String, String)>) -> Server {
        let mut hash = Sha256::new();
        for (n, v) in &headers {
            hash.update(n.to_ascii_lowercase().as_bytes());
            hash.update([0]);
            hash.update(v.as_bytes());
            hash.update([0]);
        }
        let key = format!("{tenant}|{url}|{}", hex::encode(hash.finalize()));
        Server {
            tenant,
            url,
            headers,
            key,
        }
    }
}

/// One tool a server offers.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    pub name: String,
    pub description: String,
    pub schema: Value,
}

/// Why a server could not be used; the text is tenant-visible and reveals nothing internal.
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    #[error("{DENIED_MESSAGE}")]
    Denied,
    #[error("the MCP server's URL is not valid")]
    BadUrl,
    #[error("the MCP server could not be reached")]
    Unreachable,
    #[error("the MCP server did not answer within {0} ms")]
    Timeout(u128),
    #[error("the MCP server offers more than {0} tools")]
    TooManyTools(usize),
    #[error("the MCP server's tool list is larger than {0} bytes")]
    ListTooLarge(usize),
    #[error("the MCP server's tool list runs over more than {0} pages")]
    TooManyPages(usize),
    #[error("the MCP server's tool `{tool}` has an input schema larger than {limit} bytes")]
    SchemaTooLarge { tool: String, limit: usize },
    #[error("a header of the MCP server is not a valid HTTP header")]
    BadHeader,
}

/// The limits of one listing or call.
pub struct Limits {
    pub timeout: Duration,
    pub max_response_bytes: usize,
}

/// Tool lists by server key, reused until they are `ttl` old, shared per tenant so that no
/// tenant's listings can flush the others': a tenant holds at most `per_tenant` entries (its
/// own oldest goes to make room for its next), and when the whole cache is full
/// (`max_entries`), the expired go, else the oldest entry of the tenant holding the most.
pub struct ToolCache {
    ttl: Duration,
    max_entries: usize,
    per_tenant: usize,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_key: HashMap<String, Listed>,
    per_tenant: HashMap<Uuid, usize>,
}

/// A server's tools, whose tenant they are, and when they were listed.
struct Listed {
    tenant: Uuid,
    at: Instant,
    tools: Arc<Vec<RemoteTool>>,
}

impl Entries {
    fn remove(&mut self, key: &str) {
        if let Some(gone) = self.by_key.remove(key)
            && let Some(n) = self.per_tenant.get_mut(&gone.tenant)
        {
            *n -= 1;
            if *n == 0 {
                self.per_tenant.remove(&gone.tenant);
            }
        }
    }

    /// The key of `tenant`'s oldest entry.
    fn oldest_of(&self, tenant: Uuid) -> Option<String> {
        self.by_key
            .iter()
            .filter(|(_, l)| l.tenant == tenant)
            .min_by_key(|(_, l)| l.at)
            .map(|(k, _)| k.clone())
    }
}

impl ToolCache {
    pub fn new(ttl: Duration, max_entries: usize, per_tenant: usize) -> ToolCache {
        ToolCache {
            ttl,
            max_entries: max_entries.max(1),
            per_tenant: per_tenant.max(1),
            entries: Mutex::default(),
        }
    }

    fn get(&self, key: &str) -> Option<Arc<Vec<RemoteTool>>> {
        let entries = self.entries.lock().expect("mcp cache lock");
        entries
            .by_key
            .get(key)
            .filter(|l| l.at.elapsed() < self.ttl)
            .map(|l| l.tools.clone())
    }

    fn put(&self, tenant: Uuid, key: String, tools: Arc<Vec<RemoteTool>>) {
        let mut entries = self.entries.lock().expect("mcp cache lock");
        entries.remove(&key);
        if entries.per_tenant.get(&tenant).copied().unwrap_or(0) >= self.per_tenant
            && let Some(oldest) = entries.oldest_of(tenant)
        {
            entries.remove(&oldest);
        }
        if entries.by_key.len() >= self.max_entries {
            let ttl = self.ttl;
            let expired: Vec<String> = entries
                .by_key
                .iter()
                .filter(|(_, l)| l.at.elapsed() >= ttl)
                .map(|(k, _)| k.clone())
                .collect();
            for key in expired {
                entries.remove(&key);
            }
        }
        if entries.by_key.len() >= self.max_entries {
            let largest = entries
                .per_tenant
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(t, _)| *t);
            if let Some(oldest) = largest.and_then(|t| entries.oldest_of(t)) {
                entries.remove(&oldest);
            }
        }
        *entries.per_tenant.entry(tenant).or_insert(0) += 1;
        entries.by_key.insert(
            key,
            Listed {
                tenant,
                at: Instant::now(),
                tools,
            },
        );
    }
}

/// The server's tools, from the cache or listed now.
pub async fn tools(
    http: &reqwest::Client,
    policy: &EgressPolicy,
    cache: &ToolCache,
    server: &Server,
    limits: &Limits,
    max_tools: usize,
    max_schema_bytes: usize,
) -> Result<Arc<Vec<RemoteTool>>, McpError> {
    if let Some(hit) = cache.get(&server.key) {
        metrics::counter!("agentfleet_mcp_tool_lists_total", "source" => "cache").increment(1);
        return Ok(hit);
    }
    let tools = tokio::time::timeout(limits.timeout, async {
        let client = connect(http, policy, server, limits.max_response_bytes).await?;
        let listed = list_bounded(
            &client,
            max_tools,
            max_schema_bytes,
            limits.max_response_bytes,
        )
        .await;
        close(client);
        listed
    })
    .await
    .map_err(|_| McpError::Timeout(limits.timeout.as_millis()))??;
    metrics::counter!("agentfleet_mcp_tool_lists_total", "source" => "server").increment(1);
    let tools = Arc::new(tools);
    cache.put(server.tenant, server.key.clone(), tools.clone());
    Ok(tools)
}

/// Pages a listing may run over: a server that always answers with a further cursor fails
/// here, not at the listing's time limit (each page is a request).
pub const MAX_LIST_PAGES: usize = 64;

/// The server's tools, page by page, failing as soon as the list passes a bound: more than
/// `max_tools` tools, a schema over `max_schema_bytes`, more than `max_list_bytes` of names,
/// descriptions and schemas in all (one response is held to that size by the transport; the
/// whole list, over every page, is held to it here), more than [`MAX_LIST_PAGES`] pages.
/// rmcp's `list_all_tools` gathers every page first, with no bound on their number.
async fn list_bounded(
    client: &RunningService<RoleClient, ()>,
    max_tools: usize,
    max_schema_bytes: usize,
    max_list_bytes: usize,
) -> Result<Vec<RemoteTool>, McpError> {
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let params = PaginatedRequestParams::default().with_cursor(cursor);
        let page = client
            .list_tools(Some(params))
            .await
            .map_err(|e| classify(&e))?;
        if tools.len() + page.tools.len() > max_tools {
            return Err(McpError::TooManyTools(max_tools));
        }
        for tool in page.tools {
            let schema = Value::Object((*tool.input_schema).clone());
            let schema_bytes = schema.to_string().len();
            if schema_bytes > max_schema_bytes {
                return Err(McpError::SchemaTooLarge {
                    tool: tool.name.chars().take(128).collect(),
                    limit: max_schema_bytes,
                });
            }
            let description = tool.description.map(|d| d.into_owned()).unwrap_or_default();
            bytes = bytes
                .saturating_add(tool.name.len())
                .saturating_add(description.len())
                .saturating_add(schema_bytes);
            if bytes > max_list_bytes {
                return Err(McpError::ListTooLarge(max_list_bytes));
            }
            tools.push(RemoteTool {
                name: tool.name.into_owned(),
                description,
                schema,
            });
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(McpError::TooManyPages(MAX_LIST_PAGES))
}

/// Calls `tool` with the run's idempotency metadata in `_meta`: `idempotency_key` is
/// `<run_id>:<tool_call_id>`, as the `Idempotency-Key` header of http tools, so a call
/// dispatched again after a crash can be deduplicated by the server.
#[allow(clippy::too_many_arguments)]
pub async fn call(
    http: &reqwest::Client,
    policy: &EgressPolicy,
    server: &Server,
    tool: &str,
    run_id: Uuid,
    tool_call_id: &str,
    arguments: &Value,
    timeout: Duration,
    max_result_bytes: usize,
) -> HttpOutcome {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = arguments.as_object().cloned();
    let meta = json!({
        "idempotency_key": format!("{run_id}:{tool_call_id}"),
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "deadline_ms": timeout.as_millis() as u64,
    });
    let Value::Object(meta) = meta else {
        unreachable!("a JSON object literal")
    };
    params.meta = Some(RequestMetaObject(MetaObject(meta)));
    // JSON escaping can double a text's size; past this the answer fails instead of being cut.
    let max_response = max_result_bytes.saturating_mul(4).saturating_add(65_536);
    let outcome = tokio::time::timeout(timeout, async {
        let client = connect(http, policy, server, max_response).await?;
        let result = client.call_tool(params).await.map_err(|e| classify(&e));
        close(client);
        result
    })
    .await;
    let result = match outcome {
        Err(_) => McpError::Timeout(timeout.as_millis()).to_string(),
        Ok(Err(e)) => {
            if matches!(e, McpError::Unreachable) {
                tracing::info!(%run_id, tool_call_id, "MCP server unreachable");
            }
            e.to_string()
        }
        Ok(Ok(result)) => return settle_result(result, max_result_bytes),
    };
    error_outcome(result)
}

/// Text content concatenated (else the structured content), bounded like an http tool's
/// answer; `isError` makes it an error result.
fn settle_result(result: rmcp::model::CallToolResult, cap: usize) -> HttpOutcome {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    let text = if texts.is_empty() {
        result
            .structured_content
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
    } else {
        texts.join("\n")
    };
    let text = agentfleet_shared::sanitize::strip_nul(&text).into_owned();
    if result.is_error == Some(true) {
        let mut end = text.len().min(2048);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return error_outcome(format!("the MCP tool failed: {}", &text[..end]));
    }
    if text.len() > cap {
        let mut end = cap;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return truncated_outcome(&text[..end], cap);
    }
    answer_outcome(text)
}

/// Opens a session: the URL is judged by the policy first (a host name is resolved and
/// judged too, for a clear refusal; the client's resolver judges it again at connect time).
async fn connect(
    http: &reqwest::Client,
    policy: &EgressPolicy,
    server: &Server,
    max_response_bytes: usize,
) -> Result<RunningService<RoleClient, ()>, McpError> {
    let url = Url::parse(&server.url).map_err(|_| McpError::BadUrl)?;
    precheck(policy, &url).await?;
    let mut headers = HashMap::new();
    // The W3C context of the current span (the tool call's, or the listing's), as http tools
    // send it; a header the tenant registered under the same name is left as it is.
    let trace = agentfleet_shared::telemetry::current_trace_headers();
    let registered = server.headers.iter().map(|(n, v)| (n.clone(), v.clone()));
    for (name, value) in trace.into_iter().chain(registered) {
        let name = HeaderName::try_from(name.as_str()).map_err(|_| McpError::BadHeader)?;
        let value = HeaderValue::try_from(value.as_str()).map_err(|_| McpError::BadHeader)?;
        headers.insert(name, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(server.url.as_str());
    config.custom_headers = headers;
    config.retry_config = Arc::new(NeverRetry::default());
    config.reinit_on_expired_session = false;
    config.max_json_response_size = max_response_bytes;
    config.max_sse_event_size = max_response_bytes;
    config.max_error_response_size = 4096;
    let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
    ().serve(transport).await.map_err(|e| {
        if denied(&e) {
            McpError::Denied
        } else {
            tracing::info!(error = %agentfleet_shared::report::error_line(&e), "MCP initialize failed");
            McpError::Unreachable
        }
    })
}

async fn precheck(policy: &EgressPolicy, url: &Url) -> Result<(), McpError> {
    if policy.check_url(url).is_err() {
        metrics::counter!("agentfleet_egress_denied_total", "stage" => "url").increment(1);
        return Err(McpError::Denied);
    }
    let Some(url::Host::Domain(host)) = url.host() else {
        return Ok(());
    };
    if policy.trusts_name(host) {
        return Ok(());
    }
    let port = url.port_or_known_default().unwrap_or(80);
    let Ok(resolved) = tokio::net::lookup_host((host, port)).await else {
        return Err(McpError::Unreachable);
    };
    let resolved: Vec<_> = resolved.collect();
    if !resolved.is_empty() && !resolved.iter().any(|a| policy.allows_resolved(a.ip())) {
        metrics::counter!("agentfleet_egress_denied_total", "stage" => "resolve").increment(1);
        return Err(McpError::Denied);
    }
    Ok(())
}

fn classify(e: &rmcp::ServiceError) -> McpError {
    if denied(e) {
        return McpError::Denied;
    }
    match e {
        rmcp::ServiceError::Timeout { timeout } => McpError::Timeout(timeout.as_millis()),
        _ => {
            tracing::info!(error = %agentfleet_shared::report::error_line(e), "MCP request failed");
            McpError::Unreachable
        }
    }
}

fn denied(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = source {
        if e.is::<EgressDenied>() {
            return true;
        }
        if let Some(r) = e.downcast_ref::<reqwest::Error>()
            && agentfleet_shared::egress_client::is_denied(r)
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// Ends the session (DELETE) off the caller's path.
fn close(client: RunningService<RoleClient, ()>) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_changes_with_tenant_url_and_headers() {
        let t = Uuid::now_v7();
        let a = Server::new(t, "http://x/mcp".into(), vec![("A".into(), "1".into())]);
        let b = Server::new(t, "http://x/mcp".into(), vec![("A".into(), "2".into())]);
        let c = Server::new(
            Uuid::now_v7(),
            "http://x/mcp".into(),
            vec![("A".into(), "1".into())],
        );
        assert_ne!(a.key, b.key);
        assert_ne!(a.key, c.key);
        assert!(!a.key.contains("1\u{0}"), "header values are hashed");
    }

    #[test]
    fn cached_lists_expire() {
        let t = Uuid::now_v7();
        let cache = ToolCache::new(Duration::from_millis(0), 10, 10);
        cache.put(t, "k".into(), Arc::new(vec![]));
        assert!(cache.get("k").is_none());
        let cache = ToolCache::new(Duration::from_secs(60), 10, 10);
        cache.put(t, "k".into(), Arc::new(vec![]));
        assert!(cache.get("k").is_some());
    }

    #[test]
    fn one_tenant_cannot_flush_the_others_listings() {
        let cache = ToolCache::new(Duration::from_secs(60), 8, 4);
        let (quiet, busy) = (Uuid::now_v7(), Uuid::now_v7());
        cache.put(quiet, "quiet-1".into(), Arc::new(vec![]));
        cache.put(quiet, "quiet-2".into(), Arc::new(vec![]));
        for i in 0..1000 {
            cache.put(busy, format!("busy-{i}"), Arc::new(vec![]));
            let entries = cache.entries.lock().unwrap();
            assert!(entries.by_key.len() <= 8);
            assert!(entries.per_tenant[&busy] <= 4, "the busy tenant's share");
        }
        assert!(cache.get("quiet-1").is_some() && cache.get("quiet-2").is_some());
        assert!(
            cache.get("busy-999").is_some(),
            "the newest listing is kept"
        );
        assert!(cache.get("busy-0").is_none());
        // A full cache gives way from its largest holder, not from a small one.
        let cache = ToolCache::new(Duration::from_secs(60), 4, 4);
        cache.put(quiet, "quiet".into(), Arc::new(vec![]));
        for i in 0..10 {
            cache.put(Uuid::now_v7(), format!("other-{i}"), Arc::new(vec![]));
            cache.put(busy, format!("busy-{i}"), Arc::new(vec![]));
        }
        assert!(cache.entries.lock().unwrap().by_key.len() <= 4);
    }
}
