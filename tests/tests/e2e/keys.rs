//! Key lifecycle and tenant administration: revocation across API replicas, expiry, rotation,
//! the admin API's token, suspension, and the `tenants`/`keys` commands of the binary.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;

const ADMIN: &str = "test-admin-token-0123456789abcdefghij";

/// An admin call: `method path` with the operator token and an optional JSON body.
async fn admin(
    http: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = http
        .request(method, format!("{base}{path}"))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    req.send().await.expect("admin request")
}

async fn json_of(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let body: Value = resp.json().await.expect("JSON body");
    assert_eq!(got, status, "{body}");
    body
}

/// `GET /v1/runs` with `key` on `base`: the status.
async fn list_status(http: &reqwest::Client, base: &str, key: &str) -> u16 {
    http.get(format!("{base}/v1/runs"))
        .bearer_auth(key)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_refused_after_the_cache_ttl_on_two_api_processes() {
    let env = TestEnv::with(&[
        ("api.admin_token", ADMIN),
        ("api.auth_cache_ttl_ms", "1000"),
    ])
    .await;
    let (_a, base_a) = env.spawn_api_process(&[]).await;
    let (_b, base_b) = env.spawn_api_process(&[]).await;
    let http = reqwest::Client::new();
    let post = reqwest::Method::POST;
    let created = json_of(
        admin(
            &http,
            &base_a,
            post.clone(),
            "/admin/v1/tenants",
            Some(json!({"name": "replicas"})),
        )
        .await,
        201,
    )
    .await;
    let key = created["api_key"].as_str().unwrap().to_owned();
    let key_id = created["key"]["id"].as_str().unwrap().to_owned();
    // Accepted on both replicas (and now cached by both).
    for base in [&base_a, &base_b] {
        assert_eq!(list_status(&http, base, &key).await, 200, "{base}");
    }
    let revoked = json_of(
        admin(
            &http,
            &base_b,
            post,
            &format!("/admin/v1/keys/{key_id}/revoke"),
            None,
        )
        .await,
        200,
    )
    .await;
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    // Each replica refuses it once its cached entry is older than the TTL (1 s).
    for base in [&base_a, &base_b] {
        wait_for("the revoked key refused", Duration::from_secs(20), || {
            let (http, key) = (http.clone(), key.clone());
            let base = base.clone();
            async move { (list_status(&http, &base, &key).await == 401).then_some(()) }
        })
        .await;
    }
}

/// Polls `GET /v1/runs` with `key` on each base until it answers 401.
async fn wait_refused(http: &reqwest::Client, bases: &[&str], key: &str, within: Duration) {
    for base in bases {
        wait_for("the key refused", within, || async {
            (list_status(http, base, key).await == 401).then_some(())
        })
        .await;
    }
}

/// Two API processes on the environment's database, and a tenant of its own.
async fn two_replicas_and_a_tenant(
    env: &TestEnv,
    name: &str,
) -> (
    ChildProcess,
    String,
    ChildProcess,
    String,
    agentfleet_shared::store::tenants::CreatedTenant,
) {
    let (a, base_a) = env.spawn_api_process(&[]).await;
    let (b, base_b) = env.spawn_api_process(&[]).await;
    let tenant = agentfleet_shared::store::tenants::create(&env.pool, name)
        .await
        .unwrap();
    (a, base_a, b, base_b, tenant)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_redis_announcement_the_ttl_still_bounds_a_revocation() {
    let env = TestEnv::with(&[("api.auth_cache_ttl_ms", "1000")]).await;
    let (_a, base_a, _b, base_b, tenant) = two_replicas_and_a_tenant(&env, "lost message").await;
    let http = reqwest::Client::new();
    for base in [&base_a, &base_b] {
        assert_eq!(list_status(&http, base, &tenant.api_key).await, 200);
    }
    // Written straight to Postgres: no replica is told, as if the announcement were lost.
    agentfleet_shared::store::keys::revoke(&env.pool, tenant.key_id)
        .await
        .unwrap();
    wait_refused(
        &http,
        &[&base_a, &base_b],
        &tenant.api_key,
        Duration::from_secs(20),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_by_the_cli_reaches_both_replicas_long_before_the_ttl() {
    // A ten-minute cache: only the Redis announcement can end the key within the deadline.
    let env = TestEnv::with(&[("api.auth_cache_ttl_ms", "600000")]).await;
    let (_a, base_a, _b, base_b, tenant) = two_replicas_and_a_tenant(&env, "announced").await;
    let http = reqwest::Client::new();
    // Both replicas listen (a replica clears its cache when it subscribes, which would
    // otherwise race the "cached" check below).
    let channel = agentfleet_api::auth::invalidation::channel(&env.prefix);
    let redis = redis::Client::open(redis_url()).unwrap();
    wait_for("both replicas subscribed", Duration::from_secs(20), || {
        let (redis, channel) = (redis.clone(), channel.clone());
        async move {
            let mut conn = redis.get_multiplexed_async_connection().await.ok()?;
            let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .ok()?;
            (counts.first().map(|c| c.1) == Some(2)).then_some(())
        }
    })
    .await;
    for base in [&base_a, &base_b] {
        assert_eq!(list_status(&http, base, &tenant.api_key).await, 200);
    }
    // Revoked in Postgres and no announcement: both replicas still trust their cache.
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE id = $1")
        .bind(tenant.key_id)
        .execute(&env.pool)
        .await
        .unwrap();
    for base in [&base_a, &base_b] {
        assert_eq!(
            list_status(&http, base, &tenant.api_key).await,
            200,
            "cached"
        );
    }
    api_cli(
        &env,
        &["keys", "revoke", "--key", &tenant.key_id.to_string()],
        true,
    )
    .await;
    wait_refused(
        &http,
        &[&base_a, &base_b],
        &tenant.api_key,
        Duration::from_secs(20),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_refused_even_while_cached_and_last_use_is_recorded() {
    // A cache far longer than the test: the expiry must be enforced on the cached entry.
    let env = TestEnv::with(&[
        ("api.admin_token", ADMIN),
        ("api.auth_cache_ttl_ms", "600000"),
        ("api.key_last_used_flush_ms", "100"),
    ])
    .await;
    let app = env.spawn_api().await;
    let http = &app.http;
    let tenant = app.tenant_id;
    let post = reqwest::Method::POST;
    // An expiry in the past is refused, naming the field.
    let past = json_of(
        admin(
            http,
            &app.address,
            post.clone(),
            &format!("/admin/v1/tenants/{tenant}/keys"),
            Some(json!({"name": "old", "expires_at": "2001-01-01T00:00:00Z"})),
        )
        .await,
        422,
    )
    .await;
    assert!(
        past["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("expires_at:"),
        "{past}"
    );
    let created = json_of(
        admin(
            http,
            &app.address,
            post,
            &format!("/admin/v1/tenants/{tenant}/keys"),
            Some(json!({"name": "short-lived", "expires_in_secs": 5})),
        )
        .await,
        201,
    )
    .await;
    let key = created["api_key"].as_str().unwrap().to_owned();
    let key_id = created["key"]["id"].as_str().unwrap().to_owned();
    assert!(created["key"]["expires_at"].is_string());
    assert_eq!(list_status(http, &app.address, &key).await, 200);
    // The use is written by the flusher, not by the request.
    let base = app.address.as_str();
    wait_for("last_used_at recorded", Duration::from_secs(20), || {
        let path = format!("/admin/v1/keys/{key_id}");
        async move {
            let k = json_of(
                admin(http, base, reqwest::Method::GET, &path, None).await,
                200,
            )
            .await;
            k["last_used_at"].is_string().then_some(())
        }
    })
    .await;
    wait_for(
        "the expired key refused",
        Duration::from_secs(30),
        || async { (list_status(http, &app.address, &key).await == 401).then_some(()) },
    )
    .await;
    // The tenant's other key is unaffected.
    assert_eq!(list_status(http, &app.address, &app.api_key).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_gives_a_working_key_and_the_old_one_stops() {
    let env = TestEnv::with(&[("api.admin_token", ADMIN), ("api.auth_cache_ttl_ms", "0")]).await;
    let app = env.spawn_api().await;
    let http = &app.http;
    let post = reqwest::Method::POST;
    let keys = json_of(
        admin(
            http,
            &app.address,
            reqwest::Method::GET,
            &format!("/admin/v1/tenants/{}/keys", app.tenant_id),
            None,
        )
        .await,
        200,
    )
    .await;
    let old_id = keys["data"][0]["id"].as_str().unwrap().to_owned();
    assert!(
        keys["data"][0].get("api_key").is_none(),
        "listing shows no secret"
    );
    // With a grace period, both keys work.
    let rotated = json_of(
        admin(
            http,
            &app.address,
            post.clone(),
            &format!("/admin/v1/keys/{old_id}/rotate"),
            Some(json!({"grace_secs": 3600})),
        )
        .await,
        201,
    )
    .await;
    let graced_key = rotated["api_key"].as_str().unwrap().to_owned();
    let graced_id = rotated["key"]["id"].as_str().unwrap().to_owned();
    assert_eq!(rotated["key"]["name"], rotated["previous"]["name"]);
    assert!(
        rotated["previous"]["expires_at"].is_string()
            && rotated["previous"]["revoked_at"].is_null()
    );
    assert_eq!(list_status(http, &app.address, &graced_key).await, 200);
    assert_eq!(
        list_status(http, &app.address, &app.api_key).await,
        200,
        "in its grace period"
    );
    // Without one, the old key stops at once (the cache is off here).
    let rotated = json_of(
        admin(
            http,
            &app.address,
            post.clone(),
            &format!("/admin/v1/keys/{graced_id}/rotate"),
            Some(json!({})),
        )
        .await,
        201,
    )
    .await;
    let new_key = rotated["api_key"].as_str().unwrap().to_owned();
    assert_eq!(list_status(http, &app.address, &new_key).await, 200);
    assert_eq!(list_status(http, &app.address, &graced_key).await, 401);
    // A revoked key cannot be rotated back to life.
    let again = json_of(
        admin(
            http,
            &app.address,
            post,
            &format!("/admin/v1/keys/{graced_id}/rotate"),
            Some(json!({})),
        )
        .await,
        409,
    )
    .await;
    assert_eq!(again["error"]["code"], "key_not_valid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_its_token_and_is_absent_without_one() {
    let env = TestEnv::with(&[("api.admin_token", ADMIN)]).await;
    let app = env.spawn_api().await;
    let url = app.url("/admin/v1/tenants");
    for auth in [
        None,
        Some("wrong-token-0123456789"),
        Some(app.api_key.as_str()),
    ] {
        let mut req = app.http.get(&url);
        if let Some(a) = auth {
            req = req.bearer_auth(a);
        }
        let body = json_of(req.send().await.unwrap(), 401).await;
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let page = json_of(
        app.http.get(&url).bearer_auth(ADMIN).send().await.unwrap(),
        200,
    )
    .await;
    assert!(
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == app.tenant_id.to_string())
    );
    // The operator token opens nothing under /v1.
    assert_eq!(list_status(&app.http, &app.address, ADMIN).await, 401);
    // Bad input is refused naming the field, and nothing is written.
    let bad = json_of(
        admin(
            &app.http,
            &app.address,
            reqwest::Method::POST,
            "/admin/v1/tenants",
            Some(json!({"name": "  "})),
        )
        .await,
        422,
    )
    .await;
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("name:"),
        "{bad}"
    );

    let disabled = env.spawn_api_with(&[("api.admin_token", "")]).await;
    let resp = disabled
        .http
        .get(disabled.url("/admin/v1/tenants"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let body = json_of(resp, 404).await;
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_tenant_reads_but_starts_nothing_until_resumed() {
    let env = TestEnv::with(&[("api.admin_token", ADMIN), ("api.auth_cache_ttl_ms", "0")]).await;
    let app = env.spawn_api().await;
    let (http, base, tenant) = (&app.http, &app.address, app.tenant_id);
    let run = app
        .start_run(&scripted_run(json!([{"content": "hi"}]), json!([])))
        .await;
    let run_id = run["id"].as_str().unwrap();
    let post = reqwest::Method::POST;
    let suspended = json_of(
        admin(
            http,
            base,
            post.clone(),
            &format!("/admin/v1/tenants/{tenant}/suspend"),
            None,
        )
        .await,
        200,
    )
    .await;
    assert!(suspended["suspended_at"].is_string());
    let body = scripted_run(json!([{"content": "again"}]), json!([]));
    for (path, payload) in [
        ("/v1/runs", body.clone()),
        ("/v1/runs/batch", json!({"runs": [body.clone()]})),
    ] {
        let refused = json_of(app.post(path, &payload).await, 403).await;
        assert_eq!(refused["error"]["code"], "tenant_suspended", "{path}");
    }
    // Reading and cancelling still work.
    assert_eq!(app.get(&format!("/v1/runs/{run_id}")).await.status(), 200);
    assert_eq!(app.get("/v1/runs").await.status(), 200);
    let cancel = app
        .post(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancel.status(), 200);
    json_of(
        admin(
            http,
            base,
            post,
            &format!("/admin/v1/tenants/{tenant}/resume"),
            None,
        )
        .await,
        200,
    )
    .await;
    assert_eq!(app.post("/v1/runs", &body).await.status(), 202);

    // Per-tenant limits: set, clear back to the default, unknown fields named.
    let patch = reqwest::Method::PATCH;
    let limits_path = format!("/admin/v1/tenants/{tenant}/limits");
    let t = json_of(
        admin(
            http,
            base,
            patch.clone(),
            &limits_path,
            Some(json!({"max_running_runs": 3, "tokens_per_day": 1000})),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(
        t["limits"],
        json!({"max_running_runs": 3, "tokens_per_day": 1000})
    );
    assert_eq!(t["effective_limits"]["max_running_runs"], 3);
    let t = json_of(
        admin(
            http,
            base,
            patch.clone(),
            &limits_path,
            Some(json!({"max_running_runs": null})),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(t["limits"], json!({"tokens_per_day": 1000}));
    // Limits that do not make sense together are refused, naming the field; nothing changes.
    let burst = json_of(
        admin(
            http,
            base,
            patch.clone(),
            &limits_path,
            Some(json!({"requests_per_second": 10, "request_burst": 5})),
        )
        .await,
        422,
    )
    .await;
    assert!(
        burst["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("request_burst:"),
        "{burst}"
    );
    let bad = json_of(
        admin(
            http,
            base,
            patch,
            &limits_path,
            Some(json!({"max_runing_runs": 1})),
        )
        .await,
        422,
    )
    .await;
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("max_runing_runs:"),
        "{bad}"
    );
    let t = json_of(
        admin(
            http,
            base,
            reqwest::Method::GET,
            &format!("/admin/v1/tenants/{tenant}"),
            None,
        )
        .await,
        200,
    )
    .await;
    assert_eq!(t["limits"], json!({"tokens_per_day": 1000}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_tenants_and_keys() {
    let env = TestEnv::new().await;
    let created: Value = serde_json::from_str(
        &api_cli(
            &env,
            &["tenants", "create", "--name", "cli", "--json"],
            true,
        )
        .await,
    )
    .unwrap();
    let tenant = created["tenant_id"].as_str().unwrap().to_owned();
    assert!(created["api_key"].as_str().unwrap().starts_with("af_"));
    let key: Value = serde_json::from_str(
        &api_cli(
            &env,
            &[
                "keys",
                "create",
                "--tenant",
                &tenant,
                "--name",
                "ci",
                "--expires-in",
                "30d",
                "--json",
            ],
            true,
        )
        .await,
    )
    .unwrap();
    let (key_id, secret) = (
        key["key"]["id"].as_str().unwrap().to_owned(),
        key["api_key"].as_str().unwrap().to_owned(),
    );
    assert!(key["key"]["expires_at"].is_string());
    let table = api_cli(&env, &["keys", "list", "--tenant", &tenant], true).await;
    assert!(
        table.starts_with("ID") && table.contains("ci") && table.contains(&key_id),
        "{table}"
    );
    assert!(!table.contains(&secret), "no secret in listings");
    let t: Value = serde_json::from_str(
        &api_cli(
            &env,
            &[
                "tenants",
                "limits",
                "--tenant",
                &tenant,
                "--max-running-runs",
                "3",
                "--json",
            ],
            true,
        )
        .await,
    )
    .unwrap();
    assert_eq!(t["limits"], json!({"max_running_runs": 3}));
    let t: Value = serde_json::from_str(
        &api_cli(
            &env,
            &[
                "tenants",
                "limits",
                "--tenant",
                &tenant,
                "--clear",
                "max_running_runs",
                "--json",
            ],
            true,
        )
        .await,
    )
    .unwrap();
    assert_eq!(t["limits"], json!({}));
    let t: Value = serde_json::from_str(
        &api_cli(
            &env,
            &["tenants", "suspend", "--tenant", &tenant, "--json"],
            true,
        )
        .await,
    )
    .unwrap();
    assert!(t["suspended_at"].is_string());
    let rotated: Value = serde_json::from_str(
        &api_cli(&env, &["keys", "rotate", "--key", &key_id, "--json"], true).await,
    )
    .unwrap();
    assert!(rotated["previous"]["revoked_at"].is_string());
    let new_id = rotated["key"]["id"].as_str().unwrap().to_owned();
    let revoked = api_cli(&env, &["keys", "revoke", "--key", &new_id], true).await;
    assert!(revoked.contains(&new_id), "{revoked}");
    // What the database now says agrees.
    let live: (i64,) = sqlx::query_as(
        "SELECT count(*) FROM api_keys WHERE tenant_id = $1::uuid AND revoked_at IS NULL",
    )
    .bind(&tenant)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(live.0, 1, "only the tenant's default key is left");
    // Bad input: a clear error naming the option, nothing written.
    let err = api_cli(
        &env,
        &[
            "keys", "create", "--tenant", &tenant, "--name", "", "--json",
        ],
        false,
    )
    .await;
    assert!(err.contains("--name"), "{err}");
    let err = api_cli(
        &env,
        &["tenants", "limits", "--tenant", &tenant, "--clear", "bogus"],
        false,
    )
    .await;
    assert!(err.contains("bogus"), "{err}");
    // The old spelling still works.
    let old = api_cli(&env, &["create-tenant", "--name", "legacy"], true).await;
    assert!(old.contains("api_key=af_"), "{old}");
}
