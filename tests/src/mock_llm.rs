//! Scripted OpenAI-compatible chat-completions server.
//!
//! Tests, demos and benchmarks need a model whose answers are exact and
//! repeatable, costs nothing and can misbehave on demand. The script travels
//! inside the conversation itself (the first `user` message), so one server
//! can serve many concurrent runs without any per-run setup: a run's script
//! is whatever its input says.
//!
//! Script format (content of the first `user` message):
//!
//! ```json
//! {"mock_script": [
//!   {"content": "Let me look.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
//!   {"content": "The sum is 3."}
//! ]}
//! ```
//!
//! Turn `k` is played when the request already holds `k` assistant messages,
//! so a well-behaved agent loop walks the script in order. Fields of a turn:
//!
//! | field | effect |
//! | --- | --- |
//! | `content` | assistant text |
//! | `tool_calls` | `[{"name", "arguments", "id"}]`; `arguments` is an object, or a string sent verbatim (to test malformed arguments); `id` is optional (fresh by default) |
//! | `chunks` | pieces to split the content and each call's arguments into when streaming (default 3) |
//! | `call_chunks` | pieces to split each call's arguments into, when they should differ from `chunks` |
//! | `stamp` | `true`: each streamed content piece is replaced, as it is sent, by the time of sending ([`stamp_now`]: four characters), so a reader on the same host knows each token's delay ([`stamp_age_ms`]); give `content` 4 × `chunks` characters so lengths and the usage estimate match |
//! | `delay_ms` | wait before the response headers (slow model) |
//! | `chunk_delay_ms` | wait between stream events |
//! | `status` / `error_message` | fail with that HTTP status and an OpenAI-style error body |
//! | `stall_error_body` | with `status`: send the status, then a body that never comes |
//! | `truncate` | stream only the first half of the events, with no `finish_reason` and no `[DONE]` |
//! | `hang_after_chunks` | stream that many events (the role event included), then stay silent with the connection open |
//! | `flood_bytes` | after the role event, stream that many bytes of one endless `data:` line (no newline), then close |
//! | `sse_prelude` | raw text sent before the first event, as its own write (a byte-order mark, `id:` or `retry:` fields, blank lines) |
//! | `usage` | an object: sent verbatim as the response's `usage` (e.g. `{"prompt_tokens": 10, "completion_tokens": 5}`); `false`: no `usage` at all (a provider that reports none). Absent: a deterministic estimate (about 4 characters a token), as a real provider would report |
//!
//! Without a script, or past its end, the answer is `echo: <last user text>`.
//!
//! A script may instead be the content of the `system` message, for runs whose history gets
//! compacted (the first user message is then summarised away): turn `k` is played for the
//! `k`-th request carrying that same system message (counted per server). In either place a
//! turn may carry `"repeat": n`, standing for n identical turns.
//!
//! A request whose system message starts with [`SUMMARISE_MARKER`] is a summarising call
//! (tests configure `context.summary_prompt` with it): the answer is a short deterministic
//! summary naming how many bytes it summarised, reporting [`SUMMARY_USAGE`], and
//! [`MockState::summaries`] counts them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Pieces per streamed string when a turn does not say.
const DEFAULT_CHUNKS: usize = 3;
/// Agent conversations in long benchmark runs can outgrow axum's 2 MiB default.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// How long `shutdown()` lets in-flight responses finish before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The start of a system message that makes a request a summarising call.
pub const SUMMARISE_MARKER: &str = "MOCK-SUMMARISE";
/// The usage every summarising answer reports (so a test can tell what a run was billed).
pub const SUMMARY_USAGE: (i64, i64) = (1234, 56);

/// Builds the `user` message content that carries a script, so tests don't
/// hand-write the envelope.
pub fn script(turns: Value) -> String {
    json!({ "mock_script": turns }).to_string()
}

/// Characters of a send-time stamp (`stamp` turns).
pub const STAMP_LEN: usize = 4;
/// Stamps count milliseconds modulo this (36^4 ms, about 28 minutes): four base-36 digits.
const STAMP_MODULUS: u64 = 36 * 36 * 36 * 36;
const STAMP_DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Milliseconds since the Unix epoch by the wall clock.
pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The stamp of `ms` (milliseconds since the epoch): modulo 36^4, four base-36 digits, so a
/// stamped token is as long as an average English token.
pub fn stamp_of(ms: u64) -> String {
    let mut v = ms % STAMP_MODULUS;
    let mut out = [b'0'; STAMP_LEN];
    for slot in out.iter_mut().rev() {
        *slot = STAMP_DIGITS[(v % 36) as usize];
        v /= 36;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The stamp of now: what a `stamp` turn sends in place of each content piece.
pub fn stamp_now() -> String {
    stamp_of(epoch_ms())
}

/// How many milliseconds before `now_ms` the stamp `stamp` was made (exact to a millisecond,
/// for ages under 36^4 ms); `None` if `stamp` is no stamp.
pub fn stamp_age_ms(stamp: &str, now_ms: u64) -> Option<u64> {
    if stamp.len() != STAMP_LEN {
        return None;
    }
    let mut v = 0u64;
    for b in stamp.bytes() {
        let digit = STAMP_DIGITS.iter().position(|d| *d == b)? as u64;
        v = v * 36 + digit;
    }
    Some((now_ms % STAMP_MODULUS + STAMP_MODULUS - v) % STAMP_MODULUS)
}

/// How to run a [`MockLlm`].
#[derive(Debug, Clone)]
pub struct MockLlmOptions {
    /// Where to listen; port 0 picks a free one (the default, for tests).
    pub addr: SocketAddr,
    /// Keep every request body. Tests want it; long benchmark runs would
    /// grow without bound, so the binary turns it off by default.
    pub log_requests: bool,
}

impl Default for MockLlmOptions {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_requests: true,
        }
    }
}

