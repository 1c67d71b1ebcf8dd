//! `GET /v1/export`: a tenant's threads, runs, messages and tool calls as JSON lines, streamed
//! page by page. A tenant of 10,000 runs (made in SQL) comes out whole, equal to the database,
//! without anything of another tenant, and the API process's memory does not grow with it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_tests::harness::*;

const RUNS_PER_THREAD: i64 = 4;

/// `threads` threads of `tenant` with `RUNS_PER_THREAD` finished runs each (each with a
/// `blob`-byte metadata value), two messages and one tool call per run: in four statements.
async fn seed(env: &TestEnv, tenant: Uuid, threads: i64, blob: i32) {
    sqlx::query(
        "WITH t AS (
            INSERT INTO threads (id, tenant_id, created_at)
            SELECT gen_random_uuid(), $1, now() - interval '1 day' + g * interval '1 ms'
              FROM generate_series(1, $2) g
            RETURNING id, created_at),
         n AS (SELECT id, created_at, row_number() OVER (ORDER BY created_at) - 1 AS n FROM t)
         INSERT INTO runs (id, tenant_id, thread_id, status, agent, metadata, max_iterations,
                           iteration, created_at, started_at, finished_at, prompt_tokens)
         SELECT gen_random_uuid(), $1, n.id, 'completed', '{\"model\": \"mock\"}',
                jsonb_build_object('n', n.n * $3 + k, 'blob', repeat('x', $4)), 3, 1,
                n.created_at + k * interval '1 us', now(), now(), n.n * $3 + k
           FROM n, generate_series(0, $3 - 1) k",
    )
    .bind(tenant)
    .bind(threads)
    .bind(RUNS_PER_THREAD)
    .bind(blob)
    .execute(&env.pool)
    .await
    .unwrap();
    for (role, content) in [("user", "question "), ("assistant", "answer ")] {
        sqlx::query(
            "INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
             SELECT thread_id, id, $2, true,
                    jsonb_build_object('role', $2, 'content', $3 || (metadata->>'n'))
               FROM runs WHERE tenant_id = $1 ORDER BY created_at, id",
        )
        .bind(tenant)
        .bind(role)
        .bind(content)
        .execute(&env.pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name,
                                 raw_arguments, arguments, status, result, dispatch_count,
                                 finished_at)
         SELECT gen_random_uuid(), id, 'call_' || (metadata->>'n'), 1, 0, 'add',
                '{\"a\": 1}', '{\"a\": 1}', 'succeeded',
                jsonb_build_object('sum', (metadata->>'n')::int), 1, now()
           FROM runs WHERE tenant_id = $1",
    )
    .bind(tenant)
    .execute(&env.pool)
    .await
    .unwrap();
}

/// A process's resident memory and its peak (`VmRSS`, `VmHWM`), in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What the database holds of a tenant, as the export should say it: per id, a fingerprint.
async fn expected(env: &TestEnv, tenant: Uuid) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT 'thread ' || id, (extract(epoch FROM created_at) * 1000000)::bigint::text
           FROM threads WHERE tenant_id = $1
         UNION ALL
         SELECT 'run ' || id, thread_id || ' ' || coalesce(metadata->>'n', 'null') || ' '
                || coalesce(length(metadata->>'blob'), 0)
           FROM runs WHERE tenant_id = $1
         UNION ALL
         SELECT 'message ' || m.id, m.thread_id || ' ' || coalesce(m.run_id::text, 'null') || ' '
                || (m.body->>'content')
           FROM messages m JOIN threads t ON t.id = m.thread_id WHERE t.tenant_id = $1
         UNION ALL
         SELECT 'tool_call ' || c.id, c.run_id || ' ' || c.tool_call_id || ' ' || (c.result->>'sum')
           FROM tool_calls c JOIN runs r ON r.id = c.run_id WHERE r.tenant_id = $1",
    )
    .bind(tenant)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// The same fingerprint of one export line (`None` for the `end` line).
fn fingerprint(line: &Value) -> Option<(String, String)> {
    let kind = line["type"].as_str().expect("every line has a type");
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let value = match kind {
        "thread" => {
            let at: chrono::DateTime<chrono::Utc> = line["created_at"].as_str()?.parse().ok()?;
            at.timestamp_micros().to_string()
        }
        "run" => format!(
            "{} {} {}",
            s(&line["thread_id"]),
            s(&line["metadata"]["n"]),
            line["metadata"]["blob"].as_str().map_or(0, str::len)
        ),
        "message" => format!(
            "{} {} {}",
            s(&line["thread_id"]),
            s(&line["run_id"]),
            s(&line["body"]["content"])
        ),
        "tool_call" => format!(
            "{} {} {}",
            s(&line["run_id"]),
            s(&line["tool_call_id"]),
            s(&line["result"]["sum"])
        ),
        "end" => return None,
        other => panic!("unknown line type {other}"),
    };
    Some((format!("{kind} {}", s(&line["id"])), value))
}

