//! What one API process admits: request bodies within its byte budget and each tenant's large
//! bodies (`crate::admission`), unknown keys refused without a Postgres lookup per request, and
//! `/readyz` answered from the background. The API runs as a process of its own, so its memory
//! and its metrics are its alone.

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

/// The API's memory limit in the Helm chart (`resources.api.limits.memory`).
const CHART_MEMORY_LIMIT: u64 = 512 << 20;

/// Peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib << 10
}

/// A valid `POST /v1/batches` body of just under `api.max_batch_body_bytes` (32 MiB): 1,000
/// runs of 32 KiB of input each.
fn batch_of_32_mib() -> bytes::Bytes {
    let input = "x".repeat(32 * 1024);
    let runs: Vec<Value> = (0..1000)
        .map(|i| json!({"custom_id": format!("line-{i}"), "input": input, "agent": {"model": "mock"}}))
        .collect();
    let body = serde_json::to_vec(&json!({ "runs": runs })).unwrap();
    assert!(
        body.len() > 32_000_000 && body.len() <= 32 << 20,
        "{}",
        body.len()
    );
    body.into()
}

/// The value of counter `name` in Prometheus text (0 when absent).
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.trim().parse::<f64>().expect("a number") as u64)
        .unwrap_or(0)
}

/// Twenty 32 MiB batch submissions at once, from five tenants: the process takes what its
/// byte budget and each tenant's share of large bodies allow, answers the rest 503 or 429 with
/// `Retry-After` before reading their bodies, and stays alive within the chart's memory limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_large_batches_at_once_leave_the_api_alive_within_its_memory() {
    let env = TestEnv::new().await;
    let (mut api, base) = env.spawn_api_process(&[]).await;
    let http = reqwest::Client::new();
    let mut keys = Vec::new();
    for _ in 0..5 {
        keys.push(env.app_at(&base, http.clone()).await.api_key.clone());
    }
    let body = batch_of_32_mib();
    let sends = (0..20).map(|i| {
        let req = http
            .post(format!("{base}/v1/batches"))
            .bearer_auth(&keys[i % keys.len()])
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        async move {
            let resp = req.await.expect("an answer, not a broken connection");
            let retry_after = resp.headers().get("retry-after").is_some();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, retry_after, body)
        }
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut accepted = 0;
    for (status, retry_after, body) in &answers {
        match status {
            202 => accepted += 1,
            503 | 429 => {
                assert!(*retry_after, "{status} without Retry-After: {body}");
                let code = body["error"]["code"].as_str().unwrap_or_default();
                assert!(
                    ["overloaded", "too_many_large_requests"].contains(&code),
                    "{status}: {body}"
                );
            }
            other => panic!("answer {other}: {body}"),
        }
    }
    assert!(accepted >= 1, "some of the batches are taken");
    assert!(accepted < 20, "not all twenty at once");
    assert!(!api.has_exited(), "the API process is alive");
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let peak = peak_rss(api.pid());
    eprintln!("peak RSS {} MiB; {accepted} of 20 accepted", peak >> 20);
    assert!(
        peak < CHART_MEMORY_LIMIT,
        "the API peaked at {} MiB, past the chart's {} MiB",
        peak >> 20,
        CHART_MEMORY_LIMIT >> 20
    );
}

