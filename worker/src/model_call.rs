//! One call to an OpenAI-compatible chat-completions endpoint, streaming, with native tool
//! calls (or, for a model in XML mode, calls parsed from the text: `xml_calls`). Text is
//! forwarded as coalesced `message_delta` events while it streams.
//!
//! Failures before the first byte of the answer (connection errors, 429, 5xx) are retried with
//! exponential backoff and jitter, honouring `Retry-After`. Once text has been streamed to
//! clients the call is not retried: a malformed, truncated or silent stream fails the call.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use serde_json::{Value, json};

use agentfleet_shared::config::{ModelSettings, ToolCalling, WorkerSettings};
use agentfleet_shared::events::{EventType, Expiry};
use agentfleet_shared::sanitize::strip_nul_in;

use crate::bounded::{self, LimitError};
use crate::emitter::{Emitter, Fenced};
use crate::history::History;
pub use crate::model_stream::{ModelResponse, ModelToolCall, Usage};
use crate::model_stream::{StreamError, StreamParser, truncate};
use crate::xml_calls::XmlCalls;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model `{0}` is not configured on this worker")]
    UnknownModel(String),
    #[error("could not reach the model: {0}")]
    Connect(String),
    #[error("the model answered HTTP {status}: {body}")]
    Status {
        status: u16,
        body: String,
        retry_after: Option<Duration>,
    },
    #[error("no response from the model within {0:?}")]
    FirstByteTimeout(Duration),
    #[error("the model stream was silent for {0:?}")]
    IdleTimeout(Duration),
    #[error("the model call exceeded its total deadline of {0:?}")]
    TotalTimeout(Duration),
    #[error("malformed model stream: {0}")]
    Malformed(String),
    #[error("the model stream ended before the response was complete")]
    Truncated,
    #[error("the model's response exceeded {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Fenced(#[from] Fenced),
}

impl From<StreamError> for ModelError {
    fn from(e: StreamError) -> ModelError {
        match e {
            StreamError::Malformed(m) => ModelError::Malformed(m),
            StreamError::Truncated => ModelError::Truncated,
        }
    }
}

impl ModelError {
    fn retryable(&self) -> bool {
        match self {
            ModelError::Connect(_) | ModelError::FirstByteTimeout(_) => true,
            ModelError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// What the run's error says to its tenant: the kind of failure, never the gateway's
    /// address or the provider's error body (those are in the worker's logs).
    pub fn tenant_message(&self) -> String {
        match self {
            ModelError::UnknownModel(m) => format!("model `{m}` is not configured"),
            ModelError::Connect(_) => "the model could not be reached".into(),
            ModelError::Status { status, .. } => format!("the model answered HTTP {status}"),
            ModelError::Malformed(_) => "the model's stream was malformed".into(),
            other => other.to_string(),
        }
    }

    /// A short code for the run's error record.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::UnknownModel(_) => "unknown_model",
            ModelError::Status { .. } => "model_http_error",
            ModelError::FirstByteTimeout(_)
            | ModelError::IdleTimeout(_)
            | ModelError::TotalTimeout(_) => "model_timeout",
            ModelError::Malformed(_) | ModelError::Truncated => "model_stream_error",
            ModelError::TooLarge(_) => "model_response_too_large",
            ModelError::Connect(_) => "model_unreachable",
            ModelError::Fenced(_) => "fenced",
        }
    }
}

pub struct ModelRequest<'a> {
    pub model: &'a ModelSettings,
    pub messages: Messages,
    /// The catalog's definitions as they are, or a copy when this call offers more or none.
    pub tools: Cow<'a, [Value]>,
    /// `tools` serialised, when they are the catalog's as they are: the catalog serialises
    /// them once (it is shared by the holdings of one agent), not every model call.
    pub tools_json: Option<&'a str>,
}

/// A request's messages: the system prompt, then the history, both as the holding keeps them
/// serialised (`RunCtx::system`, `RunCtx::history`) and shared: a long run's history, or a long
/// system prompt, would otherwise be cloned, dropped and serialised again at every model call
/// (`perf`, ten tool turns of 2 KB: the clone an eighth of a worker's samples, the
/// serialisation a tenth).
#[derive(Debug)]
pub struct Messages {
    /// No message, or the system message.
    pub system: Arc<History>,
    pub history: Arc<History>,
}

impl Messages {
    pub fn len(&self) -> usize {
        self.system.len() + self.history.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &Value> {
        self.system.iter().chain(self.history.iter())
    }

    /// Appends the messages as a JSON array: the history's JSON as it is kept.
    fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        self.system.write_json(out);
        if !self.system.is_empty() && !self.history.is_empty() {
            out.push(b',');
        }
        self.history.write_json(out);
        out.push(b']');
    }
}

