//! Retention: runs past their window are removed with every row that is theirs, nothing else
//! is, waiting runs only by their own window, a tenant's own windows win, and removal running
//! flat out never makes a turn commit wait (docs/operations.md, "Retention").
//!
//! Runs are made old by moving their times back in the test's database, not by waiting; a pass
//! is run on demand (`store::retention::remove_due`, the batches without the election and the
//! pacing).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::store::retention::{self, Removed};
use agentfleet_tests::harness::*;
use agentfleet_tests::mock_llm::script;

const T: Duration = Duration::from_secs(60);
const ADMIN: &str = "retention-admin-token-0123456789abcdef";

fn uuid(v: &Value) -> Uuid {
    Uuid::parse_str(v.as_str().expect("an id")).expect("a uuid")
}

fn echo_turn(word: &str) -> Value {
    json!({"tool_calls": [{"name": "echo", "arguments": {"word": word}}]})
}

fn ask_turn() -> Value {
    json!({"tool_calls": [{"name": "ask", "arguments": {"text": "Which one?"}}]})
}

/// A run that calls `echo` once and answers: a message of each role, a tool call, two
/// iteration timings.
fn tool_run(env: &TestEnv, thread: Option<Uuid>) -> Value {
    let mut body = scripted_run(
        json!([echo_turn("x"), {"content": "done"}]),
        json!([http_tool(env, "echo", "/echo")]),
    );
    if let Some(t) = thread {
        body["thread_id"] = json!(t);
    }
    body
}

async fn start_as(app: &TestApp, key: &str, body: &Value) -> Value {
    let resp = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("request");
    let status = resp.status();
    let json: Value = resp.json().await.expect("json");
    assert_eq!(status, 202, "start run: {json}");
    json
}

async fn wait_db_status(env: &TestEnv, run: Uuid, status: &str) {
    wait_for(&format!("run {run} {status}"), T, || async move {
        let s: Option<String> = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
            .bind(run)
            .fetch_optional(&env.pool)
            .await
            .unwrap();
        (s.as_deref() == Some(status)).then_some(())
    })
    .await;
}

async fn run_to(app: &TestApp, env: &TestEnv, key: &str, body: &Value, status: &str) -> Uuid {
    let run = uuid(&start_as(app, key, body).await["id"]);
    wait_db_status(env, run, status).await;
    run
}

async fn thread_of(env: &TestEnv, run: Uuid) -> Uuid {
    sqlx::query_scalar("SELECT thread_id FROM runs WHERE id = $1")
        .bind(run)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// Seconds in a day, for [`backdate`].
const DAY: f64 = 86_400.0;

/// Moves the runs, their messages, their threads' creation and their webhook deliveries `secs`
/// into the past (deliveries marked delivered then), as if they were that old.
async fn backdate(env: &TestEnv, runs: &[Uuid], secs: f64) {
    for sql in [
        "UPDATE runs SET created_at = created_at - make_interval(secs => $2),
                         updated_at = updated_at - make_interval(secs => $2),
                         enqueued_at = enqueued_at - make_interval(secs => $2),
                         started_at = started_at - make_interval(secs => $2),
                         finished_at = finished_at - make_interval(secs => $2)
         WHERE id = ANY($1)",
        "UPDATE threads SET created_at = created_at - make_interval(secs => $2)
         WHERE id IN (SELECT thread_id FROM runs WHERE id = ANY($1))",
        "UPDATE messages SET created_at = created_at - make_interval(secs => $2)
         WHERE run_id = ANY($1)",
        "UPDATE webhook_deliveries SET status = 'delivered',
                created_at = created_at - make_interval(secs => $2),
                finished_at = now() - make_interval(secs => $2)
         WHERE (body->'data'->>'run_id')::uuid = ANY($1)",
    ] {
        sqlx::query(sql)
            .bind(runs)
            .bind(secs)
            .execute(&env.pool)
            .await
            .unwrap();
    }
}

/// Rows that reference the runs, per table (every table that holds a run's id).
async fn rows_of_runs(env: &TestEnv, runs: &[Uuid]) -> BTreeMap<&'static str, i64> {
    let mut out = BTreeMap::new();
    for (table, sql) in [
        ("runs", "SELECT count(*) FROM runs WHERE id = ANY($1)"),
        (
            "messages",
            "SELECT count(*) FROM messages WHERE run_id = ANY($1)",
        ),
        (
            "tool_calls",
            "SELECT count(*) FROM tool_calls WHERE run_id = ANY($1)",
        ),
        (
            "iterations",
            "SELECT count(*) FROM iterations WHERE run_id = ANY($1)",
        ),
        (
            "batch_items",
            "SELECT count(*) FROM batch_items WHERE run_id = ANY($1)",
        ),
        (
            "webhook_deliveries",
            "SELECT count(*) FROM webhook_deliveries WHERE (body->'data'->>'run_id')::uuid = ANY($1)",
        ),
    ] {
        let n: i64 = sqlx::query_scalar(sql)
            .bind(runs)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        out.insert(table, n);
    }
    out
}

