//! HTTP tools: POST `{run_id, tool_call_id, arguments}` with `Idempotency-Key:
//! <run_id>:<tool_call_id>`, so a call dispatched again after a crash can be deduplicated by the
//! tool server, and `traceparent` when traces are exported. A 2xx body is the result; anything
//! else is an error result the model sees.

use std::time::Duration;

use reqwest::Url;
use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::egress::{DENIED_MESSAGE, EgressPolicy};

use super::egress;
use crate::bounded;

pub struct HttpOutcome {
    pub ok: bool,
    /// Parsed JSON body, or the body as a string.
    pub result: Value,
    /// What the model sees.
    pub model_content: String,
    /// The answer was longer than `worker.max_tool_result_bytes` and was cut off.
    pub truncated: bool,
}

/// An error answer's body is quoted to the model up to this many bytes.
const ERROR_BODY_BYTES: usize = 2048;

#[allow(clippy::too_many_arguments)]
pub async fn call(
    http: &reqwest::Client,
    policy: &EgressPolicy,
    url: &str,
    run_id: Uuid,
    tool_call_id: &str,
    arguments: &Value,
    timeout: Duration,
    max_result_bytes: usize,
) -> HttpOutcome {
    let Ok(url) = Url::parse(url) else {
        return error_outcome("the tool's URL is not valid".into());
    };
    if policy.check_url(&url).is_err() {
        metrics::counter!("agentfleet_egress_denied_total", "stage" => "url").increment(1);
        return error_outcome(DENIED_MESSAGE.into());
    }
    let late = || format!("the tool did not answer within {} ms", timeout.as_millis());
    let body = json!({"run_id": run_id, "tool_call_id": tool_call_id, "arguments": arguments});
    let mut request = http
        .post(url)
        .header("Idempotency-Key", format!("{run_id}:{tool_call_id}"));
    // W3C trace context of the `tool.call` span (nothing when traces are not exported): a tool
    // that traces continues the run's trace.
    for (name, value) in agentfleet_shared::telemetry::current_trace_headers() {
        request = request.header(name, value);
    }
    let request = request.json(&body).timeout(timeout).send();
    let response = match request.await {
        Ok(r) => r,
        Err(e) if egress::is_denied(&e) => return error_outcome(DENIED_MESSAGE.into()),
        Err(e) if e.is_timeout() => return error_outcome(late()),
        Err(e) if e.is_redirect() => {
            return error_outcome("the tool redirected too many times".into());
        }
        Err(e) => {
            // The cause stays in the logs: telling the model (and so the tenant) whether a
            // port refused or timed out would make tool URLs a port scanner.
            tracing::info!(%run_id, tool_call_id, error = %agentfleet_shared::report::error_line(&e),
                "tool unreachable");
            return error_outcome("the tool could not be reached".into());
        }
    };
    let status = response.status();
    let cap = if status.is_success() {
        max_result_bytes
    } else {
        max_result_bytes.min(ERROR_BODY_BYTES)
    };
    let body = match tokio::time::timeout(timeout, bounded::read(response, cap)).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) if e.is_timeout() => return error_outcome(late()),
        Ok(Err(_)) => return error_outcome("reading the tool's answer failed".into()),
        Err(_) => return error_outcome(late()),
    };
    // What a tool sends is stored: NUL, which Postgres refuses, is removed.
    let text = agentfleet_shared::sanitize::strip_nul(&body.text()).into_owned();
    if status.is_redirection() {
        return error_outcome(format!(
            "the tool answered with a redirect (HTTP {}), which tool calls here do not follow",
            status.as_u16()
        ));
    }
    if !status.is_success() {
        let cut = if body.truncated { "…" } else { "" };
        return error_outcome(format!(
            "the tool answered HTTP {}: {text}{cut}",
            status.as_u16()
        ));
    }
    if body.truncated {
        return truncated_outcome(&text, cap);
    }
    answer_outcome(text)
}

/// A tool's answer cut at `cap` bytes (`partial`, already cut): the run sees what came and a
/// flag. Shared by the tool kinds.
pub fn truncated_outcome(partial: &str, cap: usize) -> HttpOutcome {
    metrics::counter!("agentfleet_tool_results_truncated_total").increment(1);
    HttpOutcome {
        ok: true,
        result: json!({"truncated": true, "limit_bytes": cap, "partial": partial}),
        model_content: format!(
            "{partial}…[truncated: the tool's answer was longer than {cap} bytes]"
        ),
        truncated: true,
    }
}

/// A tool's whole answer: JSON when it parses, else the text.
pub fn answer_outcome(text: String) -> HttpOutcome {
    let mut result = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
    agentfleet_shared::sanitize::strip_nul_value(&mut result);
    HttpOutcome {
        ok: true,
        result,
        model_content: text,
        truncated: false,
    }
}

/// An error result: the model sees `{"error": message}`.
pub fn error_outcome(message: String) -> HttpOutcome {
    HttpOutcome {
        ok: false,
        model_content: json!({"error": message}).to_string(),
        result: json!({"error": message}),
        truncated: false,
    }
}
