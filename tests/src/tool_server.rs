//! HTTP tool server for tests and the demo.
//!
//! Agentfleet's worker calls HTTP tools with `POST <url>`, body
//! `{"run_id", "tool_call_id", "arguments"}` and header
//! `Idempotency-Key: <run_id>:<tool_call_id>`. This server offers a few tools
//! with known behaviour (success, failure, slowness, side effects) and
//! records every call (with the `traceparent` it carried), so tests can check
//! what the worker actually sent and that retries after a crash do not repeat a
//! side effect.
//!
//! | route | behaviour |
//! | --- | --- |
//! | `POST /echo` | 200 `{"echo": arguments}` |
//! | `POST /add` | 200 `{"sum": a + b}`; 400 unless `a` and `b` are numbers |
//! | `POST /fail` | 500 `{"error": "tool failed on purpose"}` |
//! | `POST /slow` | sleeps `arguments.ms` (default 1000), then 200 `{"slept_ms": ms}` |
//! | `POST /side-effect` | applies an effect once per idempotency key: 200 `{"ok": true, "key", "first_time"}` |
//! | `POST /text` | 200 `{"text": …}`: `arguments.words` (default 100) words of varied text, a long result |
//! | `GET /health` | 200 `ok` (not recorded) |
//!
//! Any other path is recorded and answered 404.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// `/slow` sleeps this long when `arguments.ms` is absent.
const DEFAULT_SLOW_MS: u64 = 1000;
/// How long `shutdown()` lets in-flight calls finish before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One request as the tool server received it.
#[derive(Debug, Clone)]
pub struct ToolCallRecord {
    pub path: String,
    pub idempotency_key: Option<String>,
    /// The W3C `traceparent` the worker sent (when it exports traces).
    pub traceparent: Option<String>,
    /// The parsed body (`Null` if empty; a JSON string if not JSON).
    pub body: Value,
    pub received_at: Instant,
}

/// Shared state: the call log and the idempotency keys already applied.
/// Public so the router can be embedded in another axum app.
#[derive(Clone)]
pub struct ToolState {
    inner: Arc<Inner>,
}

struct Inner {
    calls: Mutex<Vec<ToolCallRecord>>,
    applied_keys: Mutex<HashSet<String>>,
    effects: AtomicUsize,
    /// Ends `/slow` sleeps when the server stops, so shutdown is prompt.
    shutdown: watch::Sender<bool>,
}

impl Default for ToolState {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                calls: Mutex::new(Vec::new()),
                applied_keys: Mutex::new(HashSet::new()),
                effects: AtomicUsize::new(0),
                shutdown: watch::Sender::new(false),
            }),
        }
    }
}

impl ToolState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every recorded call, in arrival order.
    pub fn calls(&self) -> Vec<ToolCallRecord> {
        self.log().clone()
    }

    /// How many calls to `path` carried each idempotency key (a call without one panics: the
    /// worker always sends it).
    pub fn calls_per_key(&self, path: &str) -> std::collections::HashMap<String, usize> {
        let mut per_key = std::collections::HashMap::new();
        for c in self.calls_to(path) {
            *per_key
                .entry(c.idempotency_key.expect("idempotency key"))
                .or_default() += 1;
        }
        per_key
    }

    /// Calls whose path is exactly `path` (e.g. "/side-effect").
    pub fn calls_to(&self, path: &str) -> Vec<ToolCallRecord> {
        self.log()
            .iter()
            .filter(|c| c.path == path)
            .cloned()
            .collect()
    }

    /// How many `/side-effect` calls actually applied their effect: the
    /// number exactly-once tests compare with the number of logical calls.
    pub fn side_effect_count(&self) -> usize {
        self.inner.effects.load(Ordering::SeqCst)
    }

    /// Ends in-flight `/slow` sleeps; the embedding app calls this when it
    /// stops serving the router.
    pub fn trigger_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    fn log(&self) -> MutexGuard<'_, Vec<ToolCallRecord>> {
        // A panicking test thread must not hide the log from the others.
        self.inner.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shutdown_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.shutdown.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Returns whether this key (or a keyless call) applies a new effect.
    fn apply_effect(&self, key: Option<&str>) -> bool {
        let first_time = match key {
            Some(key) => self
                .inner
                .applied_keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.to_owned()),
            // Without a key there is nothing to deduplicate on.
            None => true,
        };
        if first_time {
            self.inner.effects.fetch_add(1, Ordering::SeqCst);
        }
        first_time
    }
}

/// The tool routes, for embedding. Dispatch happens in one fallback handler
/// so that every request, known path or not, is recorded the same way.
pub fn router(state: ToolState) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .fallback(dispatch)
        .with_state(state)
}

