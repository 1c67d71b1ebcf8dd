//! Loading as a whole: the defaults, and errors naming the key. Each section's own checks are
//! tested in its file.

use super::*;

/// The defaults with `overrides` applied, without the process environment.
pub(super) fn load(overrides: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    Settings::load_with(
        None,
        overrides
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
        false,
    )
}

#[test]
fn defaults_are_valid() {
    let s = load(&[]).unwrap();
    assert_eq!(s.redis.prefix, "agentfleet");
    assert_eq!(s.worker.lease_ms, 10_000);
    assert_eq!(s.events.retention_secs, 86_400);
}

#[test]
fn invalid_value_names_the_key() {
    let err = load(&[("worker.concurrency", "0")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("worker.concurrency"), "{err}");
    let err = load(&[("worker.lease_ms", "not-a-number")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("lease_ms"), "{err}");
    let err = load(&[("telemetry.trace_filter", "agentfleet_worker=loud")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("telemetry.trace_filter"), "{err}");
    let err = load(&[("api.max_remembered_schemas", "1000001")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("api.max_remembered_schemas"), "{err}");
    assert_eq!(
        load(&[("api.max_remembered_schemas", "0")])
            .unwrap()
            .api
            .max_remembered_schemas,
        0
    );
}

#[test]
fn request_limits_are_checked_naming_the_key() {
    let s = load(&[]).unwrap();
    assert_eq!(
        (s.limits.requests_per_second, s.limits.request_burst),
        (1000, 0),
        "the shipped default rate"
    );
    let err = load(&[
        ("limits.requests_per_second", "100"),
        ("limits.request_burst", "10"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("`limits.request_burst`"), "{err}");
    let err = load(&[("limits.request_burst", "10")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`limits.request_burst`"), "{err}");
    let err = load(&[("rate_limit.redis_timeout_ms", "0")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`rate_limit.redis_timeout_ms`"), "{err}");
    assert!(
        load(&[
            ("limits.requests_per_second", "100"),
            ("limits.request_burst", "0")
        ])
        .is_ok()
    );
}

/// Defaults, then the file, then the overrides, key by key (the environment, between the file
/// and the overrides, is not read here: tests do not touch the process environment).
#[test]
fn a_file_overrides_the_defaults_and_overrides_the_file_key_by_key() {
    let path =
        std::env::temp_dir().join(format!("agentfleet-config-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(
        &path,
        "[worker]\nconcurrency = 3\nlease_ms = 20000\n\n[models.fast]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n",
    )
    .unwrap();
    let loaded = Settings::load_with(
        Some(&path),
        [("worker.concurrency".to_owned(), "5".to_owned())],
        false,
    );
    std::fs::remove_file(&path).unwrap();
    let s = loaded.unwrap();
    assert_eq!(s.worker.concurrency.get(), 5, "the override wins");
    assert_eq!(s.worker.lease_ms, 20_000, "the file's value");
    assert_eq!(s.worker.lease_renew_ms, 3_000, "the default");
    assert_eq!(s.models["fast"].context_tokens, 100_000);
    let missing = std::env::temp_dir().join("agentfleet-config-missing.toml");
    let err = Settings::load_with(Some(&missing), Vec::new(), false).unwrap_err();
    assert!(
        err.to_string().starts_with("invalid configuration: "),
        "{err}"
    );
}