/// One logged request, with its arrival time so tests can check pacing
/// (retries, backoff, concurrency).
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// The parsed body; a body that is not JSON is kept as a JSON string.
    pub body: Value,
    pub received_at: Instant,
    /// It came over HTTP/2 (else HTTP/1.1).
    pub http2: bool,
}

/// Shared state of the mock server: the request log and the shutdown signal.
/// Public so the router can be embedded in another axum app.
#[derive(Clone)]
pub struct MockState {
    inner: Arc<Inner>,
}

struct Inner {
    log_requests: bool,
    log: Mutex<Vec<RecordedRequest>>,
    count: AtomicUsize,
    /// Failures served so far per (script, turn), for `fail_times`.
    failures: Mutex<std::collections::HashMap<(String, usize), u32>>,
    /// Requests served so far per system-message script.
    system_turns: Mutex<std::collections::HashMap<String, usize>>,
    /// Summarising calls served.
    summaries: AtomicUsize,
    /// TCP connections accepted.
    connections: AtomicUsize,
    /// Lets sleeping and hanging responses end when the server stops, so
    /// graceful shutdown never waits on a deliberately silent stream.
    shutdown: watch::Sender<bool>,
}

impl Default for MockState {
    fn default() -> Self {
        Self::new(true)
    }
}

impl MockState {
    pub fn new(log_requests: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                log_requests,
                log: Mutex::new(Vec::new()),
                count: AtomicUsize::new(0),
                failures: Mutex::new(std::collections::HashMap::new()),
                system_turns: Mutex::new(std::collections::HashMap::new()),
                summaries: AtomicUsize::new(0),
                connections: AtomicUsize::new(0),
                shutdown: watch::Sender::new(false),
            }),
        }
    }

    /// Request bodies in arrival order (empty when logging is off).
    pub fn requests(&self) -> Vec<Value> {
        self.log().iter().map(|r| r.body.clone()).collect()
    }

    /// Request bodies with their arrival times.
    pub fn recorded(&self) -> Vec<RecordedRequest> {
        self.log().clone()
    }

    /// Counted even when logging is off, so benchmarks can still check totals.
    pub fn request_count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// Summarising calls served (see [`SUMMARISE_MARKER`]).
    pub fn summaries(&self) -> usize {
        self.inner.summaries.load(Ordering::SeqCst)
    }

    /// TCP connections the server accepted (HTTP/1.1 and HTTP/2 alike).
    pub fn connections(&self) -> usize {
        self.inner.connections.load(Ordering::SeqCst)
    }

    /// Ends hanging and delayed responses; the embedding app calls this when
    /// it stops serving the router.
    pub fn trigger_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    fn log(&self) -> MutexGuard<'_, Vec<RecordedRequest>> {
        // A panicking test thread must not hide the log from the others.
        self.inner.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, body: Value, version: axum::http::Version) {
        self.inner.count.fetch_add(1, Ordering::SeqCst);
        if self.inner.log_requests {
            self.log().push(RecordedRequest {
                body,
                received_at: Instant::now(),
                http2: version == axum::http::Version::HTTP_2,
            });
        }
    }

    /// Resolves once shutdown has been triggered (or the state is gone).
    fn shutdown_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.shutdown.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// The mock's routes, for embedding: `POST /v1/chat/completions` (and
/// `/chat/completions`), `GET /v1/models`, `GET /health`, and
/// `GET /_mock/requests` to read the log from outside the process.
pub fn router(state: MockState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/_mock/requests", get(logged_requests))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// A running mock server. Serves in a background task until dropped or
/// [`MockLlm::shutdown`] is awaited.
pub struct MockLlm {
    addr: SocketAddr,
    state: MockState,
    task: Option<JoinHandle<()>>,
}

impl MockLlm {
    /// Binds 127.0.0.1:0 and serves in a background tokio task until dropped or `shutdown()`.
    pub async fn start() -> anyhow::Result<MockLlm> {
        Self::start_with(MockLlmOptions::default()).await
    }

    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<MockLlm> {
        Self::start_with(MockLlmOptions {
            addr,
            ..MockLlmOptions::default()
        })
        .await
    }

    pub async fn start_with(options: MockLlmOptions) -> anyhow::Result<MockLlm> {
        let listener = TcpListener::bind(options.addr)
            .await
            .with_context(|| format!("mock-llm: binding {}", options.addr))?;
        let addr = listener.local_addr()?;
        let state = MockState::new(options.log_requests);
        let stop = state.shutdown_requested();
        let app = router(state.clone());
        let counted = state.clone();
        let task = tokio::spawn(async move {
            // Streamed chunks are small writes: without TCP_NODELAY each waits ~40 ms for the
            // client's delayed ACK, and a "zero-delay" model takes 40 ms. It serves HTTP/1.1 and
            // HTTP/2 (h2c with prior knowledge) alike.
            let listener = listener.tap_io(move |tcp| {
                counted.inner.connections.fetch_add(1, Ordering::SeqCst);
                let _ = tcp.set_nodelay(true);
            });
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::warn!(%error, "mock-llm server stopped with an error");
            }
        });
        Ok(MockLlm {
            addr,
            state,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// e.g. "http://127.0.0.1:PORT/v1"
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn state(&self) -> &MockState {
        &self.state
    }

    /// All request bodies received so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.state.requests()
    }

    /// Request bodies with their arrival times.
    pub fn recorded(&self) -> Vec<RecordedRequest> {
        self.state.recorded()
    }

    pub fn request_count(&self) -> usize {
        self.state.request_count()
    }

    /// Stops accepting, lets in-flight responses finish (hanging and delayed
    /// ones end at once), and waits for the server task.
    pub async fn shutdown(mut self) {
        self.state.trigger_shutdown();
        if let Some(task) = self.task.take() {
            stop_task(task).await;
        }
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        // The server task finishes on its own once signalled.
        self.state.trigger_shutdown();
    }
}

async fn stop_task(task: JoinHandle<()>) {
    let abort = task.abort_handle();
    if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
        abort.abort();
    }
}

/// One scripted assistant turn.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Turn {
    content: Option<String>,
    tool_calls: Vec<ScriptedToolCall>,
    chunks: Option<usize>,
    delay_ms: Option<u64>,
    chunk_delay_ms: Option<u64>,
    status: Option<u16>,
    error_message: Option<String>,
    truncate: bool,
    hang_after_chunks: Option<usize>,
    /// With `status`: fail only the first n requests for this turn, then answer normally
    /// (lets tests see retries succeed).
    fail_times: Option<u32>,
    /// With `status`: a `Retry-After` header, in seconds.
    retry_after: Option<u64>,
    /// With `status`: the error's headers, then a body that never comes (a proxy that
    /// stalls mid-answer).
    #[serde(default)]
    stall_error_body: bool,
    /// A hostile model: one endless SSE line of this many bytes.
    flood_bytes: Option<u64>,
    /// Raw text sent before the first event (a byte-order mark, an `id:` field, comments).
    sse_prelude: Option<String>,
    /// The `usage` to report: an object verbatim, `false` for none, absent for the estimate.
    usage: Option<Value>,
    /// Pieces per call's arguments (default: `chunks`).
    call_chunks: Option<usize>,
    /// Content pieces replaced by their send time as they go out ([`stamp_now`]).
    stamp: bool,
}