/// A running tool server. Serves in a background task until dropped or
/// [`ToolServer::shutdown`] is awaited.
pub struct ToolServer {
    addr: SocketAddr,
    state: ToolState,
    task: Option<JoinHandle<()>>,
}

impl ToolServer {
    /// Binds 127.0.0.1:0 and serves in a background tokio task.
    pub async fn start() -> anyhow::Result<ToolServer> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<ToolServer> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("tool-server: binding {addr}"))?;
        let addr = listener.local_addr()?;
        let state = ToolState::new();
        let stop = state.shutdown_requested();
        let app = router(state.clone());
        let task = tokio::spawn(async move {
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::warn!(%error, "tool server stopped with an error");
            }
        });
        Ok(ToolServer {
            addr,
            state,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// "http://127.0.0.1:PORT"
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `base_url() + path`, e.g. `url("/add")`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    pub fn state(&self) -> &ToolState {
        &self.state
    }

    pub fn calls(&self) -> Vec<ToolCallRecord> {
        self.state.calls()
    }

    pub fn calls_to(&self, path: &str) -> Vec<ToolCallRecord> {
        self.state.calls_to(path)
    }

    pub fn calls_per_key(&self, path: &str) -> std::collections::HashMap<String, usize> {
        self.state.calls_per_key(path)
    }

    pub fn side_effect_count(&self) -> usize {
        self.state.side_effect_count()
    }

    /// Stops accepting, lets in-flight calls finish (`/slow` ends at once),
    /// and waits for the server task.
    pub async fn shutdown(mut self) {
        self.state.trigger_shutdown();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        // The server task finishes on its own once signalled.
        self.state.trigger_shutdown();
    }
}

async fn dispatch(
    State(state): State<ToolState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let parsed = if body.is_empty() {
        Ok(Value::Null)
    } else {
        serde_json::from_slice::<Value>(&body)
    };
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    state.log().push(ToolCallRecord {
        path: path.clone(),
        idempotency_key: key.clone(),
        traceparent,
        body: match &parsed {
            Ok(value) => value.clone(),
            Err(_) => Value::String(String::from_utf8_lossy(&body).into_owned()),
        },
        received_at: Instant::now(),
    });

    let known = [
        "/echo",
        "/add",
        "/fail",
        "/slow",
        "/side-effect",
        "/flood",
        "/redirect",
        "/text",
    ];
    if !known.contains(&path.as_str()) {
        return reply(
            StatusCode::NOT_FOUND,
            json!({ "error": format!("no tool at {path}") }),
        );
    }
    if method != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({ "error": "tools are called with POST" }),
        );
    }
    let Ok(body) = parsed else {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({ "error": "body is not JSON" }),
        );
    };
    let args = body.get("arguments").cloned().unwrap_or(Value::Null);

    match path.as_str() {
        "/echo" => reply(StatusCode::OK, json!({ "echo": args })),
        // `words` (default 100, at most 100,000) words of varied, deterministic text: a
        // long tool result that tokenizes like prose, not like one repeated character.
        "/text" => {
            let words = args
                .get("words")
                .and_then(Value::as_u64)
                .unwrap_or(100)
                .min(100_000);
            let text: Vec<String> = (0..words)
                .map(|i| {
                    format!(
                        "{}{}",
                        ["alpha", "river", "stone", "maple", "orbit"][(i % 5) as usize],
                        i * 7919 % 10007
                    )
                })
                .collect();
            reply(StatusCode::OK, json!({ "text": text.join(" ") }))
        }
        // A hostile tool: streams `bytes` (default 5 GB) for as long as the caller reads.
        "/flood" => {
            let total = args
                .get("bytes")
                .and_then(Value::as_u64)
                .unwrap_or(5_000_000_000);
            let body = futures_util::StreamExt::map(
                crate::mock_llm::flood_stream(total),
                Ok::<_, std::convert::Infallible>,
            );
            (
                [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
        // Redirects the caller to `to` (a 303 turns the POST into a GET).
        "/redirect" => {
            let to = args.get("to").and_then(Value::as_str).unwrap_or("/echo");
            (
                StatusCode::SEE_OTHER,
                [(axum::http::header::LOCATION, to.to_owned())],
            )
                .into_response()
        }
        "/add" => add(&args),
        "/fail" => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": "tool failed on purpose" }),
        ),
        "/slow" => {
            let ms = args
                .get("ms")
                .and_then(Value::as_u64)
                .unwrap_or(DEFAULT_SLOW_MS);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => {
                    reply(StatusCode::OK, json!({ "slept_ms": ms }))
                }
                () = state.shutdown_requested() => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({ "error": "tool server is shutting down" }),
                ),
            }
        }
        _ => {
            let first_time = state.apply_effect(key.as_deref());
            reply(
                StatusCode::OK,
                json!({ "ok": true, "key": key, "first_time": first_time }),
            )
        }
    }
}

