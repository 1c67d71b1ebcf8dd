//! Tenant erasure (`DELETE /admin/v1/tenants/{id}`, `agentfleet-api tenants erase`): the
//! tenant's keys are refused at once, its runs are cancelled, and every row of it in every
//! table and every Redis key of it goes, while another tenant's rows and keys stay exactly as
//! they were; the status ends `done` with every table counted at 0.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_tests::harness::*;

const ADMIN: &str = "erasure-admin-token-0123456789abcdef";

/// What each test's fleet runs with: erasure quick to start and in small batches (so that
/// every table takes several steps), nothing sent to webhook endpoints (their deliveries stay
/// as written), key uses flushed often.
fn settings(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut all = vec![
        ("api.admin_token", ADMIN),
        ("erasure.grace_ms", "1000"),
        ("erasure.batch_size", "7"),
        ("erasure.interval_ms", "200"),
        ("erasure.lease_ms", "2000"),
        ("webhooks.enabled", "false"),
        ("api.key_last_used_flush_ms", "100"),
    ];
    all.extend_from_slice(extra);
    all
}

async fn admin(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = app.http.request(method, app.url(path)).bearer_auth(ADMIN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("admin request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post_as(app: &TestApp, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let resp = app
        .http
        .post(app.url(path))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn status_as(app: &TestApp, key: &str, path: &str) -> u16 {
    app.get_as(path, key).await.status().as_u16()
}

/// Every table of the schema, each row as its JSON text, sorted: the database as text.
async fn dump(env: &TestEnv) -> BTreeMap<String, Vec<String>> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
          WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut out = BTreeMap::new();
    for table in tables {
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT row_to_json(t)::text FROM \"{table}\" t ORDER BY 1"
        )))
        .fetch_all(&env.pool)
        .await
        .unwrap();
        out.insert(table, rows);
    }
    out
}

/// Every Redis key under the test's prefix with its value (a string, or a list's elements):
/// SCAN is fine on the test's own prefix.
async fn redis_keys(env: &TestEnv) -> BTreeMap<String, String> {
    let mut conn = redis_connection();
    let mut cursor: u64 = 0;
    let mut names = BTreeSet::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}:*", env.prefix))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        names.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut out = BTreeMap::new();
    for name in names {
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        let value = match kind.as_str() {
            "string" => redis::cmd("GET")
                .arg(&name)
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap()
                .unwrap_or_default(),
            "list" => redis::cmd("LRANGE")
                .arg(&name)
                .arg(0)
                .arg(-1)
                .query_async::<Vec<Vec<u8>>>(&mut conn)
                .await
                .unwrap()
                .iter()
                .map(|e| String::from_utf8_lossy(e).into_owned())
                .collect::<Vec<_>>()
                .join("\n"),
            "none" => continue,
            other => format!("<{other}>"),
        };
        out.insert(name, value);
    }
    out
}

/// The ids of everything of `tenant`, as text: what must not be found anywhere after its
/// erasure.
async fn ids_of(env: &TestEnv, tenant: Uuid) -> BTreeSet<String> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT $1::uuid
         UNION SELECT id FROM api_keys WHERE tenant_id = $1
         UNION SELECT id FROM threads WHERE tenant_id = $1
         UNION SELECT id FROM runs WHERE tenant_id = $1
         UNION SELECT c.id FROM tool_calls c JOIN runs r ON r.id = c.run_id WHERE r.tenant_id = $1
         UNION SELECT id FROM batches WHERE tenant_id = $1
         UNION SELECT id FROM webhook_endpoints WHERE tenant_id = $1
         UNION SELECT id FROM webhook_deliveries WHERE tenant_id = $1
         UNION SELECT id FROM mcp_servers WHERE tenant_id = $1",
    )
    .bind(tenant)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    ids.into_iter().map(|id| id.to_string()).collect()
}

fn mentions(text: &str, ids: &BTreeSet<String>) -> bool {
    ids.iter().any(|id| text.contains(id.as_str()))
}

/// Each tenant's active runs by the deltas of `rows`.
fn active_runs(rows: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    for row in rows.get("tenant_active_deltas").into_iter().flatten() {
        let d: Value = serde_json::from_str(row).unwrap();
        *sums
            .entry(d["tenant_id"].as_str().unwrap().to_owned())
            .or_default() += d["delta"].as_i64().unwrap();
    }
    sums.retain(|_, n| *n != 0);
    sums
}

