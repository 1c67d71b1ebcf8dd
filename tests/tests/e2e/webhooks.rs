//! Webhooks: signed deliveries from the outbox, at least once with a stable id, through
//! receiver errors and an API that dies between the commit and the send.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use agentfleet_tests::harness::*;
use agentfleet_tests::webhook_receiver::{Received, Receiver};

const T: Duration = Duration::from_secs(60);

/// Retries come back within a fraction of a second; a dead replica's claim lasts 3 s.
const FAST: [(&str, &str); 5] = [
    ("webhooks.poll_interval_ms", "200"),
    ("webhooks.backoff_base_ms", "50"),
    ("webhooks.backoff_max_ms", "200"),
    ("webhooks.timeout_ms", "2000"),
    ("webhooks.claim_lease_ms", "3000"),
];

const RUN_EVENTS: [&str; 5] = [
    "run.waiting_for_input",
    "run.waiting_for_confirmation",
    "run.completed",
    "run.failed",
    "run.cancelled",
];

fn risky(env: &TestEnv) -> Value {
    let mut t = http_tool(env, "transfer", "/side-effect");
    t["risk"] = json!("high");
    t
}

async fn register(app: &TestApp, body: Value) -> (u16, Value) {
    let resp = app.post("/v1/webhooks", &body).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn deliveries_in_db(env: &TestEnv) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM webhook_deliveries")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    n
}