#[derive(Debug, Deserialize)]
struct ScriptedToolCall {
    name: String,
    #[serde(default)]
    arguments: Value,
    /// The id to send (a misbehaving provider may reuse one); a fresh one by default.
    #[serde(default)]
    id: Option<String>,
}

/// A tool call as it will be sent: id assigned, arguments serialized.
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

struct Usage {
    prompt: usize,
    completion: usize,
}

impl Usage {
    fn to_json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        })
    }
}

/// Fields shared by every object of one response.
struct Meta {
    id: String,
    created: u64,
    model: String,
}

async fn chat_completions(
    State(state): State<MockState>,
    version: axum::http::Version,
    body: Bytes,
) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => {
            state.record(
                Value::String(String::from_utf8_lossy(&body).into_owned()),
                version,
            );
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("request body is not JSON: {e}"),
                "invalid_request_error",
            );
        }
    };
    state.record(request.clone(), version);

    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "`messages` must be an array",
            "invalid_request_error",
        );
    };
    if let Err(message) = check_history(messages) {
        return error_response(StatusCode::BAD_REQUEST, message, "invalid_request_error");
    }
    let turn = match select_turn(&state, messages) {
        Ok(Some(turn)) => turn,
        Ok(None) => Turn {
            content: Some(format!("echo: {}", last_user_text(messages))),
            ..Turn::default()
        },
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, message, "invalid_request_error");
        }
    };

    if let Some(ms) = turn.delay_ms.filter(|ms| *ms > 0) {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => {}
            () = state.shutdown_requested() => {
                return error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "mock-llm is shutting down",
                    "mock_error",
                );
            }
        }
    }

    let still_failing = match turn.fail_times {
        None => true,
        Some(n) => {
            let key = (first_user_text(messages), assistant_count(messages));
            let mut failures = state.inner.failures.lock().expect("failures lock");
            let served = failures.entry(key).or_insert(0);
            *served += 1;
            *served <= n
        }
    };
    if let Some(code) = turn.status.filter(|_| still_failing) {
        let Ok(status) = StatusCode::from_u16(code) else {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("mock_script: invalid status {code}"),
                "invalid_request_error",
            );
        };
        let message = turn
            .error_message
            .clone()
            .unwrap_or_else(|| format!("mock error (status {code})"));
        if turn.stall_error_body {
            let stop = state.shutdown_requested();
            let never = futures_util::stream::once(async move {
                stop.await;
                Ok::<_, Infallible>(Bytes::new())
            });
            return (status, Body::from_stream(never)).into_response();
        }
        let mut resp = error_response(status, message, "mock_error");
        if let Some(secs) = turn.retry_after {
            resp.headers_mut().insert("retry-after", secs.into());
        }
        return resp;
    }

    let tool_calls: Vec<ToolCall> = turn
        .tool_calls
        .iter()
        .map(|call| ToolCall {
            id: call.id.clone().unwrap_or_else(|| {
                format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
            }),
            name: call.name.clone(),
            arguments: match &call.arguments {
                Value::String(raw) => raw.clone(),
                Value::Null => "{}".to_owned(),
                other => other.to_string(),
            },
        })
        .collect();
    let estimate = Usage {
        prompt: estimate_tokens(
            messages
                .iter()
                .map(|m| text_of(&m["content"]).chars().count())
                .sum(),
        ),
        completion: estimate_tokens(
            turn.content.as_deref().map_or(0, |c| c.chars().count())
                + tool_calls
                    .iter()
                    .map(|c| c.arguments.chars().count())
                    .sum::<usize>(),
        ),
    };
    let meta = Meta {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: request
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock-llm")
            .to_owned(),
    };

    let usage = match &turn.usage {
        None => Some(estimate.to_json()),
        Some(Value::Bool(false)) => None,
        Some(scripted) => Some(scripted.clone()),
    };
    let usage = usage.as_ref();
    if request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        stream_response(&state, &turn, &tool_calls, usage, &meta)
    } else {
        Json(completion(&turn, &tool_calls, usage, &meta)).into_response()
    }
}