/// Messages built for one request (no system prompt apart).
impl From<Vec<Value>> for Messages {
    fn from(messages: Vec<Value>) -> Messages {
        Messages {
            system: Arc::default(),
            history: Arc::new(History::for_one_request(messages)),
        }
    }
}

/// The fields of a chat-completions body besides its messages and tools, in the order `json!`
/// used to give them (sorted). Those two follow as JSON already written: the history as the
/// holding keeps it serialised, the tools as their catalog serialised them (it is shared by
/// the holdings of one agent).
#[derive(serde::Serialize)]
struct RequestHead<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    model: &'a str,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

/// The request's body, built once per model call (every attempt sends the same bytes).
fn body(req: &ModelRequest<'_>) -> Vec<u8> {
    let head = RequestHead {
        max_tokens: req.model.max_tokens,
        model: &req.model.model,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        temperature: req.model.temperature,
    };
    let tools: Cow<'_, [u8]> = match req.tools_json {
        Some(tools) => Cow::Borrowed(tools.as_bytes()),
        None => Cow::Owned(serde_json::to_vec(&*req.tools).expect("tool definitions serialise")),
    };
    // Sized for what is known up front, so a long history is copied once, not regrown.
    let known = req.messages.system.json_len() + req.messages.history.json_len() + tools.len();
    let mut out = Vec::with_capacity(known + 512);
    serde_json::to_writer(&mut out, &head).expect("a request head serialises");
    out.pop(); // its closing brace
    out.extend_from_slice(b",\"messages\":");
    req.messages.write_json(&mut out);
    if &*tools != b"[]" {
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(&tools);
    }
    out.push(b'}');
    out
}

#[derive(serde::Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// How streamed text becomes `message_delta` events, and what that cost the call.
pub struct DeltaPolicy {
    pub flush_after: Duration,
    pub flush_bytes: usize,
    /// Microseconds the call waited for its deltas' place in the stream (framework time,
    /// not the model's: the caller takes it off the call's time).
    pub waited_us: std::sync::atomic::AtomicU64,
}

/// Calls the model with retries; the whole thing is bounded by the total deadline. The
/// caller's span (`model.call`) is current throughout.
pub async fn call(
    http: &crate::model_http::ModelClients,
    settings: &WorkerSettings,
    req: &ModelRequest<'_>,
    emitter: &Emitter,
    policy: &DeltaPolicy,
) -> Result<ModelResponse, ModelError> {
    let total = Duration::from_millis(settings.model_total_timeout_ms);
    let started = Instant::now();
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(settings.model_retry_base_ms))
        .with_max_delay(Duration::from_millis(settings.model_retry_max_ms))
        .with_max_times(settings.model_max_retries)
        .with_jitter();
    let retry_after_max = Duration::from_millis(settings.model_retry_after_max_ms);
    let body = bytes::Bytes::from(body(req));
    // Each attempt takes the least busy connection of its own: a retry may go elsewhere.
    let attempt = || async {
        let lease = http.lease(req.model);
        call_once(lease.client(), settings, req, body.clone(), emitter, policy).await
    };
    let result = tokio::time::timeout(
        total,
        attempt
            .retry(backoff)
            .when(|e: &ModelError| e.retryable())
            // `Retry-After` only sets the delay of a retry the count allows: `d` is `None`
            // once the retries are spent, and then no header can add one.
            .adjust(|e: &ModelError, d| {
                d.map(|d| e.retry_after().map_or(d, |ra| ra.min(retry_after_max)))
            })
            .notify(|e: &ModelError, d| {
                metrics::counter!("agentfleet_model_retries_total").increment(1);
                tracing::warn!(error = %e, delay_ms = d.as_millis() as u64, "model call failed; retrying");
            }),
    )
    .await
    .unwrap_or(Err(ModelError::TotalTimeout(total)));
    metrics::histogram!("agentfleet_model_call_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    result
}

