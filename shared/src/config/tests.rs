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
        s.limits.requests_per_second, 0,
        "unlimited unless configured"
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

#[test]
fn a_zero_where_a_count_or_time_must_be_positive_is_refused_naming_the_key() {
    for key in [
        "redis.timeout_ms",
        "redis.connect_timeout_ms",
        "redis.response_timeout_ms",
        "amqp.timeout_ms",
        "api.auth_cache_max_keys",
        "api.key_last_used_flush_ms",
        "api.max_usage_days",
        "api.batch_progress_interval_ms",
        "api.batch_sweep_interval_ms",
        "worker.concurrency",
        "worker.max_parallel_tool_calls",
        "events.client_buffer",
        "startup.dependency_wait_ms",
        "rate_limit.redis_timeout_ms",
        "rate_limit.local_max_tenants",
        "webhooks.poll_interval_ms",
        "webhooks.timeout_ms",
        "webhooks.connect_timeout_ms",
        "webhooks.backoff_base_ms",
        "webhooks.retry_for_ms",
        "webhooks.keep_finished_ms",
        "mcp.tools_ttl_ms",
        "mcp.list_timeout_ms",
        "mcp.max_tools_per_server",
        "mcp.max_schema_bytes",
        "mcp.max_schema_patterns",
        "mcp.max_schema_pattern_states",
        "mcp.max_list_bytes",
        "mcp.max_servers_per_tenant",
        "mcp.max_header_value_bytes",
    ] {
        let err = load(&[(key, "0")]).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid configuration: ") && err.contains(&format!("`{key}`")),
            "{err}"
        );
        assert!(load(&[(key, "1")]).is_ok(), "{key} = 1");
    }
}