/// The done-when of webhooks: each event arrives exactly once per delivery id, signed, though
/// the receiver answers 500 to the first two attempts of each and the replica that claimed the
/// first delivery dies after the change committed and before it sent anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_arrives_once_per_id_signed_through_500s_and_an_api_restart() {
    let receiver = Receiver::start(2).await;
    let env = TestEnv::with(&FAST).await;
    let allow = format!("{},{}", env.tools.addr(), receiver.addr);
    // This replica serves the tenant's calls and sends nothing.
    let app = env
        .spawn_api_with(&[("egress.allow", &allow), ("webhooks.enabled", "false")])
        .await;
    let (status, created) = register(
        &app,
        json!({"url": receiver.url(), "events": RUN_EVENTS, "description": "all run events"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    receiver.trust(created["secret"].as_str().unwrap());
    let endpoint = created["id"].as_str().unwrap().to_owned();
    // The sending replica dies right after its first claim commits.
    let (mut doomed, _) = env
        .spawn_api_process(&[
            ("AGENTFLEET_FAILPOINTS", "webhook_before_send"),
            ("AGENTFLEET__EGRESS__ALLOW", &allow),
        ])
        .await;
    let _worker = env.spawn_worker().await;

    let start = |turns: Value, tools: Value| {
        let mut body = scripted_run(turns, tools);
        body["metadata"] = json!({"case": "webhooks"});
        body
    };
    let done = app
        .start_run(&start(json!([{"content": "done"}]), json!([])))
        .await;
    let failing = app
        .start_run(&start(json!([{"status": 400}]), json!([])))
        .await;
    let asking = app
        .start_run(&start(
            json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "Which one?"}}]}]),
            json!([]),
        ))
        .await;
    let confirming = app
        .start_run(&start(
            json!([{"tool_calls": [{"name": "transfer", "arguments": {"amount": 5}}]}]),
            json!([risky(&env)]),
        ))
        .await;
    let id = |run: &Value| run["id"].as_str().unwrap().to_owned();
    let (done, failing, asking, confirming) =
        (id(&done), id(&failing), id(&asking), id(&confirming));
    app.wait_status(&done, &["completed"], T).await;
    app.wait_status(&failing, &["failed"], T).await;
    app.wait_status(&asking, &["waiting_for_input"], T).await;
    app.wait_status(&confirming, &["waiting_for_confirmation"], T)
        .await;
    let resp = app
        .post(&format!("/v1/runs/{asking}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);

    assert_eq!(
        doomed.wait_exit(T).await,
        None,
        "aborted by the failpoint after its claim"
    );
    assert!(receiver.got().is_empty(), "nothing was sent before it died");
    let (claimed, pending): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE attempts > 0), count(*) FILTER (WHERE status = 'pending')
         FROM webhook_deliveries",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(claimed >= 1, "the dead replica's claim is recorded");
    assert_eq!(pending, 5, "every change wrote its delivery, none sent yet");

    // A replica without the failpoint takes over once the dead one's claim lapses.
    let (_sender, _) = env
        .spawn_api_process(&[("AGENTFLEET__EGRESS__ALLOW", &allow)])
        .await;
    wait_for("five acknowledged deliveries", T, || async {
        (receiver.acknowledged().len() >= 5).then_some(())
    })
    .await;
    let delivered = wait_for("five deliveries recorded as delivered", T, || async {
        let resp = app
            .get(&format!("/v1/webhooks/{endpoint}/deliveries"))
            .await;
        let page: Value = resp.json().await.ok()?;
        let data = page["data"].as_array()?.clone();
        (data.len() == 5 && data.iter().all(|d| d["status"] == "delivered")).then_some(data)
    })
    .await;

    let got = receiver.got();
    assert!(
        got.iter().all(|r| r.signed),
        "every attempt is signed: {got:?}"
    );
    assert!(got.iter().all(|r| r.fresh), "timestamps are the attempt's");
    let mut by_id: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
    for r in &got {
        by_id.entry(r.id.as_str()).or_default().push(r);
    }
    assert_eq!(by_id.len(), 5, "one delivery id per event: {got:#?}");
    for (id, attempts) in &by_id {
        let answers: Vec<u16> = attempts.iter().map(|r| r.answered).collect();
        assert_eq!(
            answers,
            [500, 500, 200],
            "delivery {id}: acknowledged once, after the 500s"
        );
        assert!(
            attempts.iter().all(|r| r.body == attempts[0].body),
            "the same body on every attempt of {id}"
        );
    }
    let events: BTreeSet<(String, String)> = receiver
        .acknowledged()
        .iter()
        .map(|r| {
            (
                r.body["type"].as_str().unwrap().to_owned(),
                r.body["data"]["run_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("run.completed", &done),
        ("run.failed", &failing),
        ("run.waiting_for_input", &asking),
        ("run.cancelled", &asking),
        ("run.waiting_for_confirmation", &confirming),
    ]
    .into_iter()
    .map(|(t, r)| (t.to_owned(), r.clone()))
    .collect();
    assert_eq!(events, expected);
    let body_of = |event: &str| {
        receiver
            .acknowledged()
            .into_iter()
            .find(|r| r.body["type"] == event)
            .unwrap()
            .body
    };
    let failed = body_of("run.failed");
    assert!(failed["data"]["error"]["code"].is_string(), "{failed}");
    assert_eq!(failed["data"]["metadata"], json!({"case": "webhooks"}));
    let asked = body_of("run.waiting_for_input");
    assert_eq!(
        asked["data"]["pending"]["question"], "Which one?",
        "{asked}"
    );
    let confirm = body_of("run.waiting_for_confirmation");
    assert_eq!(
        confirm["data"]["pending"]["tool_calls"][0]["arguments"],
        json!({"amount": 5}),
        "{confirm}"
    );
    let cancelled = body_of("run.cancelled");
    assert_eq!(cancelled["data"]["previous_status"], "waiting_for_input");
    assert!(chrono::DateTime::parse_from_rfc3339(cancelled["timestamp"].as_str().unwrap()).is_ok());
    // The listing shows each delivery's attempts under its stable id.
    for d in &delivered {
        let id = d["id"].as_str().unwrap();
        assert!(by_id.contains_key(id), "{d}");
        assert!(d["attempts"].as_i64().unwrap() >= 3, "{d}");
        assert_eq!(d["last_status_code"], 200);
        assert!(d["next_attempt_at"].is_null());
    }
    // A change that rolls back writes nothing: a completed run cannot be cancelled.
    let resp = app
        .post(&format!("/v1/runs/{done}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 409);
    assert_eq!(deliveries_in_db(&env).await, 5);
}

/// A replica that dies after the receiver acknowledged, before recording it, makes the
/// delivery go again under the same id: at least once, deduplicable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_dying_after_the_send_redelivers_under_the_same_id() {
    let receiver = Receiver::start(0).await;
    let env = TestEnv::with(&FAST).await;
    let allow = format!("{},{}", env.tools.addr(), receiver.addr);
    let app = env
        .spawn_api_with(&[("egress.allow", &allow), ("webhooks.enabled", "false")])
        .await;
    let (status, created) = register(
        &app,
        json!({"url": receiver.url(), "events": ["run.completed"]}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    receiver.trust(created["secret"].as_str().unwrap());
    let endpoint = created["id"].as_str().unwrap().to_owned();
    let (mut doomed, _) = env
        .spawn_api_process(&[
            ("AGENTFLEET_FAILPOINTS", "webhook_after_send"),
            ("AGENTFLEET__EGRESS__ALLOW", &allow),
        ])
        .await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "once"}]), json!([])))
        .await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    assert_eq!(doomed.wait_exit(T).await, None, "aborted after its send");
    assert_eq!(
        receiver.acknowledged().len(),
        1,
        "acknowledged, not recorded"
    );
    let (_sender, _) = env
        .spawn_api_process(&[("AGENTFLEET__EGRESS__ALLOW", &allow)])
        .await;
    let d = wait_for("the delivery recorded as delivered", T, || async {
        let page: Value = app
            .get(&format!("/v1/webhooks/{endpoint}/deliveries"))
            .await
            .json()
            .await
            .ok()?;
        let d = page["data"].get(0)?.clone();
        (d["status"] == "delivered").then_some(d)
    })
    .await;
    let got = receiver.got();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|r| r.signed && r.answered == 200));
    assert_eq!(got[0].id, got[1].id, "the same webhook-id both times");
    assert_eq!(got[0].body, got[1].body);
    assert_eq!(got[0].id, d["id"].as_str().unwrap());
    assert_eq!(got[0].body["data"]["run_id"], run_id.as_str());
    assert_eq!(d["attempts"], 2);
}