async fn call_once(
    http: &reqwest::Client,
    settings: &WorkerSettings,
    req: &ModelRequest<'_>,
    body: bytes::Bytes,
    emitter: &Emitter,
    policy: &DeltaPolicy,
) -> Result<ModelResponse, ModelError> {
    let builder = match req.model.chat_completions_url() {
        Some(url) => http.post(url.clone()),
        None => http.post(req.model.chat_completions_text()),
    };
    let mut builder = builder
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    // W3C trace context of the `model.call` span (nothing when traces are not exported), so a
    // gateway that traces joins the run's trace.
    for (name, value) in agentfleet_shared::telemetry::current_trace_headers() {
        builder = builder.header(name, value);
    }
    if !req.model.api_key.is_empty() {
        builder = builder.bearer_auth(&req.model.api_key);
    }
    let first_byte = Duration::from_millis(settings.model_first_byte_timeout_ms);
    let response = tokio::time::timeout(first_byte, builder.send())
        .await
        .map_err(|_| ModelError::FirstByteTimeout(first_byte))?
        .map_err(|e| ModelError::Connect(error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Bounded: an error page of any size costs at most this much, and a body that stalls
        // at most the idle time-out (the status alone decides what happens next).
        let idle = Duration::from_millis(settings.model_idle_timeout_ms);
        let text = tokio::time::timeout(idle, bounded::read(response, 2048))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|b| b.text())
            .unwrap_or_default();
        return Err(ModelError::Status {
            status: status.as_u16(),
            body: truncate(&text, 500),
            retry_after,
        });
    }
    let idle = Duration::from_millis(settings.model_idle_timeout_ms);
    let cap = settings.max_model_response_bytes;
    let max_calls = settings.max_tool_calls_per_response;
    let xml = (req.model.tool_calling == ToolCalling::Xml).then(|| XmlCalls::new(max_calls));
    read_stream(response, idle, cap, max_calls, emitter, policy, xml).await
}

/// Buffers streamed text and flushes it as one `message_delta` by time or size.
struct Coalescer<'a> {
    emitter: &'a Emitter,
    buf: String,
    since: Option<tokio::time::Instant>,
    policy: &'a DeltaPolicy,
}

impl Coalescer<'_> {
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.since.map(|s| s + self.policy.flush_after)
    }

    async fn push(&mut self, text: &str) -> Result<(), Fenced> {
        if self.buf.is_empty() {
            self.since = Some(tokio::time::Instant::now());
        }
        self.buf.push_str(text);
        if self.buf.len() >= self.policy.flush_bytes {
            self.flush().await?;
        }
        Ok(())
    }

    /// Hands the buffered text to the emitter, behind the reader: the append runs while the
    /// stream is read on (a crash loses a delta in the same moments either way, and clients
    /// drop an interrupted iteration's deltas). The reader waits only while the previous
    /// append still holds the stream's order, and that wait is counted as framework time.
    async fn flush(&mut self) -> Result<(), Fenced> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let text = std::mem::take(&mut self.buf);
        self.since = None;
        let waiting = Instant::now();
        let handed = self
            .emitter
            .emit_behind(EventType::MessageDelta, json!({"text": text}))
            .await;
        self.policy.waited_us.fetch_add(
            waiting.elapsed().as_micros() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        handed
    }

    /// The text left when the stream ends goes out with the holder's next event (the turn's
    /// `message_completed`, after its commit), not on its own: a round trip less on the turn's
    /// path, and the commit's recorded ids count it without waiting for an append.
    fn defer_rest(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let text = std::mem::take(&mut self.buf);
        self.since = None;
        self.emitter
            .defer(EventType::MessageDelta, json!({"text": text}), Expiry::Keep);
    }
}

