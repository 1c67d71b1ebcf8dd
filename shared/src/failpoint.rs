//! Test-only fault points. `AGENTFLEET_FAILPOINTS` (comma-separated names) makes the process
//! abort at those points, as a `kill -9` at that exact line would; the fault suite uses it to
//! crash between two steps that are otherwise microseconds apart. A name written `error:NAME`
//! makes [`error`] answer true at that point instead, so the caller fails as if its server had
//! (a database that keeps timing out, say); `delay:NAME@MS` makes [`delay`] answer that many
//! milliseconds, for the caller to hold its step back (a slow database, say); `panic:NAME`
//! makes [`hit`] panic instead of aborting (a bug in that task: it unwinds, the process lives
//! on). Never set in production.

use std::sync::OnceLock;

fn enabled() -> &'static [String] {
    static POINTS: OnceLock<Vec<String>> = OnceLock::new();
    POINTS.get_or_init(|| {
        std::env::var("AGENTFLEET_FAILPOINTS")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Aborts the process if failpoint `name` is enabled; panics if `panic:NAME` is.
pub fn hit(name: &str) {
    if enabled().iter().any(|p| p == name) {
        eprintln!("failpoint `{name}` reached: aborting");
        std::process::abort();
    }
    if enabled()
        .iter()
        .any(|p| p.strip_prefix("panic:") == Some(name))
    {
        panic!("failpoint `{name}` reached: panicking");
    }
}

/// Whether the caller should fail at point `name` (enabled as `error:NAME`).
pub fn error(name: &str) -> bool {
    enabled()
        .iter()
        .any(|p| p.strip_prefix("error:") == Some(name))
}

/// How long the caller should hold back at point `name` (enabled as `delay:NAME@MS`).
pub fn delay(name: &str) -> Option<std::time::Duration> {
    enabled().iter().find_map(|p| {
        let (point, ms) = p.strip_prefix("delay:")?.rsplit_once('@')?;
        (point == name)
            .then(|| ms.parse().ok())
            .flatten()
            .map(std::time::Duration::from_millis)
    })
}
