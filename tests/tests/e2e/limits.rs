//! Per-tenant limits on the API: request rate (shared by every API replica through Redis),
//! batch size and active runs. Rates are tiny (1 request/s) with a burst, so refill during a
//! test is negligible and nothing depends on timing.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::store::keys;
use agentfleet_tests::harness::*;

/// Sets a tenant's own limits, as an operator would (before its key is first used, so the
/// auth cache holds them from the start).
async fn set_limits(env: &TestEnv, tenant: Uuid, limits: Value) {
    sqlx::query("UPDATE tenants SET limits = $2 WHERE id = $1")
        .bind(tenant)
        .bind(limits)
        .execute(&env.pool)
        .await
        .expect("set tenant limits");
}

async fn tenant_of_key(env: &TestEnv, key: &str) -> Uuid {
    sqlx::query_scalar("SELECT tenant_id FROM api_keys WHERE key_hash = $1")
        .bind(keys::hash_key(key))
        .fetch_one(&env.pool)
        .await
        .expect("key's tenant")
}

async fn runs_of(env: &TestEnv, tenant: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&env.pool)
        .await
        .expect("count runs")
}

fn header(resp: &reqwest::Response, name: &str) -> Option<u64> {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().parse().expect("an integer header"))
}

/// `n` GETs of the run list with `key`; the responses' statuses and headers, in order.
async fn list_n(http: &reqwest::Client, base: &str, key: &str, n: usize) -> Vec<reqwest::Response> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            http.get(format!("{base}/v1/runs"))
                .bearer_auth(key)
                .send()
                .await
                .expect("request"),
        );
    }
    out
}

