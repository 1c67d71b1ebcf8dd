//! Secrets at rest and the ways in: webhook secrets sealed (a database dump holds none, and
//! deliveries still verify, those of endpoints written before sealing included), stream tokens
//! bound to the key that asked for them, the admin API on a listener of its own with a limit on
//! failed attempts, and MCP headers never sent over plain `http://` to an unlisted address.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentfleet_shared::config::Settings;
use agentfleet_tests::harness::*;
use agentfleet_tests::webhook_receiver::Receiver;

const T: Duration = Duration::from_secs(60);
const ADMIN: &str = "secrets-test-admin-token-0123456789abcdef";

async fn json_of(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(got, status, "{body}");
    body
}

/// The test database as `pg_dump` writes it (plain SQL text).
async fn pg_dump(env: &TestEnv) -> String {
    let url = env.database_url.clone();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("pg_dump")
            .arg("--dbname")
            .arg(&url)
            .output()
            .expect("pg_dump runs");
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("the dump is text")
    })
    .await
    .unwrap()
}

async fn plain_secrets(env: &TestEnv) -> i64 {
    sqlx::query_as::<_, (i64,)>("SELECT count(*) FROM webhook_endpoints WHERE secret IS NOT NULL")
        .fetch_one(&env.pool)
        .await
        .unwrap()
        .0
}

/// An endpoint written before sealing existed keeps its secret plain until an API replica with
/// the key starts and seals it; from then on a dump of the database holds no secret, neither
/// that one nor a registered one, and deliveries to both still verify at their receivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_holds_no_webhook_secret_and_deliveries_still_verify() {
    let (old_receiver, new_receiver) = (Receiver::start(0).await, Receiver::start(0).await);
    let env = TestEnv::with(&[("webhooks.poll_interval_ms", "200")]).await;
    let allow = format!(
        "{},{},{}",
        env.tools.addr(),
        old_receiver.addr,
        new_receiver.addr
    );
    let app = env.spawn_api_with(&[("egress.allow", &allow)]).await;
    let resp = app
        .post(
            "/v1/webhooks",
            &json!({"url": new_receiver.url(), "events": ["run.completed"]}),
        )
        .await;
    let created = json_of(resp, 201).await;
    let new_secret = created["secret"].as_str().unwrap().to_owned();
    new_receiver.trust(&new_secret);
    assert_eq!(plain_secrets(&env).await, 0, "a registration is sealed");

    // As the table held it before the upgrade: the secret in the plain column only.
    let old_secret = agentfleet_shared::store::webhooks::generate_secret();
    sqlx::query(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret)
         VALUES (gen_random_uuid(), $1, $2, '{run.completed}', $3)",
    )
    .bind(app.tenant_id)
    .bind(old_receiver.url())
    .bind(&old_secret)
    .execute(&env.pool)
    .await
    .unwrap();
    old_receiver.trust(&old_secret);
    assert_eq!(plain_secrets(&env).await, 1);
    let dump = pg_dump(&env).await;
    assert!(
        dump.contains(&old_secret),
        "the check below would see a plain secret"
    );

    // Two more replicas start at once: each runs the sealing step; the row is sealed once.
    let _b = env.spawn_api_with(&[("egress.allow", &allow)]).await;
    let _c = env.spawn_api_with(&[("egress.allow", &allow)]).await;
    wait_for("the plain secret sealed", T, || async {
        (plain_secrets(&env).await == 0).then_some(())
    })
    .await;
    let dump = pg_dump(&env).await;
    for secret in [&old_secret, &new_secret] {
        let key_part = secret.strip_prefix("whsec_").unwrap();
        assert!(
            !dump.contains(key_part),
            "the dump holds a webhook secret in clear"
        );
    }
    assert!(
        dump.contains("secret_sealed"),
        "the dump is of the right table"
    );

    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "sealed"}]), json!([])))
        .await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    for receiver in [&old_receiver, &new_receiver] {
        let got = wait_for("the delivery acknowledged", T, || async {
            let got = receiver.acknowledged();
            (!got.is_empty()).then_some(got)
        })
        .await;
        assert!(
            got[0].signed,
            "the signature verifies with the secret shown"
        );
        assert_eq!(got[0].body["data"]["run_id"], run_id.as_str());
    }
}

/// `GET /v1/runs/{id}/events?token=` with a token of `key`: the status.
async fn stream_status(app: &TestApp, run_id: &str, token: &str) -> u16 {
    let resp = app
        .http
        .get(app.url(&format!("/v1/runs/{run_id}/events?token={token}")))
        .send()
        .await
        .expect("request");
    resp.status().as_u16()
}

async fn token_of(app: &TestApp, run_id: &str, key: &str) -> Value {
    let resp = app
        .http
        .post(app.url(&format!("/v1/runs/{run_id}/stream-token")))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    json_of(resp, 200).await
}

async fn new_key(app: &TestApp, body: Value) -> (String, String) {
    let resp = app
        .http
        .post(app.url(&format!("/admin/v1/tenants/{}/keys", app.tenant_id)))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let created = json_of(resp, 201).await;
    (
        created["api_key"].as_str().unwrap().to_owned(),
        created["key"]["id"].as_str().unwrap().to_owned(),
    )
}

