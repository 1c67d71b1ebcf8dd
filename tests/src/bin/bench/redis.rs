//! The `redis` section (`--only redis`).

use std::time::Duration;

use serde_json::json;

use agentfleet_tests::harness::{redis_url, wait_for};
use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::Ctx;

/// Bytes a realistic run leaves in its Redis list, against the text it streamed: at the
/// defaults (compacted, then packed once finished), compacted only, and neither at several
/// delta coalescing intervals.
pub async fn redis_bytes(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    for (flush_ms, compact, pack) in [
        ("50", true, true),
        ("50", true, false),
        ("50", false, false),
        ("250", false, false),
        ("1000", false, false),
    ] {
        let workers = ctx.workers(
            1,
            &[
                ("events.delta_flush_ms", flush_ms),
                ("events.delta_flush_bytes", "4096"),
                (
                    "events.compact_deltas",
                    if compact { "true" } else { "false" },
                ),
                ("events.pack_max_events", if pack { "10000" } else { "0" }),
            ],
        );
        redis_bytes_at(ctx, report, flush_ms, compact, pack).await?;
        drop(workers);
    }
    Ok(())
}

async fn redis_bytes_at(
    ctx: &Ctx,
    report: &mut Report,
    flush_ms: &str,
    compact: bool,
    pack: bool,
) -> anyhow::Result<()> {
    // About 60 tokens/s, a typical streaming rate: 4-character chunks every 16 ms.
    let words = "agents stream their answers token by token while users watch the text appear ";
    let text = words.repeat(if ctx.args.smoke { 10 } else { 40 });
    let chunks = text.len() / 4;
    let input = script(json!([
        {"content": "Let me check.", "chunks": 4, "chunk_delay_ms": 16, "tool_calls": [{"name": "echo", "arguments": {"q": "x"}}]},
        {"content": text, "chunks": chunks, "chunk_delay_ms": 16}
    ]));
    let run = ctx
        .post("/v1/runs", &json!({"input": input, "agent": ctx.agent()}))
        .await?;
    let id = run["id"].as_str().unwrap().to_string();
    ctx.wait_completed(&id, Duration::from_secs(120)).await;
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let key = format!("{}:run:{{{id}}}:events", ctx.env.prefix);
    // Compaction runs right after `message_completed`, packing after the end: wait for both
    // messages' headers, and for the pack.
    let items: Vec<Vec<u8>> = wait_for("the list to settle", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        let key = key.clone();
        async move {
            let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .ok()?;
            let packed = items.first().is_some_and(|i| i.starts_with(b"~z:"));
            let headers = logical(&items)
                .iter()
                .filter(|i| i.contains("\"type\":\"~delta\""))
                .count();
            (packed == pack && (!compact || headers == 2)).then_some(items)
        }
    })
    .await;
    let memory: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut conn)
        .await?;
    let stored: usize = items.iter().map(Vec::len).sum();
    let deltas = logical(&items)
        .iter()
        .filter(|i| {
            i.is_empty() || i.contains("\"type\":\"message_delta\"") || i.contains("~delta")
        })
        .count();
    let streamed = text.len() + "Let me check.".len();
    let ratio = stored as f64 / streamed as f64;
    let tag = format!(
        "flush {flush_ms} ms{}{}",
        if compact { ", compacted" } else { "" },
        if pack { ", packed" } else { "" }
    );
    let default = flush_ms == "50" && compact && pack;
    report.add(
        "redis",
        &format!("{tag}: events / deltas in the list"),
        items.len() as f64,
        &format!("({deltas} deltas)"),
        None,
    );
    report.add(
        "redis",
        &format!("{tag}: list bytes / streamed text ({streamed} B)"),
        ratio,
        "ratio",
        default.then_some(("goal <= 2x (defaults)", ratio <= 2.0)),
    );
    report.add(
        "redis",
        &format!("{tag}: MEMORY USAGE / streamed text"),
        memory as f64 / streamed as f64,
        "ratio",
        None,
    );
    Ok(())
}

/// A list's events as appended, a pack unpacked in its places.
fn logical(items: &[Vec<u8>]) -> Vec<String> {
    let mut events: Vec<String> = items
        .iter()
        .map(|i| String::from_utf8_lossy(i).into_owned())
        .collect();
    if let Some(packed) = items
        .first()
        .and_then(|i| agentfleet_shared::events::unpack(i))
    {
        events.splice(..packed.len(), packed);
    }
    events
}