/// Malformed keys are refused without a Postgres lookup; one unknown key presented again and
/// again is looked up once (`api.auth_negative_ttl_ms`); a source presenting ever new unknown
/// keys is looked up `api.auth_max_failures` times, then answered 429, while a key that was
/// valid lately keeps working (looked up again once its cache entry expired). Lookups are counted by the API's `agentfleet_auth_lookups_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_are_refused_without_a_lookup_per_request() {
    let env = TestEnv::new().await;
    let metrics = free_address();
    let (_api, base) = env
        .spawn_api_process(&[
            ("AGENTFLEET__API__METRICS_LISTEN", metrics.as_str()),
            // Valid keys expire from the cache at once: the last request below is a lookup.
            ("AGENTFLEET__API__AUTH_CACHE_TTL_MS", "1"),
            ("AGENTFLEET__API__AUTH_NEGATIVE_TTL_MS", "600000"),
            ("AGENTFLEET__API__AUTH_MAX_FAILURES", "20"),
            ("AGENTFLEET__API__AUTH_FAILURE_WINDOW_MS", "600000"),
            ("AGENTFLEET__API__AUTH_LOCKOUT_DELAY_MS", "200"),
        ])
        .await;
    let http = reqwest::Client::new();
    let app = env.app_at(&base, http.clone()).await;
    let lookups = || async {
        let text = scrape_metrics(&metrics).await.expect("metrics");
        counter(&text, "agentfleet_auth_lookups_total")
    };
    let get = |key: String| http.get(format!("{base}/v1/runs")).bearer_auth(key).send();
    // The real key, once: known to be valid from now on.
    assert_eq!(get(app.api_key.clone()).await.unwrap().status(), 200);
    let before = lookups().await;

    for i in 0..200 {
        let malformed = match i % 4 {
            0 => format!("af_{i}"),
            1 => format!("sk-{}", "a".repeat(64)),
            2 => format!("af_{}", "G".repeat(64)),
            _ => "x".repeat(i + 1),
        };
        let resp = get(malformed).await.unwrap();
        assert_eq!(resp.status(), 401);
    }
    assert_eq!(
        lookups().await,
        before,
        "malformed keys are never looked up"
    );

    let unknown = format!("af_{}", "0".repeat(64));
    for _ in 0..100 {
        assert_eq!(get(unknown.clone()).await.unwrap().status(), 401);
    }
    assert_eq!(
        lookups().await,
        before + 1,
        "one unknown key is looked up once"
    );

    let mut statuses = Vec::new();
    for i in 0..40u32 {
        let random = format!("af_{:064x}", u128::from(i) << 64 | 0xfeed);
        let sent = std::time::Instant::now();
        let resp = get(random).await.unwrap();
        if resp.status() == 429 {
            assert!(
                sent.elapsed() >= std::time::Duration::from_millis(200),
                "a locked-out source waits api.auth_lockout_delay_ms for its 429"
            );
            assert!(resp.headers().get("retry-after").is_some());
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "too_many_attempts", "{body}");
            statuses.push(429);
        } else {
            statuses.push(resp.status().as_u16());
        }
    }
    assert_eq!(statuses.iter().filter(|s| **s == 401).count(), 19);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 21);
    assert_eq!(
        lookups().await,
        before + 20,
        "a source's unknown keys are looked up api.auth_max_failures times"
    );
    assert_eq!(
        get(app.api_key.clone()).await.unwrap().status(),
        200,
        "a key valid lately is looked up again from the locked-out source"
    );
    assert_eq!(lookups().await, before + 21);
}

/// `/readyz` answers from the background check: a hundred calls make no round of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_does_not_touch_the_servers_per_call() {
    let env = TestEnv::new().await;
    let metrics = free_address();
    let (_api, base) = env
        .spawn_api_process(&[
            ("AGENTFLEET__API__METRICS_LISTEN", metrics.as_str()),
            ("AGENTFLEET__API__READINESS_INTERVAL_MS", "3600000"),
        ])
        .await;
    let probes = || async {
        let text = scrape_metrics(&metrics).await.expect("metrics");
        counter(&text, "agentfleet_readiness_probes_total")
    };
    // The first round ran at start-up (the harness waited for /readyz to say ready).
    assert_eq!(probes().await, 1);
    let http = reqwest::Client::new();
    for _ in 0..100 {
        let resp = http.get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["status"], "ready");
        assert_eq!(body["postgres"], true);
    }
    assert_eq!(probes().await, 1, "no call made a round of its own");
}
