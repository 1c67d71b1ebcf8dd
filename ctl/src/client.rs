//! The HTTP client: bearer key, timeouts, bounded reads, and bounded retries with backoff on
//! what is worth retrying (connection errors, timeouts, 429, 5xx), honouring `Retry-After`.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

use crate::config::Connection;
use crate::error::{ApiRefusal, CtlError, Result};

/// A JSON answer larger than this is not one the API sends (a page of runs is far smaller).
const MAX_JSON_BYTES: usize = 32 * 1024 * 1024;
/// A refusal's body is a short error document.
const MAX_ERROR_BYTES: usize = 64 * 1024;
/// A `Retry-After` longer than this is capped: the command would look hung otherwise.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Whether a request may be sent again after an answer that could mean it was carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// GETs, cancels and keyed creations: repeating them changes nothing.
    Idempotent,
    /// Only when the request surely did nothing (connection refused, 429).
    Once,
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    conn: Connection,
    /// Bounds each whole request/answer exchange (streams excepted).
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
    /// The first backoff; doubled per attempt up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Client {
    pub fn new(conn: Connection, timeout: Duration, retries: u32) -> Result<Client> {
        crate::install_crypto();
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("agentfleetctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CtlError::Usage(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            http,
            conn,
            timeout,
            retries,
            backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(10),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.conn.api)
    }

    /// A request with the key; `timeout` bounds the whole exchange (None: a stream).
    pub fn request(&self, method: Method, path: &str, timeout: Option<Duration>) -> RequestBuilder {
        let rb = self
            .http
            .request(method, self.url(path))
            .bearer_auth(&self.conn.key);
        match timeout {
            Some(t) => rb.timeout(t),
            None => rb,
        }
    }

    /// Sends `make()` until it gets an answer that is not worth retrying, or the retries run
    /// out. 2xx is returned; 4xx becomes `CtlError::Api`; 5xx/429/network errors after the
    /// last retry become `CtlError::Unavailable` (with the API's code when it sent one).
    pub async fn send(&self, retry: Retry, make: impl Fn() -> RequestBuilder) -> Result<Response> {
        self.send_within(retry, self.timeout, make).await
    }

    /// `send` with another bound on the wait for the answer's head (a large upload).
    pub async fn send_within(
        &self,
        retry: Retry,
        head: Duration,
        make: impl Fn() -> RequestBuilder,
    ) -> Result<Response> {
        let mut attempt = 0u32;
        loop {
            // Bounds the wait for the answer's head, streams included (their body is
            // bounded by the caller's idle timeout).
            let outcome = match tokio::time::timeout(head, make().send()).await {
                Ok(o) => o.map_err(Some),
                Err(_) => Err(None),
            };
            let last = attempt >= self.retries;
            let wait = match outcome {
                Ok(resp) if resp.status().is_success() => return Ok(resp),
                Ok(resp) => {
                    let status = resp.status();
                    let transient = status == StatusCode::TOO_MANY_REQUESTS
                        || (status.is_server_error() && retry == Retry::Idempotent);
                    if !transient || last {
                        let refusal = refusal(resp).await;
                        return Err(
                            if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                                CtlError::Unavailable(refusal.to_string())
                            } else {
                                CtlError::Api(refusal)
                            },
                        );
                    }
                    retry_after(&resp).unwrap_or_else(|| self.backoff_for(attempt))
                }
                Err(e) => {
                    // `None`: no answer within the timeout.
                    let surely_unsent = e.as_ref().is_some_and(reqwest::Error::is_connect);
                    let transient = surely_unsent || retry == Retry::Idempotent;
                    if !transient || last {
                        let why = match &e {
                            Some(e) => describe(e),
                            None => format!("no answer within {}s", head.as_secs()),
                        };
                        return Err(CtlError::Unavailable(why));
                    }
                    self.backoff_for(attempt)
                }
            };
            attempt += 1;
            tokio::time::sleep(wait).await;
        }
    }

    fn backoff_for(&self, attempt: u32) -> Duration {
        let exp = self.backoff.saturating_mul(1u32 << attempt.min(16));
        exp.min(self.max_backoff)
    }

    /// `send`, then the body as JSON (bounded).
    pub async fn json(
        &self,
        retry: Retry,
        make: impl Fn() -> RequestBuilder,
    ) -> Result<(StatusCode, Value)> {
        let resp = self.send(retry, make).await?;
        let status = resp.status();
        let bytes = read_bounded(resp, MAX_JSON_BYTES).await?;
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| CtlError::Protocol(format!("the answer is not JSON: {e}")))?;
        Ok((status, v))
    }

    pub async fn get_json(&self, path: &str) -> Result<Value> {
        self.json(Retry::Idempotent, || {
            self.request(Method::GET, path, Some(self.timeout))
        })
        .await
        .map(|(_, v)| v)
    }

    pub async fn post_json(&self, path: &str, body: Option<&Value>, retry: Retry) -> Result<Value> {
        self.json(retry, || {
            let rb = self.request(Method::POST, path, Some(self.timeout));
            match body {
                Some(b) => rb.json(b),
                None => rb,
            }
        })
        .await
        .map(|(_, v)| v)
    }
}

/// `path?k=v&…`, encoded (reqwest is built without its `query` feature).
pub fn with_query(path: &str, pairs: &[(&str, String)]) -> String {
    if pairs.is_empty() {
        return path.to_owned();
    }
    let mut url = reqwest::Url::parse("http://localhost/").expect("a constant URL");
    url.query_pairs_mut()
        .extend_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())));
    format!("{path}?{}", url.query().unwrap_or_default())
}

/// The error without the URL's query (which could hold a stream token) or the key.
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut msg = kind.to_owned();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

fn retry_after(resp: &Response) -> Option<Duration> {
    let secs: u64 = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Reads a refused answer into the API's `code` and `message` (or a stand-in).
pub async fn refusal(resp: Response) -> ApiRefusal {
    let status = resp.status().as_u16();
    let body = read_bounded(resp, MAX_ERROR_BYTES)
        .await
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let text = |k: &str| v["error"][k].as_str().map(|s| clip(s, 500));
    ApiRefusal {
        status,
        code: text("code").unwrap_or_else(|| format!("http_{status}")),
        message: text("message").unwrap_or_else(|| {
            StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("error")
                .to_owned()
        }),
    }
}

/// Reads at most `limit` bytes of a body; more is a protocol error.
pub async fn read_bounded(resp: Response, limit: usize) -> Result<Bytes> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(CtlError::Protocol(format!(
            "answer larger than {limit} bytes"
        )));
    }
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| CtlError::Unavailable(describe(&e)))?;
        if out.len() + chunk.len() > limit {
            return Err(CtlError::Protocol(format!(
                "answer larger than {limit} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// Cuts text from the server for display.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
