//! Test-only crash points. `AGENTFLEET_FAILPOINTS` (comma-separated names) makes the process
//! abort at those points, as a `kill -9` at that exact line would; the fault suite uses it to
//! crash between two steps that are otherwise microseconds apart. Never set in production.

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

/// Aborts the process if failpoint `name` is enabled.
pub fn hit(name: &str) {
    if enabled().iter().any(|p| p == name) {
        eprintln!("failpoint `{name}` reached: aborting");
        std::process::abort();
    }
}
