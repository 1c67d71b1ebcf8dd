//! One file per command.

pub mod answer;
pub mod approve;
pub mod batch;
pub mod runs;
pub mod submit;
pub mod tail;

use serde_json::Value;

use crate::error::{CtlError, Result};

/// Ids are UUIDs: checked here so a typo is a usage error, not a 422 after a round trip, and
/// nothing else ends up in a URL path.
pub fn uuid_arg(what: &str, raw: &str) -> Result<String> {
    uuid::Uuid::try_parse(raw.trim())
        .map(|u| u.to_string())
        .map_err(|_| CtlError::Usage(format!("{what} `{raw}` is not a UUID")))
}

/// A string member of an answer, or `-`.
pub fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("-")
}

/// One line describing a run, for `runs get/cancel`, `answer` and `approve`.
pub fn run_line(run: &Value) -> String {
    format!(
        "{} {} iteration {}/{} tokens {}",
        s(run, "id"),
        s(run, "status"),
        run["iteration"].as_i64().unwrap_or(0),
        run["max_iterations"].as_i64().unwrap_or(0),
        run["usage"]["total_tokens"].as_i64().unwrap_or(0),
    )
}