/// Reads an export as it streams, line by line; its fingerprints, its `end` line, its size.
async fn read_export(
    base: &str,
    key: &str,
    mut each_chunk: impl FnMut(usize),
) -> (BTreeMap<String, String>, Value, usize) {
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/export"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    let mut body = resp.bytes_stream();
    let (mut pending, mut size) = (Vec::new(), 0);
    let mut seen = BTreeMap::new();
    let mut end = Value::Null;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), body.next())
        .await
        .expect("the export goes on")
    {
        let chunk = chunk.expect("the export is not cut short");
        size += chunk.len();
        pending.extend_from_slice(&chunk);
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let line: Value = serde_json::from_slice(&line).expect("each line is JSON");
            assert!(end.is_null(), "nothing follows the end line: {line}");
            match fingerprint(&line) {
                Some((id, value)) => {
                    assert!(seen.insert(id.clone(), value).is_none(), "{id} twice");
                }
                None => end = line,
            }
        }
        each_chunk(size);
    }
    assert!(pending.is_empty(), "the export ends with a whole line");
    (seen, end, size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_of_ten_thousand_runs_is_whole_the_tenants_own_and_streamed_in_bounded_memory() {
    let env = TestEnv::with(&[("export.page_size", "200")]).await;
    let (api, base) = env.spawn_api_process(&[]).await;
    let app = env.app_at(&base, reqwest::Client::new()).await;
    let other = agentfleet_shared::store::tenants::create(&env.pool, "other")
        .await
        .unwrap();
    // 2,500 threads of 4 runs: 10,000 runs, each with 4 KB of metadata (~55 MB of export).
    seed(&env, app.tenant_id, 2_500, 4_000).await;
    seed(&env, other.tenant_id, 3, 10).await;
    // A run of the tenant through the API too: real rows beside the seeded ones.
    let run = app
        .start_run(&scripted_run(json!([{"content": "hi"}]), json!([])))
        .await;
    let queued = run["id"].as_str().unwrap().to_owned();

    // Warm up (connections, code paths, allocator) on the other tenant's small export.
    let (small, small_end, _) = read_export(&base, &other.api_key, |_| {}).await;
    assert_eq!(small_end["runs"], 3 * RUNS_PER_THREAD, "{small_end}");
    assert_eq!(small, expected(&env, other.tenant_id).await);

    let (rss_before, _) = memory_kib(api.pid());
    let mut peak_seen = rss_before;
    let (seen, end, size) = read_export(&base, &app.api_key, |_| {
        peak_seen = peak_seen.max(memory_kib(api.pid()).0);
    })
    .await;
    let (_, hwm_after) = memory_kib(api.pid());

    // Whole and equal to the database.
    let want = expected(&env, app.tenant_id).await;
    assert_eq!(end["runs"], 10_001, "{end}");
    assert_eq!(end["threads"], 2_501, "{end}");
    assert_eq!(end["messages"], 20_001, "{end}");
    assert_eq!(end["tool_calls"], 10_000, "{end}");
    assert_eq!(seen.len(), want.len());
    if seen != want {
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !seen.contains_key(*k))
            .take(5)
            .collect();
        let extra: Vec<_> = seen
            .keys()
            .filter(|k| !want.contains_key(*k))
            .take(5)
            .collect();
        let differ: Vec<_> = want
            .iter()
            .filter(|(k, v)| seen.get(*k).is_some_and(|s| s != *v))
            .take(5)
            .collect();
        panic!("the export differs: missing {missing:?}, extra {extra:?}, differing {differ:?}");
    }
    assert!(seen.contains_key(&format!("run {queued}")));
    // Nothing of the other tenant.
    for id in small.keys() {
        assert!(
            !seen.contains_key(id),
            "{id} of the other tenant was exported"
        );
    }

    // Bounded memory: the body is ~55 MB; the API's peak resident memory while it streamed it
    // grew by a small fraction of that (a page of 200 rows is ~1 MB), not by the export.
    let grown_kib = hwm_after.max(peak_seen).saturating_sub(rss_before);
    eprintln!(
        "export: {size} bytes; API resident {rss_before} KiB before, peak {} KiB",
        hwm_after.max(peak_seen)
    );
    assert!(size > 40 << 20, "the export is large: {size} bytes");
    assert!(
        grown_kib * 1024 < (size as u64) / 3,
        "the API grew by {grown_kib} KiB while streaming {size} bytes (resident before: {rss_before} KiB)"
    );

    // Without a key, nothing; an unknown parameter is named.
    let resp = reqwest::get(format!("{base}/v1/export")).await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/export?tenant={}", other.tenant_id))
        .bearer_auth(&app.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    assert!(resp.text().await.unwrap().contains("`tenant`"));
}

/// An empty tenant's export is its end line; a tenant's runs waiting for their thread carry
/// their input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_export_is_its_end_line_and_a_waiting_run_carries_its_input() {
    let env = TestEnv::with(&[("export.page_size", "1")]).await;
    let app = env.spawn_api().await;
    let text = app.get("/v1/export").await.text().await.unwrap();
    let end: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(
        end,
        json!({"type": "end", "threads": 0, "runs": 0, "tool_calls": 0, "messages": 0})
    );
    // No worker: the first run stays queued, the second waits for the thread.
    let first = app
        .start_run(&scripted_run(json!([{"content": "one"}]), json!([])))
        .await;
    let thread = first["thread_id"].as_str().unwrap();
    let second = app
        .post(
            "/v1/runs",
            &json!({"input": "and then?", "thread_id": thread, "if_busy": "enqueue", "agent": agent(json!([]))}),
        )
        .await;
    assert_eq!(second.status(), 202);
    let second: Value = second.json().await.unwrap();
    let text = app.get("/v1/export").await.text().await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    // Page size 1: still one thread, then its runs, its message, the end.
    assert_eq!(kinds, ["thread", "run", "run", "message", "end"], "{text}");
    let waiting = lines
        .iter()
        .find(|l| l["id"] == second["id"])
        .expect("the waiting run");
    assert_eq!(waiting["status"], "waiting_for_thread");
    assert_eq!(waiting["queued_input"]["content"], "and then?", "{waiting}");
    assert_eq!(lines[4]["runs"], 2);
}
