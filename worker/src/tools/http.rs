//! HTTP tools: POST `{run_id, tool_call_id, arguments}` with `Idempotency-Key:
//! <run_id>:<tool_call_id>`, so a call dispatched again after a crash can be deduplicated by the
//! tool server. A 2xx body is the result; anything else is an error result the model sees.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

pub struct HttpOutcome {
    pub ok: bool,
    /// Parsed JSON body, or the body as a string.
    pub result: Value,
    /// What the model sees.
    pub model_content: String,
}

pub async fn call(
    http: &reqwest::Client,
    url: &str,
    run_id: Uuid,
    tool_call_id: &str,
    arguments: &Value,
    timeout: Duration,
    max_result_bytes: usize,
) -> HttpOutcome {
    let body = json!({"run_id": run_id, "tool_call_id": tool_call_id, "arguments": arguments});
    let request = http
        .post(url)
        .header("Idempotency-Key", format!("{run_id}:{tool_call_id}"))
        .json(&body)
        .timeout(timeout)
        .send();
    let response = match request.await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return error(format!(
                "the tool did not answer within {} ms",
                timeout.as_millis()
            ));
        }
        Err(e) => return error(format!("the tool could not be reached: {e}")),
    };
    let status = response.status();
    let text = match tokio::time::timeout(timeout, response.text()).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return error(format!("reading the tool's answer failed: {e}")),
        Err(_) => {
            return error(format!(
                "the tool did not answer within {} ms",
                timeout.as_millis()
            ));
        }
    };
    let text = clip(text, max_result_bytes);
    if status.is_success() {
        let result = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
        HttpOutcome {
            ok: true,
            result,
            model_content: text,
        }
    } else {
        error(format!(
            "the tool answered HTTP {}: {}",
            status.as_u16(),
            text
        ))
    }
}

fn error(message: String) -> HttpOutcome {
    HttpOutcome {
        ok: false,
        model_content: json!({"error": message}).to_string(),
        result: json!({"error": message}),
    }
}

fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("…[truncated]");
    }
    s
}