/// Picks the scripted turn for this request; `Ok(None)` means "echo".
fn select_turn(state: &MockState, messages: &[Value]) -> Result<Option<Turn>, String> {
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .map(|m| text_of(&m["content"]));
    if let Some(system) = system.as_deref()
        && system.starts_with(SUMMARISE_MARKER)
    {
        state.inner.summaries.fetch_add(1, Ordering::SeqCst);
        let bytes: usize = messages
            .iter()
            .filter(|m| m["role"] != "system")
            .map(|m| text_of(&m["content"]).len())
            .sum();
        return Ok(Some(Turn {
            content: Some(format!("mock summary of {bytes} bytes of conversation")),
            usage: Some(
                json!({"prompt_tokens": SUMMARY_USAGE.0, "completion_tokens": SUMMARY_USAGE.1}),
            ),
            ..Turn::default()
        }));
    }
    let script_of = |content: &str| {
        serde_json::from_str::<Value>(content)
            .ok()
            .and_then(|doc| doc.get("mock_script").and_then(Value::as_array).cloned())
    };
    let (script, k) = match system.as_deref().and_then(script_of) {
        Some(script) => {
            let mut turns = state.inner.system_turns.lock().expect("turns lock");
            let served = turns.entry(system.unwrap_or_default()).or_insert(0);
            *served += 1;
            (script, *served - 1)
        }
        None => {
            let Some(script) = messages
                .iter()
                .find(|m| m["role"] == "user")
                .and_then(|m| m["content"].as_str())
                .and_then(script_of)
            else {
                return Ok(None);
            };
            let k = messages.iter().filter(|m| m["role"] == "assistant").count();
            (script, k)
        }
    };
    // `repeat: n` stands for n turns.
    let mut left = k;
    for turn in &script {
        let times = turn.get("repeat").and_then(Value::as_u64).unwrap_or(1) as usize;
        if left < times {
            return Turn::deserialize(turn)
                .map(Some)
                .map_err(|e| format!("mock_script turn {k} is invalid: {e}"));
        }
        left -= times;
    }
    Ok(None)
}

/// Text of a message's `content`, whether a string or an array of parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

fn last_user_text(messages: &[Value]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .unwrap_or_default()
}

/// Deterministic, so tests and benchmarks can assert exact token totals.
fn estimate_tokens(chars: usize) -> usize {
    chars.div_ceil(4).max(1)
}

/// Splits `text` into at most `pieces` non-empty parts on char boundaries,
/// as even as possible; never more parts than chars.
fn split_pieces(text: &str, pieces: usize) -> Vec<&str> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    let chars = bounds.len() - 1;
    if chars == 0 {
        return Vec::new();
    }
    let n = pieces.clamp(1, chars);
    (0..n)
        .map(|i| &text[bounds[i * chars / n]..bounds[(i + 1) * chars / n]])
        .collect()
}

fn finish_reason(tool_calls: &[ToolCall]) -> &'static str {
    if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn completion(turn: &Turn, tool_calls: &[ToolCall], usage: Option<&Value>, meta: &Meta) -> Value {
    let mut message = json!({ "role": "assistant", "content": turn.content });
    // OpenAI omits `tool_calls` when there are none; clients rely on either.
    if !tool_calls.is_empty() {
        message["tool_calls"] = tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": { "name": call.name, "arguments": call.arguments },
                })
            })
            .collect();
    }
    let mut body = json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason(tool_calls) }],
    });
    if let Some(usage) = usage {
        body["usage"] = usage.clone();
    }
    body
}

/// The history rules OpenAI enforces (it answers 400 otherwise): an assistant message with
/// `tool_calls` is followed by exactly one `tool` message per call id before anything else,
/// and a `tool` message answers a call of the assistant message before it.
fn check_history(messages: &[Value]) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role == "tool" {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
            let Some(k) = open.iter().position(|o| o == id) else {
                return Err(format!(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls' (messages[{i}], tool_call_id {id:?})."
                ));
            };
            open.remove(k);
            continue;
        }
        if !open.is_empty() {
            return Err(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                open.join(", ")
            ));
        }
        if role == "assistant" {
            open = m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect();
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
            open.join(", ")
        ))
    }
}

/// Every SSE event of a complete stream, `[DONE]` excluded.
fn stream_events(
    turn: &Turn,
    tool_calls: &[ToolCall],
    usage: Option<&Value>,
    meta: &Meta,
) -> Vec<Value> {
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    };
    let pieces = turn.chunks.unwrap_or(DEFAULT_CHUNKS);
    let mut events = vec![chunk(json!({ "role": "assistant" }), None)];
    for piece in split_pieces(turn.content.as_deref().unwrap_or(""), pieces) {
        let piece = if turn.stamp { STAMP_PLACEHOLDER } else { piece };
        events.push(chunk(json!({ "content": piece }), None));
    }
    let pieces = turn.call_chunks.unwrap_or(pieces);
    for (index, call) in tool_calls.iter().enumerate() {
        events.push(chunk(
            json!({ "tool_calls": [{
                "index": index,
                "id": call.id,
                "type": "function",
                "function": { "name": call.name, "arguments": "" },
            }] }),
            None,
        ));
        for piece in split_pieces(&call.arguments, pieces) {
            events.push(chunk(
                json!({ "tool_calls": [{ "index": index, "function": { "arguments": piece } }] }),
                None,
            ));
        }
    }
    events.push(chunk(json!({}), Some(finish_reason(tool_calls))));
    // Sent whether or not `stream_options.include_usage` asked: clients that
    // did not ask ignore a chunk with no choices.
    if let Some(usage) = usage {
        events.push(json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": [],
            "usage": usage,
        }));
    }
    events
}