/// The rows (and Redis keys) that mention none of `ids`: everything but the erased tenant's.
fn others(
    rows: &BTreeMap<String, Vec<String>>,
    ids: &BTreeSet<String>,
) -> BTreeMap<String, Vec<String>> {
    rows.iter()
        .map(|(table, rows)| {
            let kept = rows.iter().filter(|r| !mentions(r, ids)).cloned().collect();
            (table.clone(), kept)
        })
        .collect()
}

async fn count(env: &TestEnv, sql: &str, tenant: Uuid) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(tenant)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// Gives a tenant (through `key`) something in every table: finished runs with tool calls,
/// iterations, messages and usage; a batch; a webhook endpoint (with deliveries of its runs'
/// changes); an MCP server. Returns the finished runs' ids.
async fn fill(env: &TestEnv, app: &TestApp, key: &str) -> Vec<String> {
    let (status, hook) = post_as(
        app,
        key,
        "/v1/webhooks",
        &json!({"url": "https://93.184.216.34/hook", "events": ["run.completed", "run.cancelled", "run.waiting_for_input"]}),
    )
    .await;
    assert_eq!(status, 201, "{hook}");
    let (status, mcp) = post_as(
        app,
        key,
        "/v1/mcp-servers",
        &json!({"name": "docs", "url": "https://93.184.216.34/mcp", "description": "docs"}),
    )
    .await;
    assert_eq!(status, 201, "{mcp}");
    let tools = json!([http_tool(env, "add", "/add")]);
    let mut runs = Vec::new();
    for i in 0..3 {
        let body = scripted_run(
            json!([
                {"content": "adding", "tool_calls": [{"name": "add", "arguments": {"a": i, "b": 2}}]},
                {"content": format!("the sum is {}", i + 2)}
            ]),
            tools.clone(),
        );
        let (status, run) = post_as(app, key, "/v1/runs", &body).await;
        assert_eq!(status, 202, "{run}");
        runs.push(run["id"].as_str().unwrap().to_owned());
    }
    let items: Vec<Value> = (0..3)
        .map(|i| json!({"custom_id": format!("item-{i}"), "input": format!("item {i}"), "agent": {"model": "mock"}}))
        .collect();
    let (status, batch) = post_as(app, key, "/v1/batches", &json!({"runs": items})).await;
    assert_eq!(status, 202, "{batch}");
    let batch_id = batch["id"].as_str().unwrap().to_owned();
    for run in &runs {
        wait_for(
            &format!("run {run} to complete"),
            Duration::from_secs(60),
            || async {
                let got: Value = app
                    .get_as(&format!("/v1/runs/{run}"), key)
                    .await
                    .json()
                    .await
                    .ok()?;
                (got["status"] == "completed").then_some(())
            },
        )
        .await;
    }
    wait_for("the batch to complete", Duration::from_secs(60), || async {
        let got: Value = app
            .get_as(&format!("/v1/batches/{batch_id}"), key)
            .await
            .json()
            .await
            .ok()?;
        (got["status"] == "completed").then_some(())
    })
    .await;
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_tenant_leaves_no_row_and_no_key_and_another_tenant_is_untouched() {
    let env = TestEnv::with(&settings(&[])).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let erased = app.tenant_id;
    let key_a = app.api_key.clone();

    // Tenant B: the same kinds of data, finished before A's erasure begins.
    let (status, b) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/v1/tenants",
        Some(json!({"name": "bystander"})),
    )
    .await;
    assert_eq!(status, 201, "{b}");
    let key_b = b["api_key"].as_str().unwrap().to_owned();
    let tenant_b: Uuid = b["tenant"]["id"].as_str().unwrap().parse().unwrap();
    fill(&env, &app, &key_b).await;

    // Tenant A: the same, a second key, and runs in every state not yet ended.
    let (status, second) = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/v1/tenants/{erased}/keys"),
        Some(json!({"name": "second"})),
    )
    .await;
    assert_eq!(status, 201, "{second}");
    let key_a2 = second["api_key"].as_str().unwrap().to_owned();
    fill(&env, &app, &key_a).await;
    let asking = app
        .start_run(&scripted_run(
            json!([{"tool_calls": [{"name": "ask", "arguments": {"text": "Which one?"}}]}, {"content": "ok"}]),
            json!([]),
        ))
        .await;
    let asking = asking["id"].as_str().unwrap().to_owned();
    let slow = app
        .start_run(&scripted_run(
            json!([{"content": "slow", "delay_ms": 120000}]),
            json!([]),
        ))
        .await;
    let slow_thread = slow["thread_id"].as_str().unwrap().to_owned();
    let slow = slow["id"].as_str().unwrap().to_owned();
    app.wait_status(&asking, &["waiting_for_input"], Duration::from_secs(30))
        .await;
    app.wait_status(&slow, &["running"], Duration::from_secs(30))
        .await;
    let queued = app
        .post(
            "/v1/runs",
            &json!({"input": "next", "thread_id": slow_thread, "if_busy": "enqueue", "agent": agent(json!([]))}),
        )
        .await;
    assert_eq!(queued.status(), 202);
    let queued: Value = queued.json().await.unwrap();
    assert_eq!(queued["status"], "waiting_for_thread", "{queued}");
    // A's shared request-rate bucket in Redis: 30 requests at 1 a second leave it ~30 s ahead.
    let (status, _) = admin(
        &app,
        reqwest::Method::PATCH,
        &format!("/admin/v1/tenants/{erased}/limits"),
        Some(json!({"requests_per_second": 1, "request_burst": 100})),
    )
    .await;
    assert_eq!(status, 200);
    // The API drops its cached limits of A when the change is announced; until then A's
    // requests take the default rate's bucket, which refills (and expires) within a second.
    wait_for("A's own rate to apply", Duration::from_secs(10), || async {
        let r = app.get_as("/v1/runs?limit=1", &key_a).await;
        (r.headers()
            .get("ratelimit-limit")
            .and_then(|v| v.to_str().ok())
            == Some("100"))
        .then_some(())
    })
    .await;
    for _ in 0..30 {
        assert_eq!(status_as(&app, &key_a, "/v1/runs?limit=1").await, 200);
    }

    // B is quiet: its key's last use recorded, nothing of it moving.
    let b_used = chrono::Utc::now();
    assert_eq!(status_as(&app, &key_b, "/v1/runs?limit=1").await, 200);
    wait_for(
        "B's key's last use to be recorded",
        Duration::from_secs(10),
        || async {
            let at: Option<chrono::DateTime<chrono::Utc>> =
                sqlx::query_scalar("SELECT max(last_used_at) FROM api_keys WHERE tenant_id = $1")
                    .bind(tenant_b)
                    .fetch_one(&env.pool)
                    .await
                    .ok()?;
            at.filter(|at| *at >= b_used - chrono::Duration::milliseconds(50))
                .map(|_| ())
        },
    )
    .await;

    let ids = ids_of(&env, erased).await;
    let mut a_rows = BTreeMap::new();
    for (table, sql) in [
        (
            "tool_calls",
            "SELECT count(*) FROM tool_calls c JOIN runs r ON r.id = c.run_id WHERE r.tenant_id = $1",
        ),
        (
            "iterations",
            "SELECT count(*) FROM iterations i JOIN runs r ON r.id = i.run_id WHERE r.tenant_id = $1",
        ),
        (
            "messages",
            "SELECT count(*) FROM messages m JOIN threads t ON t.id = m.thread_id WHERE t.tenant_id = $1",
        ),
        (
            "usage_shards",
            "SELECT count(*) FROM usage_shards WHERE tenant_id = $1",
        ),
        (
            "batch_items",
            "SELECT count(*) FROM batch_items i JOIN batches b ON b.id = i.batch_id WHERE b.tenant_id = $1",
        ),
        (
            "webhook_deliveries",
            "SELECT count(*) FROM webhook_deliveries WHERE tenant_id = $1",
        ),
        (
            "mcp_servers",
            "SELECT count(*) FROM mcp_servers WHERE tenant_id = $1",
        ),
        (
            "api_keys",
            "SELECT count(*) FROM api_keys WHERE tenant_id = $1",
        ),
        ("runs", "SELECT count(*) FROM runs WHERE tenant_id = $1"),
    ] {
        let n = count(&env, sql, erased).await;
        assert!(n > 0, "A has {table} before its erasure");
        a_rows.insert(table, n);
    }
    let before = dump(&env).await;
    let keys_before = redis_keys(&env).await;
    let a_keys: Vec<&String> = keys_before.keys().filter(|k| mentions(k, &ids)).collect();
    assert!(
        a_keys.iter().any(|k| k.contains(":ratelimit:"))
            && a_keys.iter().any(|k| k.ends_with(":events")),
        "A has a rate bucket and event lists in Redis: {a_keys:?}"
    );

    // Erase A.
    let (status, requested) = admin(
        &app,
        reqwest::Method::DELETE,
        &format!("/admin/v1/tenants/{erased}"),
        None,
    )
    .await;
    assert_eq!(status, 202, "{requested}");
    assert_eq!(requested["status"], "erasing");
    assert_eq!(requested["keys_revoked"], 2);
    // Both keys are refused at once (the first one was cached).
    for key in [&key_a, &key_a2] {
        assert_eq!(status_as(&app, key, "/v1/runs").await, 401);
        assert_eq!(status_as(&app, key, "/v1/export").await, 401);
    }
    // Nothing of it can change any more.
    let (status, refused) = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/v1/tenants/{erased}/keys"),
        Some(json!({"name": "again"})),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("tenant_erased")),
        "{refused}"
    );
    let (status, _) = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/v1/tenants/{erased}/resume"),
        None,
    )
    .await;
    assert_eq!(status, 409);

    let done = wait_for(
        "the erasure to be done",
        Duration::from_secs(90),
        || async {
            let (status, e) = admin(
                &app,
                reqwest::Method::GET,
                &format!("/admin/v1/tenants/{erased}/erasure"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{e}");
            (e["status"] == "done").then_some(e)
        },
    )
    .await;
    // The proof: every table counted at 0, and what was deleted.
    let remaining = done["remaining"].as_object().expect("remaining");
    assert_eq!(
        remaining.len(),
        agentfleet_shared::store::erasure::TABLES.len(),
        "{done}"
    );
    assert!(remaining.values().all(|n| n == 0), "{done}");
    assert!(
        done["verified_at"].is_string() && done["finished_at"].is_string(),
        "{done}"
    );
    assert_eq!(done["phase"], "done");
    assert!(
        done["runs_cancelled"].as_i64().unwrap() >= 3,
        "running, asking and waiting runs: {done}"
    );
    assert!(done["redis_keys_deleted"].as_i64().unwrap() > 0, "{done}");
    // Everything counted when deletion began was deleted (the cancels added a few messages
    // and deliveries to what there was before the request).
    for (table, n) in &a_rows {
        assert!(
            done["deleted"][table].as_i64().unwrap_or(0) >= *n,
            "{table}: {done}"
        );
    }
    for (table, counted) in done["counted"].as_object().expect("counted") {
        let deleted = done["deleted"][table].as_i64().unwrap_or(0);
        assert_eq!(counted.as_i64(), Some(deleted), "{table}: {done}");
    }

    // No row of A in any table: its ids appear nowhere but in its tombstone.
    let after = dump(&env).await;
    for (table, rows) in &after {
        for row in rows {
            if table == "tenants" && row.contains(&erased.to_string()) {
                let t: Value = serde_json::from_str(row).unwrap();
                assert_eq!(t["name"], "(erased)", "{row}");
                assert_eq!(t["limits"], json!({}), "{row}");
                assert!(t["erased_at"].is_string(), "{row}");
                continue;
            }
            if table == "tenant_erasures" {
                continue;
            }
            assert!(
                !mentions(row, &ids),
                "{table} still holds a row of the erased tenant: {row}"
            );
        }
    }
    // B's rows, byte for byte as they were (the erasure's own tables aside, the workers'
    // registrations, which are no tenant's and change every sweep, and the active-run deltas,
    // which the sweeper folds: their sum is compared).
    let mut b_before = others(&before, &ids);
    let mut b_after = others(&after, &ids);
    assert_eq!(
        active_runs(&b_before),
        active_runs(&b_after),
        "another tenant's active-run count changed"
    );
    for fleet_table in ["tenant_erasures", "fleet_workers", "tenant_active_deltas"] {
        b_before.remove(fleet_table);
        b_after.remove(fleet_table);
    }
    assert_eq!(b_before, b_after, "another tenant's rows changed");
    assert!(b_after["runs"].len() >= 6, "B's runs are in the comparison");

    // No Redis key of A; B's keys and their values as they were.
    let keys_after = redis_keys(&env).await;
    let left: Vec<&String> = keys_after.keys().filter(|k| mentions(k, &ids)).collect();
    assert!(
        left.is_empty(),
        "Redis keys of the erased tenant left: {left:?}"
    );
    // B's rate bucket aside: it refills, and expires once full, by itself.
    let b_keys = |keys: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        keys.iter()
            .filter(|(k, _)| !mentions(k, &ids) && !k.contains(":ratelimit:"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let b_keys_before = b_keys(&keys_before);
    let b_keys_after = b_keys(&keys_after);
    assert!(!b_keys_before.is_empty());
    assert_eq!(
        b_keys_before, b_keys_after,
        "another tenant's Redis keys changed"
    );

    // B still works; A stays erased, and asking again answers the proof.
    assert_eq!(status_as(&app, &key_b, "/v1/runs").await, 200);
    let (status, again) = admin(
        &app,
        reqwest::Method::DELETE,
        &format!("/admin/v1/tenants/{erased}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["status"], "done");
    let (status, tenant) = admin(
        &app,
        reqwest::Method::GET,
        &format!("/admin/v1/tenants/{erased}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(tenant["erased_at"].is_string(), "{tenant}");
    let (status, _) = admin(
        &app,
        reqwest::Method::GET,
        &format!("/admin/v1/tenants/{tenant_b}/erasure"),
        None,
    )
    .await;
    assert_eq!(status, 404, "B was never erased");
}

/// The CLI requests the erasure with no API running (nothing drives it), an API started later
/// takes it up (as any replica takes over an erasure whose driver died), and
/// `tenants erase --wait` and `tenants erasure` print the proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_erases_and_any_api_replica_takes_an_erasure_up() {
    let env = TestEnv::with(&settings(&[])).await;
    let created = api_cli(
        &env,
        &["--json", "tenants", "create", "--name", "gone"],
        true,
    )
    .await;
    let created: Value = serde_json::from_str(&created).unwrap();
    let tenant = created["tenant_id"].as_str().unwrap().to_owned();
    let key = created["api_key"].as_str().unwrap().to_owned();
    // A run of it, made straight in Postgres (the API is not running), with an event list.
    let run = Uuid::now_v7();
    let thread = Uuid::now_v7();
    sqlx::query("INSERT INTO threads (id, tenant_id) VALUES ($1, $2::uuid)")
        .bind(thread)
        .bind(&tenant)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO runs (id, tenant_id, thread_id, status, agent, max_iterations)
         VALUES ($1, $2::uuid, $3, 'queued', '{\"model\": \"mock\"}', 3)",
    )
    .bind(run)
    .bind(&tenant)
    .bind(thread)
    .execute(&env.pool)
    .await
    .unwrap();
    let mut redis = redis_connection();
    let list = format!("{}:run:{{{run}}}:events", env.prefix);
    let _: () = redis::cmd("RPUSH")
        .arg(&list)
        .arg("{\"id\":1}")
        .query_async(&mut redis)
        .await
        .unwrap();

    // Requested only: its key is refused, nothing is deleted yet.
    let out = api_cli(
        &env,
        &["--json", "tenants", "erase", "--tenant", &tenant],
        true,
    )
    .await;
    let requested: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(requested["status"], "erasing", "{out}");
    assert_eq!(requested["keys_revoked"], 1);
    assert!(
        agentfleet_shared::store::tenants::authenticate(&env.pool, &key)
            .await
            .unwrap()
            .is_none()
    );

    // An API replica's sweep takes it up (it was never driven), cancels the run and erases.
    let app = env.spawn_api().await;
    let (status, _) = admin(
        &app,
        reqwest::Method::GET,
        &format!("/admin/v1/tenants/{tenant}/erasure"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    wait_for(
        "the API to finish the erasure",
        Duration::from_secs(60),
        || async {
            let (_, e) = admin(
                &app,
                reqwest::Method::GET,
                &format!("/admin/v1/tenants/{tenant}/erasure"),
                None,
            )
            .await;
            (e["status"] == "done").then_some(())
        },
    )
    .await;
    let table = api_cli(&env, &["tenants", "erasure", "--tenant", &tenant], true).await;
    assert!(
        table.contains("done") && table.contains("no row of the tenant is left"),
        "{table}"
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&list)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the run's event list is gone");
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE id = $1")
        .bind(run)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(runs, 0);

    // `--wait` drives an erasure itself (no API needed) and prints its proof.
    drop(app);
    let other = api_cli(
        &env,
        &["--json", "tenants", "create", "--name", "second"],
        true,
    )
    .await;
    let other: Value = serde_json::from_str(&other).unwrap();
    let other = other["tenant_id"].as_str().unwrap().to_owned();
    let out = api_cli(
        &env,
        &["--json", "tenants", "erase", "--tenant", &other, "--wait"],
        true,
    )
    .await;
    let done: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["status"], "done", "{out}");
    assert_eq!(done["remaining"]["api_keys"], 0, "{out}");
    assert!(
        done["remaining"]
            .as_object()
            .unwrap()
            .values()
            .all(|n| n == 0),
        "{out}"
    );
    let listed = api_cli(&env, &["tenants", "list"], true).await;
    assert!(listed.contains("(erased)"), "{listed}");
    let err = api_cli(
        &env,
        &["tenants", "erase", "--tenant", &Uuid::now_v7().to_string()],
        false,
    )
    .await;
    assert!(err.contains("no such tenant"), "{err}");
}

/// An API process killed in the middle of an erasure's deletion: another replica takes the
/// erasure over once the dead one's lease runs out, continues where it stopped, and the counts
/// come out exact (each step's deletion and its count commit together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_whose_replica_dies_midway_is_finished_by_another_with_exact_counts() {
    let env = TestEnv::with(&settings(&[("erasure.grace_ms", "0")])).await;
    let tenant = agentfleet_shared::store::tenants::create(&env.pool, "big")
        .await
        .unwrap()
        .tenant_id;
    // 1,500 finished runs on 500 threads, each with two messages and a tool call.
    sqlx::query(
        "WITH t AS (
            INSERT INTO threads (id, tenant_id) SELECT gen_random_uuid(), $1
              FROM generate_series(1, 500) RETURNING id),
         r AS (
            INSERT INTO runs (id, tenant_id, thread_id, status, agent, max_iterations, finished_at)
            SELECT gen_random_uuid(), $1, t.id, 'completed', '{\"model\": \"mock\"}', 3, now()
              FROM t, generate_series(1, 3) RETURNING id, thread_id),
         m AS (
            INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
            SELECT thread_id, id, 'user', true, '{\"role\": \"user\", \"content\": \"hi\"}'
              FROM r, generate_series(1, 2))
         INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name, raw_arguments, status)
         SELECT gen_random_uuid(), id, 'call_1', 1, 0, 'add', '{}', 'pending' FROM r",
    )
    .bind(tenant)
    .execute(&env.pool)
    .await
    .unwrap();

    let (mut doomed, base) = env.spawn_api_process(&[]).await;
    let http = reqwest::Client::new();
    let erasure = format!("{base}/admin/v1/tenants/{tenant}/erasure");
    let resp = http
        .delete(format!("{base}/admin/v1/tenants/{tenant}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    wait_for(
        "the erasure to be deleting runs",
        Duration::from_secs(30),
        || async {
            let e: Value = http
                .get(&erasure)
                .bearer_auth(ADMIN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (e["deleted"]["runs"].as_i64().unwrap_or(0) > 0).then_some(())
        },
    )
    .await;
    doomed.kill();
    let midway = agentfleet_shared::store::erasure::get(&env.pool, tenant)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        midway.status, "erasing",
        "killed before the end: {midway:?}"
    );
    let runs_left: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(runs_left > 0 && runs_left < 1500, "{runs_left} runs left");

    let app = env.spawn_api().await;
    let done = wait_for(
        "another replica to finish the erasure",
        Duration::from_secs(60),
        || async {
            let (_, e) = admin(
                &app,
                reqwest::Method::GET,
                &format!("/admin/v1/tenants/{tenant}/erasure"),
                None,
            )
            .await;
            (e["status"] == "done").then_some(e)
        },
    )
    .await;
    for (table, counted) in done["counted"].as_object().unwrap() {
        let deleted = done["deleted"][table].as_i64().unwrap_or(0);
        assert_eq!(counted.as_i64(), Some(deleted), "{table}: {done}");
        assert_eq!(done["remaining"][table], 0, "{table}: {done}");
    }
    assert_eq!(done["counted"]["runs"], 1500);
    assert_eq!(done["counted"]["messages"], 3000);
    assert_eq!(done["counted"]["tool_calls"], 1500);
    assert_eq!(done["counted"]["threads"], 500);
}
