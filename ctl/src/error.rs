//! Every way a command can fail, and the exit code each one means (the table is in docs/api.md,
//! "The command line: agentfleetctl"; scripts depend on it, so codes never change meaning).

use std::fmt;

/// Exit codes. `clap` itself exits 2 on a usage error, which is why configuration errors share
/// that code.
pub mod exit {
    /// Done; for `tail` and `--wait`: the run(s) completed.
    pub const OK: i32 = 0;
    /// The API refused the request (4xx), or a run/batch ended failed or cancelled.
    pub const FAILED: i32 = 1;
    /// Usage, configuration or input-file error; nothing was sent.
    pub const USAGE: i32 = 2;
    /// The API could not be reached, or answered 5xx/429, after the bounded retries.
    pub const UNAVAILABLE: i32 = 3;
    /// `tail --until-pause`: the run is waiting for an answer or a decision.
    pub const PAUSED: i32 = 4;
    /// Interrupted (Ctrl-C). `submit` can be re-run to resume.
    pub const INTERRUPTED: i32 = 130;
}

/// An error answer of the API: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone)]
pub struct ApiRefusal {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl fmt::Display for ApiRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Bad flags, configuration or input; exit 2.
    #[error("{0}")]
    Usage(String),
    /// The API answered 4xx (or 5xx that retries did not cure, see `Unavailable`).
    #[error("the API refused: {0}")]
    Api(ApiRefusal),
    /// Network errors, timeouts, 5xx or 429 after the retries; exit 3.
    #[error("the API is unavailable: {0}")]
    Unavailable(String),
    /// The API answered something that is not what the contract says.
    #[error("unexpected answer from the API: {0}")]
    Protocol(String),
    /// A run or batch ended, but not completed (the detail was printed already); exit 1.
    #[error("{0}")]
    Outcome(String),
    /// `tail --until-pause` stopped at a pause; exit 4.
    #[error("{0}")]
    Paused(String),
    #[error("interrupted{0}")]
    Interrupted(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl CtlError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CtlError::Usage(_) => exit::USAGE,
            CtlError::Api(r) if r.status >= 500 || r.status == 429 => exit::UNAVAILABLE,
            CtlError::Api(_) | CtlError::Outcome(_) => exit::FAILED,
            CtlError::Unavailable(_) | CtlError::Protocol(_) => exit::UNAVAILABLE,
            CtlError::Paused(_) => exit::PAUSED,
            CtlError::Interrupted(_) => exit::INTERRUPTED,
            CtlError::Io { .. } => exit::USAGE,
        }
    }

    /// Whether the command printed its own document before failing (an outcome or a pause).
    pub fn reported(&self) -> bool {
        matches!(self, CtlError::Outcome(_) | CtlError::Paused(_))
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CtlError {
        let context = context.into();
        move |source| CtlError::Io { context, source }
    }

    /// The `--json` form of the error, printed on stdout so scripts read one document.
    pub fn to_json(&self) -> serde_json::Value {
        let (code, message) = match self {
            CtlError::Api(r) => (r.code.clone(), r.message.clone()),
            CtlError::Usage(m) => ("usage".into(), m.clone()),
            CtlError::Unavailable(m) => ("unavailable".into(), m.clone()),
            CtlError::Protocol(m) => ("protocol".into(), m.clone()),
            CtlError::Outcome(m) => ("outcome".into(), m.clone()),
            CtlError::Paused(m) => ("paused".into(), m.clone()),
            CtlError::Interrupted(_) => ("interrupted".into(), self.to_string()),
            CtlError::Io { .. } => ("io".into(), self.to_string()),
        };
        let mut v = serde_json::json!({"error": {"code": code, "message": message, "exit_code": self.exit_code()}});
        if let CtlError::Api(r) = self {
            v["error"]["status"] = r.status.into();
        }
        v
    }
}

pub type Result<T, E = CtlError> = std::result::Result<T, E>;