/// Rows that reference the threads, per table.
async fn rows_of_threads(env: &TestEnv, threads: &[Uuid]) -> BTreeMap<&'static str, i64> {
    let mut out = BTreeMap::new();
    for (table, sql) in [
        ("threads", "SELECT count(*) FROM threads WHERE id = ANY($1)"),
        (
            "runs",
            "SELECT count(*) FROM runs WHERE thread_id = ANY($1)",
        ),
        (
            "messages",
            "SELECT count(*) FROM messages WHERE thread_id = ANY($1)",
        ),
    ] {
        let n: i64 = sqlx::query_scalar(sql)
            .bind(threads)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        out.insert(table, n);
    }
    out
}

fn none_left(rows: &BTreeMap<&'static str, i64>) -> bool {
    rows.values().all(|n| *n == 0)
}

async fn remove_due(settings: &Settings, env: &TestEnv) -> Removed {
    retention::remove_due(&env.pool, &settings.retention)
        .await
        .expect("removal")
}

/// A webhook endpoint of the tenant for every run event, so run changes leave deliveries.
async fn endpoint(env: &TestEnv, tenant: Uuid) {
    sqlx::query(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret)
         VALUES (gen_random_uuid(), $1, 'http://127.0.0.1:9/hook',
                 '{run.completed,run.cancelled,run.waiting_for_input}', 'whsec_test')",
    )
    .bind(tenant)
    .execute(&env.pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_past_the_window_go_with_every_row_of_theirs_and_nothing_else_does() {
    // Deliveries stay as the runs' changes wrote them (nobody sends them).
    let env = TestEnv::with(&[("webhooks.enabled", "false")]).await;
    let app = env.spawn_api().await;
    let worker = env.spawn_worker().await;
    let key = app.api_key.clone();
    endpoint(&env, app.tenant_id).await;

    // A run alone on its thread, past the window: it goes, and its thread with it.
    let whole = run_to(&app, &env, &key, &tool_run(&env, None), "completed").await;
    let whole_thread = thread_of(&env, whole).await;
    // A thread in use: its old run goes, the conversation (messages) and the thread stay.
    let old_in_use = run_to(&app, &env, &key, &tool_run(&env, None), "completed").await;
    let in_use_thread = thread_of(&env, old_in_use).await;
    let young_in_use = run_to(
        &app,
        &env,
        &key,
        &tool_run(&env, Some(in_use_thread)),
        "completed",
    )
    .await;
    // Young: untouched.
    let young = run_to(&app, &env, &key, &tool_run(&env, None), "completed").await;
    // Waiting (for 400 days): untouched while `retention.waiting_runs_secs` is 0.
    let waiting = run_to(
        &app,
        &env,
        &key,
        &scripted_run(json!([ask_turn(), {"content": "ok"}]), json!([])),
        "waiting_for_input",
    )
    .await;
    // Cancelled while waiting, long ago: it ended, so it goes.
    let cancelled = run_to(
        &app,
        &env,
        &key,
        &scripted_run(json!([ask_turn(), {"content": "ok"}]), json!([])),
        "waiting_for_input",
    )
    .await;
    let resp = app
        .post(&format!("/v1/runs/{cancelled}/cancel"), &json!({}))
        .await;
    assert!(resp.status().is_success(), "cancel: {}", resp.status());
    wait_db_status(&env, cancelled, "cancelled").await;
    let cancelled_thread = thread_of(&env, cancelled).await;
    // A batch of two, finished long ago: its runs go, then the batch with its items.
    let resp = app
        .post(
            "/v1/batches",
            &json!({"runs": [
                {"custom_id": "a", "input": script(json!([{"content": "a"}])), "agent": {"model": "mock"}},
                {"custom_id": "b", "input": script(json!([{"content": "b"}])), "agent": {"model": "mock"}}]}),
        )
        .await;
    let batch: Value = resp.json().await.unwrap();
    let batch_id = uuid(&batch["id"]);
    wait_for("the batch to complete", T, || async {
        let s: String = sqlx::query_scalar("SELECT status FROM batches WHERE id = $1")
            .bind(batch_id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        (s == "completed").then_some(())
    })
    .await;
    let batch_runs: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM runs WHERE batch_id = $1")
        .bind(batch_id)
        .fetch_all(&env.pool)
        .await
        .unwrap();
    assert_eq!(batch_runs.len(), 2);
    let batch_threads: Vec<Uuid> =
        sqlx::query_scalar("SELECT thread_id FROM runs WHERE batch_id = $1")
            .bind(batch_id)
            .fetch_all(&env.pool)
            .await
            .unwrap();

    // The worker stops first: a run's last iteration timing may be written after the run ended
    // (by a later statement of its worker, or its next sweep), and one written after the removal
    // would be a row of an old run left behind. Its drain writes what it still holds.
    worker.shutdown().await;
    let mut old = vec![whole, old_in_use, cancelled];
    old.extend(&batch_runs);
    backdate(&env, &old, 31.0 * DAY).await;
    backdate(&env, &[waiting], 400.0 * DAY).await;
    sqlx::query(
        "UPDATE batches SET created_at = created_at - interval '31 days',
                            finished_at = finished_at - interval '31 days' WHERE id = $1",
    )
    .bind(batch_id)
    .execute(&env.pool)
    .await
    .unwrap();
    // The rows are there to remove: each kind at least once.
    let before_old = rows_of_runs(&env, &old).await;
    for table in [
        "runs",
        "messages",
        "tool_calls",
        "iterations",
        "batch_items",
    ] {
        assert!(before_old[table] > 0, "{table}: {before_old:?}");
    }
    assert!(before_old["webhook_deliveries"] >= 3, "{before_old:?}");
    let kept_runs = [young_in_use, young, waiting];
    let kept_before = rows_of_runs(&env, &kept_runs).await;
    let in_use_messages = rows_of_threads(&env, &[in_use_thread]).await["messages"];

    let removed = remove_due(&env.settings(), &env).await;

    // Old whole threads, the old run of the thread in use (but not its messages), the batch.
    let mut after_old = rows_of_runs(&env, &old).await;
    let old_in_use_messages = after_old.remove("messages").unwrap();
    assert!(
        none_left(&after_old),
        "rows of old runs left: {after_old:?}"
    );
    assert_eq!(
        old_in_use_messages,
        rows_of_runs(&env, &[old_in_use]).await["messages"],
        "only the thread in use keeps messages of a removed run"
    );
    let mut gone_threads = vec![whole_thread, cancelled_thread];
    gone_threads.extend(&batch_threads);
    assert!(
        none_left(&rows_of_threads(&env, &gone_threads).await),
        "threads whose every run went are gone"
    );
    let batch_rows: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM batches WHERE id = $1),
                (SELECT count(*) FROM batch_items WHERE batch_id = $1)",
    )
    .bind(batch_id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(batch_rows, (0, 0), "the batch and its items are gone");

    // Everything kept is as it was, but for the one delivery of the waiting run: it told of a
    // change 400 days old, and deliveries go by their own age.
    let mut kept_expected = kept_before.clone();
    *kept_expected.get_mut("webhook_deliveries").unwrap() -= 1;
    assert_eq!(rows_of_runs(&env, &kept_runs).await, kept_expected);
    assert_eq!(
        rows_of_runs(&env, &[waiting]).await["webhook_deliveries"],
        0
    );
    let in_use = rows_of_threads(&env, &[in_use_thread]).await;
    assert_eq!(
        (in_use["threads"], in_use["runs"], in_use["messages"]),
        (1, 1, in_use_messages),
        "the thread in use keeps its conversation"
    );
    assert_eq!(app.get(&format!("/v1/runs/{whole}")).await.status(), 404);
    assert_eq!(app.get(&format!("/v1/runs/{young}")).await.status(), 200);
    // The thread in use is still one: a new run on it is accepted and sees its history.
    let _worker = env.spawn_worker().await;
    run_to(
        &app,
        &env,
        &key,
        &tool_run(&env, Some(in_use_thread)),
        "completed",
    )
    .await;

    assert_eq!(removed.runs, 5, "{removed:?}");
    assert_eq!(
        removed.threads,
        2 + batch_threads.len() as u64,
        "{removed:?}"
    );
    assert_eq!(removed.batches, 1, "{removed:?}");
    assert_eq!(
        removed.webhook_deliveries as i64,
        before_old["webhook_deliveries"] + 1,
        "{removed:?}"
    );
    // Usage totals are kept.
    let usage_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM usage_days WHERE tenant_id = $1")
            .bind(app.tenant_id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(usage_rows > 0, "usage totals stay");
    // Nothing more is due: a second pass removes nothing.
    assert_eq!(remove_due(&env.settings(), &env).await, Removed::default());
}

async fn admin_patch(app: &TestApp, tenant: Uuid, body: Value) -> (u16, Value) {
    let resp = app
        .http
        .patch(app.url(&format!("/admin/v1/tenants/{tenant}/retention")))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_runs_go_by_their_own_window_and_a_tenants_windows_win() {
    let env = TestEnv::with(&[("api.admin_token", ADMIN)]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let a_key = app.api_key.clone();
    let b = agentfleet_shared::store::tenants::create(&env.pool, "b")
        .await
        .unwrap();

    // Tenant b's own windows: finished runs 2 days, waiting runs 5.
    let (status, body) = admin_patch(
        &app,
        b.tenant_id,
        json!({"finished_runs_secs": 2 * 86_400, "waiting_runs_secs": 5 * 86_400}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["retention"],
        json!({"finished_runs_secs": 172_800, "waiting_runs_secs": 432_000})
    );
    assert_eq!(
        body["effective_retention"],
        json!({"finished_runs_secs": 172_800, "waiting_runs_secs": 432_000})
    );
    for (bad, field) in [
        (
            json!({"finished_runs_secs": 3_153_600_001_u64}),
            "finished_runs_secs",
        ),
        (json!({"waiting_runs_secs": -1}), "waiting_runs_secs"),
        (json!({"finished_run_secs": 1}), "finished_run_secs"),
        (json!({"finished_runs_days": 36_501}), "finished_runs_days"),
    ] {
        let (status, body) = admin_patch(&app, b.tenant_id, bad.clone()).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with(field),
            "{bad}: {body}"
        );
    }
    let (status, body) = admin_patch(&app, b.tenant_id, json!({})).await;
    assert_eq!(
        (status, &body["retention"]["finished_runs_secs"]),
        (200, &json!(172_800)),
        "nothing half written by the refused patches: {body}"
    );

    let done = || scripted_run(json!([{"content": "done"}]), json!([]));
    let ask = || scripted_run(json!([ask_turn(), {"content": "ok"}]), json!([]));
    // Tenant b: a run finished 3 days ago (past its 2), one waiting 6 days with a run queued
    // behind it on its thread (past its 5), one waiting 4 days (inside).
    let b_done = run_to(&app, &env, &b.api_key, &done(), "completed").await;
    let b_wait = run_to(&app, &env, &b.api_key, &ask(), "waiting_for_input").await;
    let b_thread = thread_of(&env, b_wait).await;
    let mut behind = done();
    behind["thread_id"] = json!(b_thread);
    behind["if_busy"] = json!("enqueue");
    let b_behind = uuid(&start_as(&app, &b.api_key, &behind).await["id"]);
    wait_db_status(&env, b_behind, "waiting_for_thread").await;
    let b_wait_young = run_to(&app, &env, &b.api_key, &ask(), "waiting_for_input").await;
    // One waiting 6 days with a run queued behind it yesterday: kept, both, until that one too
    // is past the window (removing the waiting run alone would strand it).
    let b_wait_held = run_to(&app, &env, &b.api_key, &ask(), "waiting_for_input").await;
    let mut fresh = done();
    fresh["thread_id"] = json!(thread_of(&env, b_wait_held).await);
    fresh["if_busy"] = json!("enqueue");
    let b_fresh = uuid(&start_as(&app, &b.api_key, &fresh).await["id"]);
    wait_db_status(&env, b_fresh, "waiting_for_thread").await;
    backdate(&env, &[b_fresh], 1.0 * DAY).await;
    // Tenant a (the configured 30 and 0): a run finished 3 days ago, one waiting 400 days.
    let a_done = run_to(&app, &env, &a_key, &done(), "completed").await;
    let a_wait = run_to(&app, &env, &a_key, &ask(), "waiting_for_input").await;
    backdate(&env, &[b_done, a_done], 3.0 * DAY).await;
    backdate(&env, &[b_wait, b_behind, b_wait_held], 6.0 * DAY).await;
    backdate(&env, &[b_wait_young], 4.0 * DAY).await;
    backdate(&env, &[a_wait], 400.0 * DAY).await;

    let removed = remove_due(&env.settings(), &env).await;
    assert!(
        none_left(&rows_of_runs(&env, &[b_done, b_wait, b_behind]).await),
        "b's runs past its own windows, and the run queued behind its old waiting run"
    );
    assert!(
        none_left(&rows_of_threads(&env, &[b_thread]).await),
        "the waiting run's thread went with it"
    );
    for (run, status) in [
        (b_wait_young, "waiting_for_input"),
        (b_wait_held, "waiting_for_input"),
        (b_fresh, "waiting_for_thread"),
        (a_done, "completed"),
        (a_wait, "waiting_for_input"),
    ] {
        let s: Option<String> = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
            .bind(run)
            .fetch_optional(&env.pool)
            .await
            .unwrap();
        assert_eq!(s.as_deref(), Some(status), "{run} kept");
    }
    assert_eq!(removed.runs, 3, "{removed:?}");

    // `retention.waiting_runs_secs` set for everyone (100 days): a's old waiting run goes; its
    // finished run, 3 days old, stays (30).
    let settings = env.settings_with(&[("retention.waiting_runs_secs", "8640000")]);
    let removed = remove_due(&settings, &env).await;
    assert_eq!(removed.runs, 1, "{removed:?}");
    assert!(none_left(&rows_of_runs(&env, &[a_wait]).await));
    assert_eq!(rows_of_runs(&env, &[a_done]).await["runs"], 1);

    // Cleared, b's windows are the configured ones again.
    let (status, body) = admin_patch(
        &app,
        b.tenant_id,
        json!({"finished_runs_secs": null, "waiting_runs_secs": null}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["retention"], json!({}));
    assert_eq!(
        body["effective_retention"],
        json!({"finished_runs_secs": 2_592_000, "waiting_runs_secs": 0})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_a_minute_keeps_runs_by_the_second_and_a_window_in_days_still_holds() {
    let env = TestEnv::with(&[("api.admin_token", ADMIN)]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    // Tenant a: one minute.
    let (status, body) = admin_patch(&app, app.tenant_id, json!({"finished_runs_secs": 60})).await;
    assert_eq!(status, 200, "{body}");
    // Tenant b: a row as releases before seconds wrote it, two days.
    let b = agentfleet_shared::store::tenants::create(&env.pool, "b")
        .await
        .unwrap();
    sqlx::query("UPDATE tenants SET retention = '{\"finished_runs_days\": 2}' WHERE id = $1")
        .bind(b.tenant_id)
        .execute(&env.pool)
        .await
        .unwrap();

    let done = || scripted_run(json!([{"content": "done"}]), json!([]));
    let a_old = run_to(&app, &env, &app.api_key, &done(), "completed").await;
    let a_young = run_to(&app, &env, &app.api_key, &done(), "completed").await;
    let b_old = run_to(&app, &env, &b.api_key, &done(), "completed").await;
    let b_young = run_to(&app, &env, &b.api_key, &done(), "completed").await;
    // 90 s past the end against a minute; the young one ended 30 s ago, however long the runs
    // above took (the margin covers a slow machine between this update and the removal's
    // cut-off).
    backdate(&env, &[a_old], 90.0).await;
    sqlx::query("UPDATE runs SET finished_at = now() - interval '30 seconds' WHERE id = $1")
        .bind(a_young)
        .execute(&env.pool)
        .await
        .unwrap();
    backdate(&env, &[b_old], 3.0 * DAY).await;
    backdate(&env, &[b_young], DAY).await;
    let removed = remove_due(&env.settings(), &env).await;
    assert!(none_left(&rows_of_runs(&env, &[a_old, b_old]).await));
    for run in [a_young, b_young] {
        assert_eq!(rows_of_runs(&env, &[run]).await["runs"], 1, "{run} kept");
    }
    assert_eq!(removed.runs, 2, "{removed:?}");

    // The row in days reads as seconds; a window set now leaves it in seconds only.
    let (status, body) = admin_patch(&app, b.tenant_id, json!({"waiting_runs_secs": 600})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["effective_retention"],
        json!({"finished_runs_secs": 172_800, "waiting_runs_secs": 600})
    );
    let (status, body) = admin_patch(&app, b.tenant_id, json!({"finished_runs_days": 1})).await;
    assert_eq!(status, 200, "{body}");
    let stored: Value = sqlx::query_scalar("SELECT retention FROM tenants WHERE id = $1")
        .bind(b.tenant_id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        json!({"finished_runs_secs": 86_400, "waiting_runs_secs": 600})
    );
}

/// Old rows added on every round: `per_round` finished runs past the window on threads of
/// their own (each with four messages, two tool calls and two timings), and one on each of
/// `live_threads` (threads with a run in flight: the trimming of a thread in use).
async fn add_old_rows(pool: &sqlx::PgPool, tenant: Uuid, per_round: i32, live_threads: &[Uuid]) {
    sqlx::query(
        "WITH g AS (
            SELECT gen_random_uuid() AS run, gen_random_uuid() AS thread,
                   now() - interval '40 days' AS at, n
            FROM generate_series(1, $2) n),
         th AS (INSERT INTO threads (id, tenant_id, created_at)
                SELECT thread, $1, at FROM g),
         r AS (INSERT INTO runs (id, tenant_id, thread_id, status, agent, max_iterations,
                                 iteration, created_at, finished_at)
               SELECT run, $1, thread, 'completed', '{\"model\": \"mock\"}', 10, 2, at, at FROM g),
         m AS (INSERT INTO messages (thread_id, run_id, role, is_llm_message, body, created_at)
               SELECT thread, run, 'assistant', true,
                      jsonb_build_object('role', 'assistant', 'content', repeat('old ', 100)), at
               FROM g, generate_series(1, 4)),
         c AS (INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name,
                                       raw_arguments, status, created_at, finished_at)
               SELECT gen_random_uuid(), run, 'call_' || p, 1, p, 'echo', '{}', 'succeeded', at, at
               FROM g, generate_series(0, 1) p)
         INSERT INTO iterations (run_id, iteration, attempt, started_at, finished_at, model_us,
                                 tools_us, total_us)
         SELECT run, i, 1, at, at, 1, 1, 2 FROM g, generate_series(1, 2) i",
    )
    .bind(tenant)
    .bind(per_round)
    .execute(pool)
    .await
    .unwrap();
    // On the live threads: runs and their rows, no messages (the run in flight read its
    // thread's history at its claim; the old ones are for the trimming only).
    sqlx::query(
        "WITH g AS (SELECT gen_random_uuid() AS run, t AS thread,
                           now() - interval '40 days' AS at FROM unnest($2::uuid[]) t),
         r AS (INSERT INTO runs (id, tenant_id, thread_id, status, agent, max_iterations,
                                 iteration, created_at, finished_at)
               SELECT run, $1, thread, 'completed', '{\"model\": \"mock\"}', 10, 1, at, at
               FROM g)
         INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name,
                                 raw_arguments, status, created_at, finished_at)
         SELECT gen_random_uuid(), run, 'call_0', 1, 0, 'echo', '{}', 'succeeded', at, at FROM g",
    )
    .bind(tenant)
    .bind(live_threads)
    .execute(pool)
    .await
    .unwrap();
}

/// The application name of the remover's connections, by which the lock watch knows them.
const REMOVER: &str = "agentfleet-retention-test";

/// Backends of the test's database that wait for a lock held by the remover, and what they
/// run, sampled until `running` is cleared.
async fn watch_lock_waits(pool: sqlx::PgPool, running: Arc<AtomicBool>) -> Vec<String> {
    let mut seen = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    while running.load(Ordering::Relaxed) {
        tick.tick().await;
        let waiting: Vec<String> = sqlx::query_scalar(
            "SELECT w.query FROM pg_stat_activity w
             WHERE w.datname = current_database() AND w.wait_event_type = 'Lock'
               AND EXISTS (SELECT 1 FROM pg_stat_activity r
                           WHERE r.application_name = $1
                             AND r.pid = ANY (pg_blocking_pids(w.pid)))",
        )
        .bind(REMOVER)
        .fetch_all(&pool)
        .await
        .unwrap();
        seen.extend(waiting);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_flat_out_never_makes_a_turn_commit_wait() {
    // The fleet's lock time-out: a turn commit that waited longer for a lock fails and its run
    // is handed back (counted in `runs.handbacks`) or retried on another attempt. Shorter than
    // the default, so that a wait behind a removal batch (tens to hundreds of milliseconds)
    // would show; long enough that the worker's own writers (a lease renewal committing on a
    // loaded machine) do not.
    let env = TestEnv::with(&[
        ("database.lock_timeout_ms", "1000"),
        ("retention.batch_runs", "100"),
        ("retention.batch_messages", "400"),
    ])
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let tenant = app.tenant_id;
    let settings = env.settings();

    // Threads that runs will continue while their old runs are removed.
    const RUNS: usize = 40;
    let mut firsts = Vec::new();
    for _ in 0..RUNS {
        let first = app
            .start_run(&json!({"input": "first", "agent": agent(json!([]))}))
            .await;
        firsts.push(uuid(&first["id"]));
    }
    let mut threads = Vec::new();
    for first in firsts {
        wait_db_status(&env, first, "completed").await;
        threads.push(thread_of(&env, first).await);
    }
    add_old_rows(&env.pool, tenant, 500, &threads).await;

    // Removal flat out, in its own task and on connections of its own (named, so the watch
    // below can tell whom a waiting backend waits for): old rows are added before every pass,
    // so it is still removing when the last run ends.
    let running = Arc::new(AtomicBool::new(true));
    let options: sqlx::postgres::PgConnectOptions = env.database_url.parse().unwrap();
    let remover_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.application_name(REMOVER))
        .await
        .unwrap();
    let watch = tokio::spawn(watch_lock_waits(env.pool.clone(), running.clone()));
    let remover = {
        let running = running.clone();
        let pool = remover_pool.clone();
        let settings = settings.retention.clone();
        let threads = threads.clone();
        // The old rows are added on the harness's connections, not the remover's: their inserts
        // take key-share locks on the threads (the foreign keys), which a create's thread lock
        // waits for, and the watch would count that wait against removal.
        let adder = env.pool.clone();
        tokio::spawn(async move {
            let mut total = Removed::default();
            let mut passes = 0u32;
            while running.load(Ordering::Relaxed) {
                if passes > 0 {
                    add_old_rows(&adder, tenant, 200, &threads).await;
                }
                let removed = retention::remove_due(&pool, &settings)
                    .await
                    .expect("a removal pass");
                total.runs += removed.runs;
                total.threads += removed.threads;
                total.messages += removed.messages;
                passes += 1;
            }
            (total, passes)
        })
    };

    // Each run continues its thread: three tool turns and an answer, so four turn commits
    // while removal trims the thread's old runs and removes other threads whole.
    // The script is in the system prompt (the thread's first user message is the first run's),
    // made distinct per run so each run is served its own turns.
    let tools = json!([http_tool(&env, "echo", "/echo")]);
    let mut ids = Vec::new();
    for (i, thread) in threads.iter().enumerate() {
        let script = json!({"mock_script": [echo_turn("1"), echo_turn("2"), echo_turn("3"),
                                             {"content": "done"}], "run": i});
        let mut agent = agent(tools.clone());
        agent["system_prompt"] = json!(script.to_string());
        let body = json!({"input": "go on", "thread_id": thread, "agent": agent});
        ids.push(uuid(&app.start_run(&body).await["id"]));
    }
    for id in &ids {
        app.wait_status(&id.to_string(), &["completed", "failed", "cancelled"], T)
            .await;
    }
    running.store(false, Ordering::Relaxed);
    let (total, passes) = remover.await.expect("the remover");
    let waits = watch.await.expect("the lock watch");
    assert!(
        waits.is_empty(),
        "statements waited for a lock held by removal: {waits:#?}"
    );

    let rows: Vec<(String, i32, i32, i32, i32)> = sqlx::query_as(
        "SELECT status, attempt, handbacks, recoveries, iteration FROM runs WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), RUNS);
    for (status, attempt, handbacks, recoveries, iteration) in &rows {
        assert_eq!(
            (
                status.as_str(),
                *attempt,
                *handbacks,
                *recoveries,
                *iteration
            ),
            ("completed", 1, 0, 0, 4),
            "every run completed on its first attempt, never handed back"
        );
    }
    assert!(passes >= 2, "removal ran throughout ({passes} passes)");
    assert!(
        total.runs >= 500 + RUNS as u64,
        "old runs removed while the runs ran: {total:?}"
    );
    assert!(total.threads >= 500, "{total:?}");
    // The live threads lost their old runs only: each has its first run and the new one.
    let per_thread: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE thread_id = ANY($1) GROUP BY thread_id",
    )
    .bind(&threads)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(per_thread, vec![2; RUNS]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_remove_in_the_background_and_say_so_in_their_metrics() {
    // Passes every 200 ms, so that a run made old is removed within the test's wait.
    let env = TestEnv::with(&[("retention.interval_ms", "200")]).await;
    let app = env.spawn_api().await;
    let listen = free_address();
    let _worker = env.spawn_worker_process(&[("worker.metrics_listen", listen.as_str())]);
    let _second = env.spawn_worker_process(&[]);
    let old = uuid(
        &app.start_run(&scripted_run(json!([{"content": "done"}]), json!([])))
            .await["id"],
    );
    wait_db_status(&env, old, "completed").await;
    let young = uuid(
        &app.start_run(&scripted_run(json!([{"content": "done"}]), json!([])))
            .await["id"],
    );
    wait_db_status(&env, young, "completed").await;
    backdate(&env, &[old], 31.0 * DAY).await;
    wait_for("the workers to remove the old run", T, || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE id = $1")
            .bind(old)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        (n == 0).then_some(())
    })
    .await;
    assert_eq!(rows_of_runs(&env, &[young]).await["runs"], 1);
    // Whichever of the two workers removed it, each exports the fleet's schedule; the removal
    // counters are at 0 from the start in each.
    let metrics = wait_for("the worker's retention metrics", T, || async {
        let text = scrape_metrics(&listen).await?;
        (text.contains("agentfleet_retention_last_pass_timestamp")
            && text.contains("agentfleet_retention_backlog")
            && text.contains("agentfleet_retention_removed_total{what=\"runs\"}"))
        .then_some(text)
    })
    .await;
    let last_pass: f64 = metrics
        .lines()
        .find(|l| l.starts_with("agentfleet_retention_last_pass_timestamp "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("the last pass's time");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - last_pass).abs() < 120.0,
        "a pass completed just now: {last_pass} against {now}"
    );
}