/// Registration is checked (egress policy, scheme, events, secret, count, tenancy); a name
/// resolving to a refused address is refused at delivery; a deleted endpoint's deliveries are
/// gone and its tenant's later changes write none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_is_checked_and_a_deleted_endpoint_gets_nothing_more() {
    let receiver = Receiver::start(0).await;
    let mut overrides = FAST.to_vec();
    overrides.push(("webhooks.max_endpoints_per_tenant", "2"));
    overrides.push(("webhooks.max_attempts", "2"));
    let env = TestEnv::with(&overrides).await;
    let allow = format!("{},{}", env.tools.addr(), receiver.addr);
    let app = env.spawn_api_with(&[("egress.allow", &allow)]).await;
    let _worker = env.spawn_worker().await;

    for (body, field) in [
        (
            json!({"url": "http://10.0.0.1/h", "events": ["run.completed"]}),
            "url:",
        ),
        (
            json!({"url": "https://169.254.169.254/latest", "events": ["run.completed"]}),
            "url:",
        ),
        (
            json!({"url": "http://example.com/h", "events": ["run.completed"]}),
            "url:",
        ),
        (
            json!({"url": "https://u:p@example.com/h", "events": ["run.completed"]}),
            "url:",
        ),
        (json!({"url": receiver.url(), "events": []}), "events:"),
        (
            json!({"url": receiver.url(), "events": ["run.started"]}),
            "events[0]:",
        ),
        (
            json!({"url": receiver.url(), "events": ["run.failed", "run.failed"]}),
            "events[1]:",
        ),
        (
            json!({"url": receiver.url(), "events": ["run.failed"], "secret": "whsec_short"}),
            "secret:",
        ),
    ] {
        let (status, err) = register(&app, body.clone()).await;
        assert_eq!(status, 422, "{body} -> {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body} -> {message}");
    }

    let secret = format!("whsec_{}", STANDARD.encode([42u8; 32]));
    let (status, created) = register(
        &app,
        json!({"url": receiver.url(), "events": ["run.completed", "run.cancelled"], "secret": secret}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created["secret"],
        secret.as_str(),
        "a supplied secret is kept"
    );
    receiver.trust(&secret);
    let endpoint = created["id"].as_str().unwrap().to_owned();
    let shown: Value = app
        .get(&format!("/v1/webhooks/{endpoint}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(shown["events"], json!(["run.completed", "run.cancelled"]));
    assert!(shown.get("secret").is_none(), "shown once only: {shown}");
    let other = env.new_tenant_key().await;
    let resp = app
        .get_as(&format!("/v1/webhooks/{endpoint}"), &other)
        .await;
    assert_eq!(resp.status(), 404, "another tenant's endpoint");
    // A rotation signs everything from now on with the new secret.
    let resp = app
        .post(
            &format!("/v1/webhooks/{endpoint}/rotate-secret"),
            &json!({}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let rotated: Value = resp.json().await.unwrap();
    let new_secret = rotated["secret"].as_str().unwrap();
    assert!(new_secret.starts_with("whsec_") && new_secret != secret);
    receiver.trust(new_secret);

    // A name is judged when it resolves: localhost is loopback, which only a literal
    // address with its port is opened to.
    let port = receiver.addr.port();
    let (status, refused) = register(
        &app,
        json!({"url": format!("https://localhost:{port}/hooks"), "events": ["run.completed"]}),
    )
    .await;
    assert_eq!(status, 201, "{refused}");
    let (status, err) = register(
        &app,
        json!({"url": receiver.url(), "events": ["run.failed"]}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (409, Some("too_many_webhooks"))
    );
    let listed: Value = app.get("/v1/webhooks").await.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2);

    let run = app
        .start_run(&scripted_run(json!([{"content": "hi"}]), json!([])))
        .await;
    let run_id = run["id"].as_str().unwrap().to_owned();
    app.wait_status(&run_id, &["completed"], T).await;
    wait_for("the completed run's delivery", T, || async {
        (receiver.acknowledged().len() == 1).then_some(())
    })
    .await;
    let got = receiver.got();
    assert!(got[0].signed && got[0].body["data"]["run_id"] == run_id.as_str());
    let refused_id = refused["id"].as_str().unwrap();
    let attempt = wait_for("the refused address's delivery given up", T, || async {
        let page: Value = app
            .get(&format!("/v1/webhooks/{refused_id}/deliveries"))
            .await
            .json()
            .await
            .ok()?;
        let d = page["data"].get(0)?.clone();
        (d["status"] == "failed").then_some(d)
    })
    .await;
    assert!(
        attempt["last_error"]
            .as_str()
            .unwrap()
            .starts_with("egress_denied"),
        "{attempt}"
    );
    assert_eq!(
        attempt["attempts"], 2,
        "given up after webhooks.max_attempts: {attempt}"
    );
    assert!(attempt["finished_at"].is_string() && attempt["next_attempt_at"].is_null());
    // A given-up delivery can be sent again by hand, under the same id.
    let delivery = attempt["id"].as_str().unwrap();
    let app = &app;
    let retry = |d: String| {
        let url = format!("/v1/webhooks/{refused_id}/deliveries/{d}/retry");
        async move { app.post(&url, &json!({})).await }
    };
    let resp = retry(delivery.to_owned()).await;
    assert_eq!(resp.status(), 200);
    let again: Value = resp.json().await.unwrap();
    assert_eq!(
        (again["id"].as_str(), again["status"].as_str()),
        (Some(delivery), Some("pending"))
    );
    wait_for("the retried delivery given up again", T, || async {
        let page: Value = app
            .get(&format!("/v1/webhooks/{refused_id}/deliveries"))
            .await
            .json()
            .await
            .ok()?;
        let d = &page["data"][0];
        (d["status"] == "failed" && d["attempts"] == 3).then_some(())
    })
    .await;
    assert_eq!(retry(uuid::Uuid::now_v7().to_string()).await.status(), 404);
    assert_eq!(retry("nope".into()).await.status(), 422);

    // A cancel that is refused changes nothing and writes no delivery.
    let resp = app
        .post(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 409);
    assert_eq!(deliveries_in_db(&env).await, 2);

    // Deleting stops it all: pending deliveries go with the endpoint, and new changes write
    // none for it.
    for id in [endpoint.as_str(), refused_id] {
        let resp = app
            .http
            .delete(app.url(&format!("/v1/webhooks/{id}")))
            .bearer_auth(&app.api_key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(
        app.get(&format!("/v1/webhooks/{endpoint}")).await.status(),
        404
    );
    assert_eq!(deliveries_in_db(&env).await, 0);
    let again = app
        .start_run(&scripted_run(json!([{"content": "again"}]), json!([])))
        .await;
    app.wait_status(again["id"].as_str().unwrap(), &["completed"], T)
        .await;
    assert_eq!(deliveries_in_db(&env).await, 0);
    assert_eq!(receiver.got().len(), 1);
}

/// `batch.completed` is written by the transaction that finishes the batch: one delivery,
/// signed, carrying the batch's final view, though the receiver fails its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_batch_sends_batch_completed_once_with_its_counts() {
    let receiver = Receiver::start(1).await;
    let env = TestEnv::with(&FAST).await;
    let allow = format!("{},{}", env.tools.addr(), receiver.addr);
    let app = env
        .spawn_api_with(&[
            ("egress.allow", &allow),
            ("api.batch_sweep_interval_ms", "100"),
        ])
        .await;
    let (status, created) = register(
        &app,
        json!({"url": receiver.url(), "events": ["batch.completed"]}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    receiver.trust(created["secret"].as_str().unwrap());
    let _worker = env.spawn_worker().await;
    let runs: Vec<Value> = (0..3)
        .map(|i| {
            let mut run = scripted_run(json!([{"content": format!("answer {i}")}]), json!([]));
            run["custom_id"] = json!(format!("item-{i}"));
            run
        })
        .collect();
    let resp = app.post("/v1/batches", &json!({"runs": runs})).await;
    assert_eq!(resp.status().as_u16(), 202);
    let batch: Value = resp.json().await.unwrap();
    let batch_id = batch["id"].as_str().unwrap().to_owned();
    let got = wait_for("batch.completed acknowledged", T, || async {
        let got = receiver.acknowledged();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    let hook = &got[0];
    assert!(hook.signed && hook.fresh, "{hook:?}");
    assert_eq!(hook.body["type"], "batch.completed");
    assert_eq!(hook.body["data"]["id"], batch_id.as_str());
    assert_eq!(hook.body["data"]["status"], "completed");
    assert_eq!(hook.body["data"]["total"], 3);
    assert_eq!(hook.body["data"]["counts"]["completed"], 3);
    let attempts = receiver.got();
    assert_eq!(attempts.len(), 2, "one 500, then the 200: {attempts:?}");
    assert!(attempts.iter().all(|r| r.id == hook.id));
    // Reading the finished batch again finishes nothing twice.
    let view: Value = app
        .get(&format!("/v1/batches/{batch_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(view["status"], "completed");
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_deliveries WHERE event = 'batch.completed'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(n, 1);
}

/// Slow endpoints of one tenant hold only that tenant's share of the deliverer's slots: with
/// twenty endpoints of tenant A that never answer (each attempt holds its slot until
/// `webhooks.timeout_ms`) and more of A's deliveries due than there are slots, tenant B's
/// delivery, due after all of A's, is delivered within one delivery timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_endpoints_of_one_tenant_do_not_delay_another_tenants_deliveries() {
    const TIMEOUT_MS: i64 = 4000;
    // Accepts connections and never answers: every attempt waits for its timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let holder = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = silent.accept().await {
            holder.lock().unwrap().push(conn);
        }
    });
    let receiver = Receiver::start(0).await;
    let env = TestEnv::with(&[
        ("webhooks.poll_interval_ms", "200"),
        ("webhooks.timeout_ms", "4000"),
        ("webhooks.claim_lease_ms", "60000"),
        ("webhooks.max_concurrency", "16"),
        ("webhooks.max_concurrency_per_tenant", "4"),
        ("webhooks.max_endpoints_per_tenant", "20"),
    ])
    .await;
    let allow = format!("{silent_addr},{}", receiver.addr);
    let a = env.spawn_api_with(&[("egress.allow", &allow)]).await;
    let b = env.app_at(&a.address, reqwest::Client::new()).await;
    for i in 0..20 {
        let url = format!("http://{silent_addr}/slow/{i}");
        let (status, body) = register(&a, json!({"url": url, "events": ["run.cancelled"]})).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = register(
        &b,
        json!({"url": receiver.url(), "events": ["run.cancelled"]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    receiver.trust(body["secret"].as_str().unwrap());
    // No worker: a queued run is cancelled at once, and each cancel is one delivery per
    // endpoint. Two of A's: 40 deliveries, more than the deliverer's 16 slots.
    cancel(&a).await;
    cancel(&a).await;
    // A's attempts hold their slots (none of them can end before the timeout).
    wait_for("A's deliveries in flight", T, || async {
        let claimed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries WHERE tenant_id = $1 AND attempts > 0",
        )
        .bind(a.tenant_id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (claimed >= 4).then_some(())
    })
    .await;
    let in_flight: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_deliveries WHERE tenant_id = $1 AND attempts > 0",
    )
    .bind(a.tenant_id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(
        in_flight <= 4,
        "A holds {in_flight} slots, past its share of 4"
    );
    cancel(&b).await;
    let waited_ms: f64 = wait_for("B's delivery", T, || async {
        sqlx::query_scalar(
            "SELECT (extract(epoch FROM finished_at - created_at) * 1000)::float8 \
               FROM webhook_deliveries WHERE tenant_id = $1 AND status = 'delivered'",
        )
        .bind(b.tenant_id)
        .fetch_optional(&env.pool)
        .await
        .unwrap()
    })
    .await;
    assert!(
        waited_ms < TIMEOUT_MS as f64,
        "B's delivery waited {waited_ms} ms behind A's slow endpoints (timeout {TIMEOUT_MS} ms)"
    );
    assert_eq!(receiver.acknowledged().len(), 1);
    drop(held);
}

/// Starts a run and cancels it while it is queued.
async fn cancel(app: &TestApp) {
    let run = app
        .start_run(&scripted_run(json!([{"content": "x"}]), json!([])))
        .await;
    let id = run["id"].as_str().unwrap().to_owned();
    let resp = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(resp.status(), 200);
}