/// What a `stamp` turn's content pieces hold until they are sent (control characters, which no
/// script's text holds by accident).
const STAMP_PLACEHOLDER: &str = "\u{1}s\u{1}";

/// One SSE frame of a scripted stream: ready, or a content piece stamped as it goes out (the
/// frame's text before and after the stamp).
enum Frame {
    Ready(Bytes),
    Stamped(String, String),
}

impl Frame {
    fn of(event: &Value, stamped: bool) -> Frame {
        let text = format!("data: {event}\n\n");
        if !stamped {
            return Frame::Ready(Bytes::from(text));
        }
        let placeholder = Value::from(STAMP_PLACEHOLDER).to_string();
        let placeholder = &placeholder[1..placeholder.len() - 1];
        match text.find(placeholder) {
            Some(at) => Frame::Stamped(
                text[..at].to_owned(),
                text[at + placeholder.len()..].to_owned(),
            ),
            None => Frame::Ready(Bytes::from(text)),
        }
    }

    fn bytes(&self) -> Bytes {
        match self {
            Frame::Ready(bytes) => bytes.clone(),
            Frame::Stamped(before, after) => Bytes::from(format!("{before}{}{after}", stamp_now())),
        }
    }
}

/// `total` bytes of `a`, 64 KiB at a time, produced as the reader takes them (nothing is
/// held: a reader that stops reading stops the flood).
pub fn flood_stream(total: u64) -> impl futures_util::Stream<Item = Bytes> {
    const CHUNK: usize = 64 * 1024;
    let block = Bytes::from(vec![b'a'; CHUNK]);
    futures_util::stream::unfold(total, move |left| {
        let block = block.clone();
        async move {
            (left > 0).then(|| {
                let n = left.min(CHUNK as u64) as usize;
                (block.slice(..n), left - n as u64)
            })
        }
    })
}

/// How a stream ends after its events.
enum Ending {
    Done,
    Cut,
    Hang,
}

fn stream_response(
    state: &MockState,
    turn: &Turn,
    tool_calls: &[ToolCall],
    usage: Option<&Value>,
    meta: &Meta,
) -> Response {
    let events = stream_events(turn, tool_calls, usage, meta);
    let (limit, ending) = if let Some(n) = turn.hang_after_chunks {
        (n.min(events.len()), Ending::Hang)
    } else if turn.truncate {
        ((events.len() / 2).max(1), Ending::Cut)
    } else {
        (events.len(), Ending::Done)
    };
    let mut frames: Vec<Frame> = events
        .iter()
        .take(limit)
        .map(|e| Frame::of(e, turn.stamp))
        .collect();
    if let Some(prelude) = &turn.sse_prelude {
        frames.insert(0, Frame::Ready(Bytes::from(prelude.clone())));
    }
    let gap = Duration::from_millis(turn.chunk_delay_ms.unwrap_or(0));
    let stop = state.shutdown_requested();
    if let Some(total) = turn.flood_bytes {
        let role = frames.first().map(Frame::bytes).unwrap_or_default();
        let head = futures_util::stream::iter([role, Bytes::from_static(b"data: ")]);
        let flood = futures_util::StreamExt::map(
            futures_util::StreamExt::chain(head, flood_stream(total)),
            Ok::<_, Infallible>,
        );
        return (
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from_stream(flood),
        )
            .into_response();
    }

    // A task feeds the body through a channel, which makes pacing, cutting
    // and hanging plain sequential code; a client hang-up closes the channel.
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        tokio::pin!(stop);
        for (i, frame) in frames.into_iter().enumerate() {
            if i > 0 && !gap.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(gap) => {}
                    () = tx.closed() => return,
                    () = &mut stop => return,
                }
            }
            if tx.send(frame.bytes()).await.is_err() {
                return;
            }
        }
        match ending {
            Ending::Done => {
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            }
            Ending::Cut => {}
            Ending::Hang => {
                tokio::select! {
                    () = tx.closed() => {}
                    () = &mut stop => {}
                }
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|frame| (Ok::<_, Infallible>(frame), rx))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn error_response(status: StatusCode, message: impl Into<String>, kind: &str) -> Response {
    let body = json!({
        "error": { "message": message.into(), "type": kind, "param": null, "code": null }
    });
    (status, Json(body)).into_response()
}

/// Some clients list models on start-up as a health check.
async fn models() -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{ "id": "mock-llm", "object": "model", "created": 0, "owned_by": "agentfleet" }],
    }))
}

async fn logged_requests(State(state): State<MockState>) -> Json<Value> {
    Json(Value::Array(state.requests()))
}

fn first_user_text(messages: &[Value]) -> String {
    messages
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .map(Value::to_string)
        .unwrap_or_default()
}