/// Integer sums stay integers so tests can compare with `json!(5)`.
fn add(args: &Value) -> Response {
    let (Some(a), Some(b)) = (
        args.get("a").filter(|v| v.is_number()),
        args.get("b").filter(|v| v.is_number()),
    ) else {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({ "error": "arguments.a and arguments.b must be numbers" }),
        );
    };
    let sum = match (a.as_i64(), b.as_i64()) {
        (Some(a), Some(b)) if a.checked_add(b).is_some() => json!(a + b),
        _ => json!(a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0)),
    };
    reply(StatusCode::OK, json!({ "sum": sum }))
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace builds reqwest with `rustls-no-provider`, so building a
    /// client panics until a process-wide crypto provider is installed.
    fn client() -> reqwest::Client {
        agentfleet_shared::telemetry::install_crypto();
        reqwest::Client::new()
    }

    async fn call(
        server: &ToolServer,
        path: &str,
        key: Option<&str>,
        arguments: Value,
    ) -> (u16, Value) {
        let mut request = client().post(server.url(path)).json(&json!({
            "run_id": "run-1",
            "tool_call_id": "call-1",
            "arguments": arguments,
        }));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.expect("request to tool server");
        let status = response.status().as_u16();
        (status, response.json().await.expect("JSON reply"))
    }

    #[tokio::test]
    async fn records_calls_with_idempotency_keys() {
        let server = ToolServer::start().await.unwrap();
        let args = json!({ "text": "hi", "n": [1, 2] });
        let (status, reply) = call(&server, "/echo", Some("run-1:call-1"), args.clone()).await;
        assert_eq!((status, reply), (200, json!({ "echo": args })));
        call(&server, "/echo", None, json!({})).await;

        let calls = server.calls_to("/echo");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].idempotency_key.as_deref(), Some("run-1:call-1"));
        assert_eq!(calls[0].body["run_id"], "run-1");
        assert_eq!(calls[0].body["tool_call_id"], "call-1");
        assert_eq!(calls[0].body["arguments"], args);
        assert_eq!(calls[1].idempotency_key, None);
        assert!(calls[0].received_at <= calls[1].received_at);
        assert_eq!(server.calls().len(), 2);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn side_effect_is_applied_once_per_key() {
        let server = ToolServer::start().await.unwrap();
        let (status, first) = call(&server, "/side-effect", Some("run-1:call-1"), json!({})).await;
        assert_eq!(status, 200);
        assert_eq!(
            first,
            json!({ "ok": true, "key": "run-1:call-1", "first_time": true })
        );
        let (_, again) = call(&server, "/side-effect", Some("run-1:call-1"), json!({})).await;
        assert_eq!(again["first_time"], false);
        let (_, other) = call(&server, "/side-effect", Some("run-1:call-2"), json!({})).await;
        assert_eq!(other["first_time"], true);

        assert_eq!(server.calls_to("/side-effect").len(), 3);
        assert_eq!(server.side_effect_count(), 2);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn add_fail_slow_and_unknown_paths() {
        let server = ToolServer::start().await.unwrap();
        assert_eq!(
            call(&server, "/add", None, json!({ "a": 2, "b": 3 })).await,
            (200, json!({ "sum": 5 }))
        );
        assert_eq!(
            call(&server, "/add", None, json!({ "a": 1.5, "b": 2 })).await,
            (200, json!({ "sum": 3.5 }))
        );
        let (status, error) = call(&server, "/add", None, json!({ "a": 1 })).await;
        assert_eq!(status, 400);
        assert!(error["error"].as_str().unwrap().contains("numbers"));

        assert_eq!(
            call(&server, "/fail", None, json!({})).await,
            (500, json!({ "error": "tool failed on purpose" }))
        );

        let started = Instant::now();
        assert_eq!(
            call(&server, "/slow", None, json!({ "ms": 150 })).await,
            (200, json!({ "slept_ms": 150 }))
        );
        assert!(started.elapsed() >= Duration::from_millis(150));

        let (status, _) = call(&server, "/nope", None, json!({})).await;
        assert_eq!(status, 404);
        assert_eq!(server.calls_to("/nope").len(), 1);
        assert_eq!(server.calls().len(), 6);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_cuts_slow_calls_short() {
        let server = ToolServer::start().await.unwrap();
        let url = server.url("/slow");
        let pending = tokio::spawn(async move {
            client()
                .post(url)
                .json(&json!({ "arguments": { "ms": 60_000 } }))
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
        while server.calls().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::timeout(Duration::from_secs(2), server.shutdown())
            .await
            .expect("shutdown ends /slow");
        assert_eq!(pending.await.unwrap().unwrap(), 503);
    }
}