fn accepted(responses: &[reqwest::Response]) -> usize {
    responses.iter().filter(|r| r.status() == 200).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_rate_limit_gets_429_with_retry_after_and_others_are_unaffected() {
    let env = TestEnv::with(&[
        ("limits.requests_per_second", "1"),
        ("limits.request_burst", "5"),
    ])
    .await;
    let app = env.spawn_api().await;
    let responses = list_n(&app.http, &app.address, &app.api_key, 12).await;
    let ok = accepted(&responses);
    // The burst, and at most a refill or two if this machine is very slow.
    assert!(
        (5..=7).contains(&ok),
        "accepted {ok} of 12 with a burst of 5"
    );
    let first = &responses[0];
    assert_eq!(first.status(), 200);
    assert_eq!(header(first, "ratelimit-limit"), Some(5));
    assert_eq!(header(first, "ratelimit-remaining"), Some(4));
    assert!(header(first, "ratelimit-reset").is_some());
    assert!(first.headers().get("retry-after").is_none());

    let limited = responses
        .into_iter()
        .find(|r| r.status() != 200)
        .expect("a refusal");
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after = header(&limited, "retry-after").expect("Retry-After");
    assert!(retry_after >= 1, "whole seconds, at least 1: {retry_after}");
    assert_eq!(header(&limited, "ratelimit-limit"), Some(5));
    assert_eq!(header(&limited, "ratelimit-remaining"), Some(0));
    assert!(header(&limited, "ratelimit-reset").is_some());
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains('1'),
        "{body}"
    );

    // Every /v1 request counts: creates are refused the same way, and write nothing (one may
    // get a token that dripped in meanwhile).
    let mut created = 0i64;
    for _ in 0..3 {
        let create = app
            .post(
                "/v1/runs",
                &scripted_run(json!([{"content": "hi"}]), json!([])),
            )
            .await;
        match create.status().as_u16() {
            202 => created += 1,
            429 => {}
            other => panic!("create answered {other}"),
        }
    }
    assert!(
        created <= 1,
        "{created} of 3 creates admitted past the limit"
    );
    assert_eq!(runs_of(&env, app.tenant_id).await, created);

    // Another tenant has a bucket of its own.
    let other = env.new_tenant_key().await;
    let theirs = list_n(&app.http, &app.address, &other, 3).await;
    assert_eq!(accepted(&theirs), 3);
    let left = header(&theirs[2], "ratelimit-remaining").unwrap();
    assert!(
        (2..=3).contains(&left),
        "3 of 5 used (a refill at most): {left} left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_rate_beats_the_default() {
    let env = TestEnv::with(&[
        ("limits.requests_per_second", "1"),
        ("limits.request_burst", "5"),
    ])
    .await;
    let app = env.spawn_api().await;
    // A smaller burst for the app's tenant; none at all for another.
    set_limits(&env, app.tenant_id, json!({"request_burst": 2})).await;
    let free = env.new_tenant_key().await;
    let free_tenant = tenant_of_key(&env, &free).await;
    set_limits(&env, free_tenant, json!({"requests_per_second": 0})).await;

    let small = list_n(&app.http, &app.address, &app.api_key, 8).await;
    let ok = accepted(&small);
    assert!(
        (2..=4).contains(&ok),
        "accepted {ok} of 8 with a burst of 2"
    );
    assert_eq!(header(&small[0], "ratelimit-limit"), Some(2));
    assert!(small.iter().any(|r| r.status() == 429));

    let unlimited = list_n(&app.http, &app.address, &free, 20).await;
    assert_eq!(
        accepted(&unlimited),
        20,
        "an unlimited tenant is never refused"
    );
    assert!(
        unlimited[19].headers().get("ratelimit-limit").is_none(),
        "no rate headers without a rate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_processes_share_one_budget() {
    const BURST: usize = 20;
    let env = TestEnv::with(&[
        ("limits.requests_per_second", "1"),
        ("limits.request_burst", "20"),
    ])
    .await;
    let (_a, base_a) = env.spawn_api_process(&[]).await;
    let (_b, base_b) = env.spawn_api_process(&[]).await;
    let key = env.new_tenant_key().await;
    let http = reqwest::Client::new();
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    // Alternating, so each replica alone sees less than the burst before the budget is gone
    // and only the shared bucket can refuse.
    for _ in 0..(BURST * 3 / 2) {
        on_a.extend(list_n(&http, &base_a, &key, 1).await);
        on_b.extend(list_n(&http, &base_b, &key, 1).await);
    }
    let (ok_a, ok_b) = (accepted(&on_a), accepted(&on_b));
    let total = ok_a + ok_b;
    // Separate budgets would accept 2 × 20 here (every replica sees 30).
    // (At 1 request/s a slow machine may see a refill or three during the test.)
    assert!(
        (BURST..=BURST + 3).contains(&total),
        "accepted {ok_a} + {ok_b} = {total} with one shared burst of {BURST}"
    );
    assert!(ok_a > 0 && ok_b > 0, "both replicas admitted some");
    for (name, responses) in [("a", &on_a), ("b", &on_b)] {
        let refused: Vec<_> = responses.iter().filter(|r| r.status() == 429).collect();
        assert!(
            refused.len() >= 5,
            "replica {name} refused {}",
            refused.len()
        );
        for r in refused {
            assert!(header(r, "retry-after").unwrap() >= 1);
            assert_eq!(header(r, "ratelimit-limit"), Some(BURST as u64));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_tenants_max_batch_size_is_422_naming_runs() {
    let env = TestEnv::with(&[("limits.max_batch_size", "5")]).await;
    let app = env.spawn_api().await;
    set_limits(&env, app.tenant_id, json!({"max_batch_size": 3})).await;
    let run = scripted_run(json!([{"content": "hi"}]), json!([]));
    let batch = |n: usize| json!({"runs": vec![run.clone(); n]});

    let resp = app.post("/v1/runs/batch", &batch(4)).await;
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(body["error"]["message"], "runs: must hold 1 to 3 runs");
    assert_eq!(runs_of(&env, app.tenant_id).await, 0, "nothing written");
    assert_eq!(app.post("/v1/runs/batch", &batch(3)).await.status(), 202);

    // The configured default holds for a tenant without its own value.
    let other = env.new_tenant_key().await;
    let as_other = |n: usize| {
        app.http
            .post(app.url("/v1/runs/batch"))
            .bearer_auth(&other)
            .json(&batch(n))
            .send()
    };
    assert_eq!(as_other(6).await.unwrap().status(), 422);
    assert_eq!(as_other(5).await.unwrap().status(), 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_past_max_active_runs_are_429_and_write_nothing() {
    // No worker: every run stays queued, so it stays active.
    let env = TestEnv::with(&[("limits.max_active_runs", "2")]).await;
    let app = env.spawn_api().await;
    let run = scripted_run(json!([{"content": "hi"}]), json!([]));
    let keyed = |key: &'static str| {
        app.http
            .post(app.url("/v1/runs"))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&run)
            .send()
    };

    let first: Value = keyed("first").await.unwrap().json().await.unwrap();
    let batch_of_two = json!({"runs": [run.clone(), run.clone()]});
    let resp = app.post("/v1/runs/batch", &batch_of_two).await;
    assert_eq!(resp.status(), 429, "1 active + 2 is past 2");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_active_runs", "{body}");
    assert_eq!(runs_of(&env, app.tenant_id).await, 1, "nothing written");

    app.start_run(&run).await;
    let resp = app.post("/v1/runs", &run).await;
    assert_eq!(resp.status(), 429);
    assert!(header(&resp, "retry-after").is_some());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_active_runs", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2"),
        "{body}"
    );
    assert_eq!(runs_of(&env, app.tenant_id).await, 2, "nothing written");

    // Replaying a create that already happened creates nothing: it answers its run.
    let replay = keyed("first").await.unwrap();
    assert_eq!(replay.status(), 202);
    let replay: Value = replay.json().await.unwrap();
    assert_eq!(replay["id"], first["id"]);

    // Another tenant's runs are its own.
    let other = env.new_tenant_key().await;
    let theirs = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(&other)
        .json(&run)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 202);

    // A run that ends frees its place.
    let id = first["id"].as_str().unwrap();
    let cancel = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert!(cancel.status().is_success(), "{}", cancel.status());
    app.wait_status(id, &["cancelled"], std::time::Duration::from_secs(10))
        .await;
    app.start_run(&run).await;
    assert_eq!(runs_of(&env, app.tenant_id).await, 3);
}

/// A TCP proxy to the test Redis that can be cut: every connection through it is dropped and
/// new ones are refused, as if Redis had become unreachable for the API behind it (the shared
/// Redis itself is left alone).
async fn cuttable_redis_proxy() -> (String, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = redis_url();
    let upstream = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split('/').next())
        .expect("redis://host:port")
        .to_owned();
    let cut = tokio_util::sync::CancellationToken::new();
    let stop = cut.clone();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = tokio::select! {
                _ = stop.cancelled() => return, // the listener goes: connections are refused
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(_) => continue,
                },
            };
            let (stop, upstream) = (stop.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                }
            });
        }
    });
    (format!("redis://127.0.0.1:{port}"), cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_the_api_fails_open_at_the_local_rate() {
    let env = TestEnv::with(&[
        ("limits.requests_per_second", "1"),
        ("limits.request_burst", "3"),
        ("rate_limit.local_only_ms", "600000"),
    ])
    .await;
    let (proxy, cut) = cuttable_redis_proxy().await;
    let app = env.spawn_api_with(&[("redis.url", &proxy)]).await;

    // Other replicas have used the tenant's shared budget for a long while: its bucket in
    // Redis is 1000 s ahead of Redis's clock.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut redis).await.unwrap();
    let ahead = secs * 1_000_000 + micros + 1_000_000_000;
    let key = format!("{}:ratelimit:{}", env.prefix, app.tenant_id);
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(ahead.to_string())
        .arg("PX")
        .arg(600_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let refused = app.get("/v1/runs").await;
    assert_eq!(refused.status(), 429, "the shared bucket decides");
    let wait = header(&refused, "retry-after").unwrap();
    assert!(wait > 900, "Retry-After {wait} s: the shared bucket's wait");

    // Redis unreachable: the replica's own limiter decides, at the tenant's full rate. It is
    // not refusing everyone (fail open), and it still limits.
    cut.cancel();
    let responses = list_n(&app.http, &app.address, &app.api_key, 10).await;
    let ok = accepted(&responses);
    // The local bucket holds 3, one of which the refused request above took.
    assert!(
        (1..=4).contains(&ok),
        "accepted {ok} of 10 by the local limiter"
    );
    let last = responses.iter().rev().find(|r| r.status() == 429);
    let last = last.expect("the local limiter refuses past its burst");
    assert!(
        header(last, "retry-after").unwrap() <= 3,
        "the local limiter's wait"
    );
}

/// Many creates of one tenant at the same moment, on two API replicas, through every create
/// endpoint (single runs, `POST /v1/runs/batch`, `POST /v1/batches`): the tenant's active runs
/// must never pass `limits.max_active_runs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_pass_max_active_runs() {
    const MAX: i64 = 6;
    // No worker: every run stays queued, so it stays active.
    let env = TestEnv::with(&[("limits.max_active_runs", "6")]).await;
    let a = env.spawn_api().await;
    let b = env.spawn_api().await;
    let run = scripted_run(json!([{"content": "hi"}]), json!([]));
    let two = json!({"runs": [run.clone(), run.clone()]});
    let sends = (0..48).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        // Every third request of each kind: a single run, two runs at once, a batch of two.
        let (path, body, runs) = match i % 3 {
            0 => ("/v1/runs", run.clone(), 1),
            1 => ("/v1/runs/batch", two.clone(), 2),
            _ => {
                let items: Vec<Value> = (0..2)
                    .map(|j| {
                        let mut item = run.clone();
                        item["custom_id"] = json!(format!("item-{j}"));
                        item
                    })
                    .collect();
                ("/v1/batches", json!({"runs": items}), 2)
            }
        };
        let req = app
            .http
            .post(app.url(path))
            .bearer_auth(&a.api_key)
            .json(&body)
            .send();
        async move { (req.await.map(|r| r.status().as_u16()), runs) }
    });
    let answers = futures_util::future::join_all(sends).await;
    for (answer, _) in &answers {
        let status = answer.as_ref().expect("an answer");
        assert!(
            [202, 429].contains(status),
            "every create is accepted or refused for the limit: {status}"
        );
    }
    let accepted: i64 = answers
        .iter()
        .filter(|(r, _)| r.as_ref().is_ok_and(|s| *s == 202))
        .map(|(_, runs)| *runs)
        .sum();
    // The accepted batches' runs are created in the background.
    let written = wait_for("the batches' runs", Duration::from_secs(30), || async {
        let creating: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM batches WHERE tenant_id = $1 AND status = 'creating'",
        )
        .bind(a.tenant_id)
        .fetch_one(&env.pool)
        .await
        .expect("count creating batches");
        if creating > 0 {
            return None;
        }
        Some(runs_of(&env, a.tenant_id).await)
    })
    .await;
    assert!(
        written <= MAX && accepted <= MAX,
        "{accepted} runs accepted and {written} written past max_active_runs {MAX}"
    );
    assert_eq!(written, accepted, "every accepted run was written");
    // Requests add one or two runs: the last room may be one that only pairs were left for.
    assert!(
        written >= MAX - 1,
        "the limit is reached, not undershot: {written}"
    );
}
