//! One call to an OpenAI-compatible chat-completions endpoint, streaming, with native tool
//! calls. Text is forwarded as coalesced `message_delta` events while it streams.
//!
//! Failures before the first byte of the answer (connection errors, 429, 5xx) are retried with
//! exponential backoff and jitter, honouring `Retry-After`. Once text has been streamed to
//! clients the call is not retried: a malformed, truncated or silent stream fails the call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use agentfleet_shared::config::{ModelSettings, WorkerSettings};
use agentfleet_shared::events::EventType;

use crate::emitter::{Emitter, Fenced};

#[derive(Debug, Clone)]
pub struct ModelToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

#[derive(Debug, Clone)]
pub struct ModelResponse {
    pub content: String,
    pub tool_calls: Vec<ModelToolCall>,
    pub usage: Usage,
    pub finish_reason: Option<String>,
}

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
    #[error(transparent)]
    Fenced(#[from] Fenced),
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

    /// A short code for the run's error record.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::UnknownModel(_) => "unknown_model",
            ModelError::Status { .. } => "model_http_error",
            ModelError::FirstByteTimeout(_)
            | ModelError::IdleTimeout(_)
            | ModelError::TotalTimeout(_) => "model_timeout",
            ModelError::Malformed(_) | ModelError::Truncated => "model_stream_error",
            ModelError::Connect(_) => "model_unreachable",
            ModelError::Fenced(_) => "fenced",
        }
    }
}

pub struct ModelRequest<'a> {
    pub model: &'a ModelSettings,
    pub messages: Vec<Value>,
    pub tools: Vec<Value>,
}

pub struct DeltaPolicy {
    pub flush_after: Duration,
    pub flush_bytes: usize,
}

/// Calls the model with retries; the whole thing is bounded by the total deadline.
#[tracing::instrument(name = "model_call", skip_all, fields(model = %req.model.model, messages = req.messages.len()))]
pub async fn call(
    http: &reqwest::Client,
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
    let attempt = || async { call_once(http, settings, req, emitter, policy).await };
    let result = tokio::time::timeout(
        total,
        attempt
            .retry(backoff)
            .when(|e: &ModelError| e.retryable())
            .adjust(|e: &ModelError, d| e.retry_after().map(|ra| ra.min(Duration::from_secs(60))).or(d))
            .notify(|e: &ModelError, d| {
                metrics::counter!("agentfleet_model_retries_total").increment(1);
                tracing::warn!(error = %e, delay_ms = d.as_millis() as u64, "model call failed; retrying");
            }),
    )
    .await
    .unwrap_or(Err(ModelError::TotalTimeout(total)));
    metrics::histogram!("agentfleet_model_call_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    if let Ok(r) = &result {
        metrics::counter!("agentfleet_tokens_total", "kind" => "prompt")
            .increment(r.usage.prompt_tokens as u64);
        metrics::counter!("agentfleet_tokens_total", "kind" => "completion")
            .increment(r.usage.completion_tokens as u64);
    }
    result
}

async fn call_once(
    http: &reqwest::Client,
    settings: &WorkerSettings,
    req: &ModelRequest<'_>,
    emitter: &Emitter,
    policy: &DeltaPolicy,
) -> Result<ModelResponse, ModelError> {
    let mut body = json!({
        "model": req.model.model,
        "messages": req.messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(req.tools.clone());
    }
    if let Some(m) = req.model.max_tokens {
        body["max_tokens"] = json!(m);
    }
    if let Some(t) = req.model.temperature {
        body["temperature"] = json!(t);
    }
    let url = format!(
        "{}/chat/completions",
        req.model.base_url.trim_end_matches('/')
    );
    let mut builder = http.post(url).json(&body);
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
        let text = response.text().await.unwrap_or_default();
        return Err(ModelError::Status {
            status: status.as_u16(),
            body: truncate(&text, 500),
            retry_after,
        });
    }
    let idle = Duration::from_millis(settings.model_idle_timeout_ms);
    read_stream(response, idle, emitter, policy).await
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: i64,
    #[serde(default)]
    completion_tokens: i64,
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

    async fn flush(&mut self) -> Result<(), Fenced> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let text = std::mem::take(&mut self.buf);
        self.since = None;
        self.emitter
            .emit(EventType::MessageDelta, json!({"text": text}))
            .await
    }
}

async fn read_stream(
    response: reqwest::Response,
    idle: Duration,
    emitter: &Emitter,
    policy: &DeltaPolicy,
) -> Result<ModelResponse, ModelError> {
    let mut events = response.bytes_stream().eventsource();
    let mut content = String::new();
    let mut calls: BTreeMap<usize, ModelToolCall> = BTreeMap::new();
    let mut usage = Usage::default();
    let mut finish_reason = None;
    let mut done = false;
    let mut coalescer = Coalescer {
        emitter,
        buf: String::new(),
        since: None,
        policy,
    };
    loop {
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
            Ok(Some(Err(e))) => return Err(ModelError::Malformed(e.to_string())),
            Ok(Some(Ok(ev))) => ev,
        };
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ModelError::Malformed(format!("{e}: {}", truncate(data, 200))))?;
        if let Some(u) = chunk.usage {
            usage = Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            };
        }
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                content.push_str(&text);
                coalescer.push(&text).await?;
            }
            for tc in choice.delta.tool_calls {
                let entry = calls.entry(tc.index).or_insert_with(|| ModelToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                if let Some(id) = tc.id {
                    entry.id = id;
                }
                if let Some(f) = tc.function {
                    if let Some(n) = f.name {
                        entry.name.push_str(&n);
                    }
                    if let Some(a) = f.arguments {
                        entry.arguments.push_str(&a);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                finish_reason = choice.finish_reason;
            }
        }
    }
    if !done && finish_reason.is_none() {
        return Err(ModelError::Truncated);
    }
    coalescer.flush().await?;
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (index, mut call) in calls {
        if call.name.is_empty() {
            return Err(ModelError::Malformed(format!(
                "tool call #{index} has no function name"
            )));
        }
        if call.id.is_empty() {
            call.id = format!("call_{index}_{}", uuid::Uuid::new_v4().simple());
        }
        tool_calls.push(call);
    }
    Ok(ModelResponse {
        content,
        tool_calls,
        usage,
        finish_reason,
    })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
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