fn assistant_count(messages: &[Value]) -> usize {
    messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventsource_stream::Eventsource as _;
    use futures_util::StreamExt as _;
    use std::collections::BTreeMap;

    /// The workspace builds reqwest with `rustls-no-provider`, so building a
    /// client panics until a process-wide crypto provider is installed.
    fn client() -> reqwest::Client {
        agentfleet_shared::telemetry::install_crypto();
        reqwest::Client::new()
    }

    async fn post(llm: &MockLlm, body: &Value) -> reqwest::Response {
        client()
            .post(format!("{}/chat/completions", llm.base_url()))
            .json(body)
            .send()
            .await
            .expect("request to mock-llm")
    }

    /// Reads an SSE response to its end and returns every `data` payload.
    async fn sse_data(response: reqwest::Response) -> Vec<String> {
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let mut events = response.bytes_stream().eventsource();
        let mut data = Vec::new();
        while let Some(event) = events.next().await {
            data.push(event.expect("well-formed SSE").data);
        }
        data
    }

    fn parse_chunks(data: &[String]) -> Vec<Value> {
        data.iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
            .collect()
    }

    fn user(content: &str) -> Value {
        json!({ "role": "user", "content": content })
    }

    #[tokio::test]
    async fn streamed_content_and_tool_calls_reassemble_exactly() {
        let llm = MockLlm::start().await.unwrap();
        let weather = json!({ "city": "Paris", "units": "metric" });
        let add = json!({ "a": 1, "b": 2.5, "note": "héllo ✓", "list": [1, 2, 3] });
        let turns = json!([{
            "content": "Let me check two things.",
            "chunks": 4,
            "tool_calls": [
                { "name": "get_weather", "arguments": weather },
                { "name": "add", "arguments": add },
            ],
        }]);
        let body = json!({
            "model": "gpt-test",
            "stream": true,
            "stream_options": { "include_usage": true },
            "messages": [{ "role": "system", "content": "be brief" }, user(&script(turns))],
        });
        let data = sse_data(post(&llm, &body).await).await;
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks = parse_chunks(&data);

        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({ "role": "assistant" })
        );
        let mut content = String::new();
        let mut content_pieces = 0;
        // index -> (id, name, arguments, argument pieces)
        let mut calls: BTreeMap<u64, (String, String, String, usize)> = BTreeMap::new();
        let mut finishes = Vec::new();
        for chunk in &chunks {
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["model"], "gpt-test");
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            if let Some(reason) = choice["finish_reason"].as_str() {
                finishes.push(reason.to_owned());
            }
            let delta = &choice["delta"];
            if let Some(piece) = delta["content"].as_str() {
                content.push_str(piece);
                content_pieces += 1;
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let entry = calls.entry(call["index"].as_u64().unwrap()).or_default();
                if let Some(id) = call["id"].as_str() {
                    assert_eq!(call["type"], "function");
                    entry.0 = id.to_owned();
                    entry.1 = call["function"]["name"].as_str().unwrap().to_owned();
                }
                let piece = call["function"]["arguments"].as_str().unwrap();
                if !piece.is_empty() {
                    entry.2.push_str(piece);
                    entry.3 += 1;
                }
            }
        }
        assert_eq!(content, "Let me check two things.");
        assert_eq!(content_pieces, 4);
        assert_eq!(finishes, ["tool_calls"]);
        assert_eq!(calls.len(), 2);
        let (id0, name0, args0, pieces0) = &calls[&0];
        let (id1, name1, args1, pieces1) = &calls[&1];
        assert!(id0.starts_with("call_") && id1.starts_with("call_") && id0 != id1);
        assert_eq!((name0.as_str(), name1.as_str()), ("get_weather", "add"));
        assert_eq!(args0, &weather.to_string());
        assert_eq!(args1, &add.to_string());
        assert_eq!(serde_json::from_str::<Value>(args1).unwrap(), add);
        assert_eq!((*pieces0, *pieces1), (4, 4));

        // The finish chunk comes last among choice chunks, then usage.
        let finish = &chunks[chunks.len() - 2];
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
        let usage = &chunks[chunks.len() - 1];
        assert_eq!(usage["choices"], json!([]));
        let u = &usage["usage"];
        assert!(u["prompt_tokens"].as_u64().unwrap() >= 1);
        assert!(u["completion_tokens"].as_u64().unwrap() >= 1);
        assert_eq!(
            u["total_tokens"].as_u64(),
            Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
        );
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn turn_is_chosen_by_assistant_message_count() {
        let llm = MockLlm::start().await.unwrap();
        let s = script(json!([{ "content": "one" }, { "content": "two" }, { "content": "three" }]));
        let assistant = json!({ "role": "assistant", "content": "x", "tool_calls": [
            { "id": "call_1", "type": "function", "function": { "name": "f", "arguments": "{}" } }] });
        let tool = json!({ "role": "tool", "tool_call_id": "call_1", "content": "42" });
        let mut messages = vec![user(&s)];
        for expected in ["one", "two", "three", "echo: go on"] {
            let body = json!({ "model": "m", "messages": messages });
            let reply: Value = post(&llm, &body).await.json().await.unwrap();
            assert_eq!(reply["choices"][0]["message"]["content"], expected);
            messages.extend([assistant.clone(), tool.clone(), user("go on")]);
        }
        assert_eq!(llm.request_count(), 4);
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn without_script_the_last_user_message_is_echoed() {
        let llm = MockLlm::start().await.unwrap();
        let messages = json!([
            { "role": "system", "content": "sys" },
            user("first"),
            { "role": "assistant", "content": "ok" },
            { "role": "user", "content": [{ "type": "text", "text": "hi there" }] },
        ]);
        let reply: Value = post(&llm, &json!({ "model": "m", "messages": messages }))
            .await
            .json()
            .await
            .unwrap();
        let choice = &reply["choices"][0];
        assert_eq!(choice["message"]["content"], "echo: hi there");
        assert_eq!(choice["finish_reason"], "stop");
        assert!(choice["message"].get("tool_calls").is_none());

        let body = json!({ "model": "m", "stream": true, "messages": [user("streamed")] });
        let chunks = parse_chunks(&sse_data(post(&llm, &body).await).await);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "echo: streamed");
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn scripted_status_fails_before_streaming() {
        let llm = MockLlm::start().await.unwrap();
        let s = script(json!([{ "status": 500, "error_message": "boom" }, { "status": 429 }]));
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let response = post(&llm, &body).await;
        assert_eq!(response.status(), 500);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["message"], "boom");
        assert_eq!(error["error"]["type"], "mock_error");

        let messages = json!([user(&s), { "role": "assistant", "content": "" }]);
        let response = post(&llm, &json!({ "model": "m", "messages": messages })).await;
        assert_eq!(response.status(), 429);
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn scripted_usage_is_sent_verbatim_and_false_sends_none() {
        let llm = MockLlm::start().await.unwrap();
        let usage = json!({ "prompt_tokens": 100, "completion_tokens": 7 });
        let s = script(json!([{ "content": "hi", "usage": usage }]));
        let reply: Value = post(&llm, &json!({ "model": "m", "messages": [user(&s)] }))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(reply["usage"], usage);
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let chunks = parse_chunks(&sse_data(post(&llm, &body).await).await);
        assert_eq!(chunks.last().unwrap()["usage"], usage);

        let s = script(json!([{ "content": "hi", "usage": false }]));
        let reply: Value = post(&llm, &json!({ "model": "m", "messages": [user(&s)] }))
            .await
            .json()
            .await
            .unwrap();
        assert!(reply.get("usage").is_none(), "{reply}");
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let chunks = parse_chunks(&sse_data(post(&llm, &body).await).await);
        assert!(chunks.iter().all(|c| c.get("usage").is_none()));
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn usage_is_a_deterministic_estimate() {
        let llm = MockLlm::start().await.unwrap();
        // Prompt: 8 chars -> 2 tokens. Reply "echo: 12345678": 14 chars -> 4 tokens.
        let body = json!({ "model": "m", "messages": [user("12345678")] });
        let reply: Value = post(&llm, &body).await.json().await.unwrap();
        let expected = json!({ "prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6 });
        assert_eq!(reply["usage"], expected);

        let body = json!({ "model": "m", "stream": true, "messages": [user("12345678")] });
        let data = sse_data(post(&llm, &body).await).await;
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks = parse_chunks(&data);
        let usage: Vec<&Value> = chunks.iter().filter(|c| c.get("usage").is_some()).collect();
        assert_eq!(usage.len(), 1);
        assert_eq!(usage[0]["usage"], expected);
        assert_eq!(usage[0]["choices"], json!([]));
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn non_streaming_completion_has_openai_shape() {
        let llm = MockLlm::start().await.unwrap();
        let args = json!({ "a": 2, "b": 3 });
        let s = script(json!([{ "tool_calls": [{ "name": "add", "arguments": args }] }]));
        let body =
            json!({ "model": "gpt-x", "stream": false, "messages": [user(&s)], "tools": [] });
        let response = post(&llm, &body).await;
        assert_eq!(response.status(), 200);
        let reply: Value = response.json().await.unwrap();
        assert_eq!(reply["object"], "chat.completion");
        assert_eq!(reply["model"], "gpt-x");
        assert!(reply["id"].as_str().unwrap().starts_with("chatcmpl-"));
        let choice = &reply["choices"][0];
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["finish_reason"], "tool_calls");
        let message = &choice["message"];
        assert_eq!(message["role"], "assistant");
        assert!(message["content"].is_null());
        let call = &message["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "add");
        let raw = call["function"]["arguments"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(raw).unwrap(), args);
        let usage = &reply["usage"];
        assert_eq!(
            usage["total_tokens"].as_u64(),
            Some(
                usage["prompt_tokens"].as_u64().unwrap()
                    + usage["completion_tokens"].as_u64().unwrap()
            )
        );
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn truncated_stream_has_no_finish_and_no_done() {
        let llm = MockLlm::start().await.unwrap();
        let s = script(json!([{ "content": "abcdefghij", "chunks": 5, "truncate": true }]));
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let data = sse_data(post(&llm, &body).await).await;
        // role + 5 content + finish + usage = 8 events; half are sent.
        assert_eq!(data.len(), 4);
        assert!(!data.iter().any(|d| d == "[DONE]"));
        for chunk in parse_chunks(&data) {
            assert!(chunk["choices"][0]["finish_reason"].is_null());
        }
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn hanging_stream_goes_silent_and_shutdown_still_completes() {
        let llm = MockLlm::start().await.unwrap();
        let s = script(json!([{ "content": "abcdef", "hang_after_chunks": 2 }]));
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let mut events = post(&llm, &body).await.bytes_stream().eventsource();
        for _ in 0..2 {
            events.next().await.unwrap().unwrap();
        }
        let silence = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
        assert!(silence.is_err(), "expected silence, got {silence:?}");
        tokio::time::timeout(Duration::from_secs(2), llm.shutdown())
            .await
            .expect("shutdown ends hanging streams");
    }

    #[tokio::test]
    async fn delays_hold_headers_and_pace_chunks() {
        let llm = MockLlm::start().await.unwrap();
        let s = script(json!([{ "content": "abc", "delay_ms": 300, "chunk_delay_ms": 50 }]));
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let started = Instant::now();
        let response = post(&llm, &body).await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        let data = sse_data(response).await;
        // role + 3 content + finish + usage: five 50 ms gaps after the first.
        assert_eq!(data.len(), 7);
        assert!(started.elapsed() >= Duration::from_millis(300 + 5 * 50));
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn requests_are_logged_unless_disabled() {
        let llm = MockLlm::start().await.unwrap();
        let first = json!({ "model": "m", "messages": [user("a")], "extra": { "x": 1 } });
        let second = json!({ "model": "m", "messages": [user("b")] });
        post(&llm, &first).await;
        post(&llm, &second).await;
        assert_eq!(llm.requests(), vec![first, second]);
        assert_eq!(llm.request_count(), 2);
        let recorded = llm.recorded();
        assert!(recorded[0].received_at <= recorded[1].received_at);
        llm.shutdown().await;

        let quiet = MockLlm::start_with(MockLlmOptions {
            log_requests: false,
            ..MockLlmOptions::default()
        })
        .await
        .unwrap();
        post(&quiet, &json!({ "model": "m", "messages": [user("a")] })).await;
        assert!(quiet.requests().is_empty());
        assert_eq!(quiet.request_count(), 1);
        quiet.shutdown().await;
    }

    #[tokio::test]
    async fn histories_openai_would_refuse_are_refused() {
        let llm = MockLlm::start().await.unwrap();
        let call = json!({ "role": "assistant", "content": null, "tool_calls": [
            { "id": "c1", "type": "function", "function": { "name": "f", "arguments": "{}" } }] });
        let answer = json!({ "role": "tool", "tool_call_id": "c1", "content": "ok" });
        let stray = json!({ "role": "tool", "tool_call_id": "zz", "content": "ok" });
        for (messages, ok) in [
            (json!([user("a"), call, answer, user("b")]), true),
            (json!([user("a"), call, user("b")]), false),
            (json!([user("a"), call]), false),
            (json!([user("a"), stray]), false),
        ] {
            let status = post(&llm, &json!({ "model": "m", "messages": messages }))
                .await
                .status();
            assert_eq!(status == 200, ok, "{messages}");
        }
        llm.shutdown().await;
    }

    #[tokio::test]
    async fn bad_requests_get_openai_style_errors() {
        let llm = MockLlm::start().await.unwrap();
        let response = post(&llm, &json!({ "model": "m" })).await;
        assert_eq!(response.status(), 400);
        let s = script(json!([{ "content": 5 }]));
        let response = post(&llm, &json!({ "model": "m", "messages": [user(&s)] })).await;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.unwrap();
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("turn 0")
        );
        llm.shutdown().await;
    }

    #[test]
    fn stamps_read_back_as_their_age() {
        let now = epoch_ms();
        assert_eq!(stamp_of(0), "0000");
        assert_eq!(stamp_of(35), "000z");
        assert_eq!(stamp_of(STAMP_MODULUS), "0000");
        for age in [0, 1, 149, 60_000, STAMP_MODULUS - 1] {
            let stamp = stamp_of(now - age);
            assert_eq!(stamp.len(), STAMP_LEN);
            assert_eq!(stamp_age_ms(&stamp, now), Some(age), "{stamp}");
        }
        assert_eq!(stamp_age_ms("ab", now), None);
        assert_eq!(stamp_age_ms("ab-c", now), None);
    }

    #[tokio::test]
    async fn stamped_pieces_carry_their_send_time_and_calls_their_own_pieces() {
        let llm = MockLlm::start().await.unwrap();
        let s = script(json!([{
            "content": "xxxx".repeat(5), "chunks": 5, "stamp": true, "chunk_delay_ms": 20,
            "call_chunks": 2, "tool_calls": [{ "name": "slow", "arguments": { "ms": 300 } }],
        }]));
        let body = json!({ "model": "m", "stream": true, "messages": [user(&s)] });
        let mut events = post(&llm, &body).await.bytes_stream().eventsource();
        let (mut stamps, mut arguments) = (Vec::new(), Vec::new());
        while let Some(event) = events.next().await {
            let data = event.unwrap().data;
            let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            let delta = &chunk["choices"][0]["delta"];
            if let Some(piece) = delta["content"].as_str() {
                let age = stamp_age_ms(piece, epoch_ms()).expect("a stamp");
                assert!(age < 1000, "{piece} is {age} ms old");
                stamps.push(piece.to_owned());
            }
            if let Some(piece) = delta["tool_calls"][0]["function"]["arguments"].as_str()
                && !piece.is_empty()
            {
                arguments.push(piece.to_owned());
            }
        }
        assert_eq!(stamps.len(), 5);
        assert!(stamps.windows(2).all(|w| w[0] != w[1]), "{stamps:?}");
        assert_eq!(arguments.concat(), r#"{"ms":300}"#);
        assert_eq!(arguments.len(), 2);
        llm.shutdown().await;
    }

    #[test]
    fn split_pieces_respects_char_boundaries_and_counts() {
        assert_eq!(split_pieces("abcdef", 3), ["ab", "cd", "ef"]);
        assert_eq!(split_pieces("ab", 5), ["a", "b"]);
        assert_eq!(split_pieces("héé✓", 2), ["hé", "é✓"]);
        assert_eq!(split_pieces("abc", 0), ["abc"]);
        assert!(split_pieces("", 3).is_empty());
        let text = "a✓b✓c✓d";
        for n in 1..10 {
            let parts = split_pieces(text, n);
            assert_eq!(parts.len(), n.min(7));
            assert_eq!(parts.concat(), text);
        }
    }
}