/// A stream token is refused once the key that asked for it is revoked (announced to the
/// replicas: the long cache does not keep it alive) or has expired, though the token itself
/// has not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_token_is_refused_once_its_key_is_revoked_or_expired() {
    let env = TestEnv::with(&[
        ("api.admin_token", ADMIN),
        ("api.auth_cache_ttl_ms", "600000"),
    ])
    .await;
    let app = env.spawn_api().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "hi"}]), json!([])))
        .await;
    let run_id = run["id"].as_str().unwrap().to_owned();

    let (key, key_id) = new_key(&app, json!({"name": "browser"})).await;
    let token = token_of(&app, &run_id, &key).await;
    let token = token["token"].as_str().unwrap().to_owned();
    assert_eq!(stream_status(&app, &run_id, &token).await, 200);
    let resp = app
        .http
        .post(app.url(&format!("/admin/v1/keys/{key_id}/revoke")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    json_of(resp, 200).await;
    wait_for("the revoked key's token refused", T, || async {
        (stream_status(&app, &run_id, &token).await == 401).then_some(())
    })
    .await;
    // The tenant's other key still gets tokens that work.
    let other = token_of(&app, &run_id, &app.api_key).await;
    let other = other["token"].as_str().unwrap();
    assert_eq!(stream_status(&app, &run_id, other).await, 200);

    let (short, _) = new_key(&app, json!({"name": "short", "expires_in_secs": 3})).await;
    let issued = token_of(&app, &run_id, &short).await;
    let token = issued["token"].as_str().unwrap().to_owned();
    let expires: chrono::DateTime<chrono::Utc> =
        issued["expires_at"].as_str().unwrap().parse().unwrap();
    assert!(
        expires <= chrono::Utc::now() + chrono::Duration::seconds(4),
        "the token ends with its key: {expires}"
    );
    assert_eq!(stream_status(&app, &run_id, &token).await, 200);
    wait_for("the expired key's token refused", T, || async {
        (stream_status(&app, &run_id, &token).await == 401).then_some(())
    })
    .await;
}

/// The admin API answers on `api.admin_listen` and not on the public listener, which answers
/// nothing of it; a source failing `api.admin_max_failures` times gets 429 with `Retry-After`,
/// even with the right token; a short token is refused at start naming its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_has_its_own_listener_and_limits_failed_attempts() {
    let env = TestEnv::new().await;
    let app = agentfleet_api::Application::build(env.settings_with(&[
        ("api.admin_token", ADMIN),
        ("api.admin_listen", "127.0.0.1:0"),
        ("api.admin_max_failures", "3"),
    ]))
    .await
    .expect("api builds");
    let public = format!("http://127.0.0.1:{}", app.port());
    let admin = format!(
        "http://127.0.0.1:{}",
        app.admin_port().expect("an admin listener")
    );
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(app.run_until_stopped(async move { stopped.cancelled().await }));
    let _stop = stop.drop_guard();
    let http = reqwest::Client::new();
    let get = |base: &str, path: &str, token: &str| {
        http.get(format!("{base}{path}")).bearer_auth(token).send()
    };

    let page = json_of(get(&admin, "/admin/v1/tenants", ADMIN).await.unwrap(), 200).await;
    assert!(page["data"].is_array(), "{page}");
    let body = json_of(get(&public, "/admin/v1/tenants", ADMIN).await.unwrap(), 404).await;
    assert_eq!(body["error"]["code"], "not_found");
    // Nothing of the public API on the admin listener.
    json_of(get(&admin, "/v1/runs", ADMIN).await.unwrap(), 404).await;
    assert_eq!(
        get(&public, "/healthz", "")
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );

    let wrong = "wrong-token-0123456789abcdef0123456789";
    for _ in 0..3 {
        let body = json_of(get(&admin, "/admin/v1/tenants", wrong).await.unwrap(), 401).await;
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    for token in [wrong, ADMIN] {
        let resp = get(&admin, "/admin/v1/tenants", token).await.unwrap();
        let retry_after: u64 = resp
            .headers()
            .get("retry-after")
            .expect("Retry-After")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=300).contains(&retry_after), "{retry_after}");
        let body = json_of(resp, 429).await;
        assert_eq!(body["error"]["code"], "too_many_attempts");
    }

    let short = "x".repeat(31);
    let overrides = vec![("api.admin_token".to_owned(), short.clone())];
    let err = Settings::load_with(None, overrides, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("api.admin_token") && err.contains("32"),
        "{err}"
    );
    assert!(!err.contains(&short), "the token is not echoed: {err}");
}

/// An MCP server with headers over plain `http://` to an address `egress.allow` does not list
/// is refused naming `url`, and nothing is written; https, a listed address, or no headers
/// are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_headers_over_plain_http_to_an_unlisted_host_are_refused() {
    let env = TestEnv::with(&[("mcp.encryption_key", WEBHOOK_KEY)]).await;
    let app = env.spawn_api().await;
    let headers = json!([{"name": "Authorization", "value": "Bearer tool-secret"}]);
    let resp = app
        .post(
            "/v1/mcp-servers",
            &json!({"name": "clear", "url": "http://mcp.example.com/mcp", "headers": headers}),
        )
        .await;
    let body = json_of(resp, 422).await;
    assert_eq!(body["error"]["code"], "invalid_request");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("url:"), "{message}");
    assert!(message.contains("https://"), "{message}");
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM mcp_servers")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing written");

    let listed = format!("http://{}/mcp", env.tools.addr());
    for (name, url, headers) in [
        ("tls", "https://mcp.example.com/mcp", headers.clone()),
        ("listed", listed.as_str(), headers.clone()),
        ("open", "http://mcp.example.com/mcp", json!([])),
    ] {
        let resp = app
            .post(
                "/v1/mcp-servers",
                &json!({"name": name, "url": url, "headers": headers}),
            )
            .await;
        json_of(resp, 201).await;
    }
}
