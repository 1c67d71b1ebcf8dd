//! A real MCP server (the official SDK, `rmcp`, streamable HTTP at `/mcp`) for the tests.
//! It records every call with the headers and `_meta` it arrived with, and how many calls
//! ran at once.
//!
//! | tool | behaviour |
//! | --- | --- |
//! | `add` `{a, b}` | text `{"sum": a + b}` |
//! | `transfer` `{amount}` | a side effect: counted; text `transferred <amount>` |
//! | `slow` `{ms}` | sleeps `ms` (default 300), then text `slept` |
//! | `fail` | an `isError` result with text `failed on purpose` |
//!
//! `tools/list` answers two tools a page (the cursor is the next page's number). Two hostile
//! listings beside it: `/endless/mcp` answers one new tool a page and always another cursor;
//! `/wordy/mcp` answers the same pages with 100,000-byte descriptions.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One call as the server received it.
#[derive(Debug, Clone)]
pub struct McpCall {
    pub tool: String,
    pub arguments: Value,
    /// The request's `_meta`.
    pub meta: Value,
    pub authorization: Option<String>,
    /// The W3C `traceparent` the worker sent (when it exports traces).
    pub traceparent: Option<String>,
}

#[derive(Default)]
pub struct McpState {
    calls: Mutex<Vec<McpCall>>,
    lists: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl McpState {
    pub fn calls(&self) -> Vec<McpCall> {
        self.calls.lock().unwrap().clone()
    }
    pub fn calls_to(&self, tool: &str) -> Vec<McpCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.tool == tool)
            .collect()
    }
    /// `tools/list` requests answered.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }
    /// Most calls that were running at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct Handler {
    state: Arc<McpState>,
    listing: Listing,
}

#[derive(Clone, Copy)]
enum Listing {
    Paged,
    Endless,
    Wordy,
}

/// Tools a page of a paged listing.
const PAGE: usize = 2;

fn tool(name: &'static str, description: &'static str, schema: Value) -> Tool {
    let Value::Object(schema) = schema else {
        unreachable!("schemas are objects")
    };
    Tool::new(name, description, Arc::new(schema))
}

fn tools() -> Vec<Tool> {
    vec![
        tool(
            "add",
            "Adds two numbers.",
            json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}),
        ),
        tool(
            "transfer",
            "Moves money.",
            json!({"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}),
        ),
        tool(
            "slow",
            "Sleeps.",
            json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
        ),
        tool("fail", "Fails.", json!({"type": "object"})),
    ]
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let page: usize = request
            .and_then(|r| r.cursor)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        if page == 0 {
            self.state.lists.fetch_add(1, Ordering::SeqCst);
        }
        let (items, more) = match self.listing {
            Listing::Endless => {
                let name = format!("t{page}");
                let t = Tool::new(name, "Endless.", Arc::new(serde_json::Map::new()));
                (vec![t], true)
            }
            Listing::Paged | Listing::Wordy => {
                let all = tools();
                let more = (page + 1) * PAGE < all.len();
                let mut items: Vec<Tool> = all.into_iter().skip(page * PAGE).take(PAGE).collect();
                if matches!(self.listing, Listing::Wordy) {
                    for t in &mut items {
                        t.description = Some("w".repeat(100_000).into());
                    }
                }
                (items, more)
            }
        };
        let mut result = ListToolsResult::with_all_items(items);
        result.next_cursor = more.then(|| (page + 1).to_string());
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let header = |name: &str| {
            context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let authorization = header("authorization");
        let traceparent = header("traceparent");
        let meta = request
            .meta
            .as_ref()
            .map(|m| Value::Object(m.0.0.clone()))
            .filter(|m| m.as_object().is_some_and(|o| !o.is_empty()))
            .unwrap_or_else(|| Value::Object(context.meta.0.0.clone()));
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        self.state.calls.lock().unwrap().push(McpCall {
            tool: request.name.to_string(),
            arguments: arguments.clone(),
            meta,
            authorization,
            traceparent,
        });
        let now = self.state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = match request.name.as_ref() {
            "add" => {
                let sum =
                    arguments["a"].as_f64().unwrap_or(0.0) + arguments["b"].as_f64().unwrap_or(0.0);
                CallToolResult::success(vec![ContentBlock::text(json!({"sum": sum}).to_string())])
            }
            "transfer" => CallToolResult::success(vec![ContentBlock::text(format!(
                "transferred {}",
                arguments["amount"]
            ))]),
            "slow" => {
                let ms = arguments["ms"].as_u64().unwrap_or(300);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                CallToolResult::success(vec![ContentBlock::text("slept")])
            }
            _ => CallToolResult::error(vec![ContentBlock::text("failed on purpose")]),
        };
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(result.into())
    }
}

pub struct McpServer {
    addr: SocketAddr,
    state: Arc<McpState>,
    task: JoinHandle<()>,
}

impl McpServer {
    /// Binds 127.0.0.1:0 and serves `/mcp` in a background task.
    pub async fn start() -> anyhow::Result<McpServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("mcp-server: binding")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(McpState::default());
        let service = |listing| {
            let handler = Handler {
                state: state.clone(),
                listing,
            };
            StreamableHttpService::new(
                move || Ok(handler.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            )
        };
        let app = axum::Router::new()
            .nest_service("/mcp", service(Listing::Paged))
            .nest_service("/endless/mcp", service(Listing::Endless))
            .nest_service("/wordy/mcp", service(Listing::Wordy));
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(%error, "mcp server stopped with an error");
            }
        });
        Ok(McpServer { addr, state, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/mcp`
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// A listing that never ends: one new tool a page, always another cursor.
    pub fn endless_url(&self) -> String {
        format!("http://{}/endless/mcp", self.addr)
    }

    /// The four tools over two pages, each with a 100,000-byte description.
    pub fn wordy_url(&self) -> String {
        format!("http://{}/wordy/mcp", self.addr)
    }

    pub fn state(&self) -> &McpState {
        &self.state
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