async fn read_stream(
    response: reqwest::Response,
    idle: Duration,
    cap: usize,
    max_calls: usize,
    emitter: &Emitter,
    policy: &DeltaPolicy,
    mut xml: Option<XmlCalls>,
) -> Result<ModelResponse, ModelError> {
    // Bounded before the SSE decoder, which buffers until a newline: a stream without one
    // would otherwise grow without limit; and given to it a line at a time (`bounded::lines`),
    // without the fields that could make it panic or copy without end (`bounded::for_sse`).
    let lines = bounded::lines(bounded::limit(response.bytes_stream(), cap));
    let events = bounded::for_sse(lines).eventsource();
    tokio::pin!(events);
    let mut parser = StreamParser::new(max_calls);
    let mut coalescer = Coalescer {
        emitter,
        buf: String::new(),
        since: None,
        policy,
    };
    while !parser.is_done() {
        let next = match coalescer.deadline() {
            Some(deadline) => tokio::select! {
                n = tokio::time::timeout(idle, events.next()) => n,
                _ = tokio::time::sleep_until(deadline) => {
                    coalescer.flush().await?;
                    continue;
                }
            },
            None => tokio::time::timeout(idle, events.next()).await,
        };
        let event = match next {
            Err(_) => return Err(ModelError::IdleTimeout(idle)),
            Ok(None) => break,
            Ok(Some(Err(EventStreamError::Transport(LimitError::TooLarge(_))))) => {
                return Err(ModelError::TooLarge(cap));
            }
            Ok(Some(Err(e))) => return Err(ModelError::Malformed(e.to_string())),
            Ok(Some(Ok(ev))) => ev,
        };
        if let Some(text) = parser.feed(&event.data)? {
            // In XML mode clients see the text outside the call blocks only.
            let shown = match xml.as_mut() {
                Some(x) => x.feed(&text),
                None => text,
            };
            if !shown.is_empty() {
                coalescer.push(&shown).await?;
            }
        }
    }
    let mut response = parser.finish()?;
    if let Some(x) = xml {
        let (rest, mut visible, calls) = x.finish().map_err(ModelError::Malformed)?;
        // Native and XML calls together are held to the one limit.
        if response.tool_calls.len() + calls.len() > max_calls {
            return Err(ModelError::Malformed(format!(
                "more than {max_calls} tool calls in one response"
            )));
        }
        coalescer.push(&rest).await?;
        strip_nul_in(&mut visible);
        response.content = visible;
        for mut call in calls {
            strip_nul_in(&mut call.name);
            strip_nul_in(&mut call.arguments);
            response.tool_calls.push(call);
        }
    }
    coalescer.defer_rest();
    Ok(response)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn model(max_tokens: Option<u32>, temperature: Option<f32>) -> ModelSettings {
        serde_json::from_value(json!({"base_url": "http://127.0.0.1:1/v1", "model": "m",
                                      "max_tokens": max_tokens, "temperature": temperature}))
        .unwrap()
    }

    /// The body of a request, as text and parsed.
    fn sent(
        model: &ModelSettings,
        messages: Messages,
        tools: &[Value],
        tools_json: Option<&str>,
    ) -> (String, Value) {
        let req = ModelRequest {
            model,
            messages,
            tools: Cow::Borrowed(tools),
            tools_json,
        };
        let text = String::from_utf8(body(&req)).unwrap();
        let parsed = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (text, parsed)
    }

    /// Tools serialised once by the catalog go out exactly as the body would have written
    /// them; none (or `[]`) leaves the field out.
    #[test]
    fn tools_serialised_ahead_go_out_as_serialising_them_would() {
        let messages = || Messages::from(vec![json!({"role": "user", "content": "hi \"there\""})]);
        let tools = vec![
            json!({"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}),
            json!({"type": "function", "function": {"name": "ask_user"}}),
        ];
        let tools_json = serde_json::to_string(&tools).unwrap();
        for m in [model(None, None), model(Some(64), Some(0.7))] {
            let (whole, parsed) = sent(&m, messages(), &tools, None);
            let (spliced, _) = sent(&m, messages(), &[], Some(&tools_json));
            assert_eq!(spliced, whole);
            assert_eq!(parsed["tools"], json!(tools));
            for (tools, json) in [(&[][..], None), (&[][..], Some("[]"))] {
                let (_, parsed) = sent(&m, messages(), tools, json);
                assert!(parsed.get("tools").is_none(), "{parsed}");
            }
        }
    }

    /// The body leaves out what the model's settings do not set; a temperature goes out as
    /// written (`0.7`, not the `f64` widening of an `f32`).
    #[test]
    fn a_request_body_carries_only_what_is_set() {
        let messages = || Messages::from(vec![json!({"role": "user", "content": "hi"})]);
        let tools = vec![json!({"type": "function", "function": {"name": "echo"}})];
        let (_, parsed) = sent(&model(None, None), messages(), &[], None);
        assert_eq!(
            parsed,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,
                   "stream_options": {"include_usage": true}})
        );
        let (text, full) = sent(&model(Some(256), Some(0.7)), messages(), &tools, None);
        assert_eq!(full["max_tokens"], 256);
        assert_eq!(full["tools"], json!(tools));
        assert!(text.contains(r#""temperature":0.7"#), "{text}");
    }

    /// The system prompt goes first, then the history as the holding keeps it serialised,
    /// shared rather than copied; an empty part leaves no stray comma.
    #[test]
    fn a_shared_history_goes_out_after_the_system_prompt() {
        let system = json!({"role": "system", "content": "be brief"});
        let kept = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "hello \u{1F600} \"quoted\"\n"}),
        ];
        let history = Arc::new(History::from(kept.clone()));
        let lead = Arc::new(History::from(vec![system.clone()]));
        let cases = [
            (
                Arc::clone(&lead),
                Arc::clone(&history),
                json!([system, kept[0], kept[1]]),
            ),
            (Arc::default(), Arc::clone(&history), json!(kept)),
            (Arc::clone(&lead), Arc::default(), json!([system])),
            (Arc::default(), Arc::default(), json!([])),
        ];
        for (system, history, expected) in cases {
            let messages = Messages { system, history };
            assert_eq!(messages.len(), expected.as_array().unwrap().len());
            let (_, parsed) = sent(&model(None, None), messages, &[], None);
            assert_eq!(parsed["messages"], expected);
        }
        let messages = Messages {
            system: Arc::clone(&lead),
            history: Arc::clone(&history),
        };
        assert_eq!(Arc::strong_count(&history), 2, "shared, not copied");
        assert_eq!(Arc::strong_count(&lead), 2, "shared, not copied");
        drop(messages);
    }
}
