//! The `events` section (`--only events`).

use std::collections::HashMap;
use std::time::Instant;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};

use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, percentile, sorted};

/// From the worker's append (the envelope's `at`, millisecond resolution) to receipt by an SSE
/// client, with many clients.
pub async fn event_latency(
    ctx: &Ctx,
    report: &mut Report,
    limits: &HashMap<&str, f64>,
) -> anyhow::Result<()> {
    // The goal's load: 1,000 clients receiving 20,000 events/s in all (50 runs streaming 20
    // events/s each, 20 clients per run).
    let (runs, clients, chunks) = if ctx.args.smoke {
        (4, 2, 20)
    } else {
        (50, 20, 100)
    };
    let _workers = ctx.workers(
        ctx.args.workers(),
        &[
            ("worker.concurrency", "64"),
            ("events.delta_flush_bytes", "1"),
            ("events.delta_flush_ms", "1"),
        ],
    );
    let text = "abcdefghij".repeat(chunks / 10);
    let input = script(
        json!([{"content": text, "chunks": chunks, "chunk_delay_ms": 50, "delay_ms": 1500}]),
    );
    let body = json!({"input": input, "agent": {"model": "mock"}});
    let mut handles = Vec::new();
    let t = Instant::now();
    for _ in 0..runs {
        let run = ctx.post("/v1/runs", &body).await?;
        let id = run["id"].as_str().unwrap().to_string();
        for _ in 0..clients {
            let (http, url, key) = (
                ctx.http.clone(),
                format!("{}/v1/runs/{id}/events", ctx.base),
                ctx.key.clone(),
            );
            handles.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let Ok(resp) = http.get(url).bearer_auth(key).send().await else {
                    return (lat, 0);
                };
                let mut stream = resp.bytes_stream().eventsource();
                let mut n = 0;
                while let Some(Ok(ev)) = stream.next().await {
                    let now = chrono::Utc::now();
                    let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
                        continue;
                    };
                    n += 1;
                    if v["type"] == "message_delta"
                        && let Some(at) = v["at"]
                            .as_str()
                            .and_then(|a| chrono::DateTime::parse_from_rfc3339(a).ok())
                    {
                        lat.push(
                            (now - at.with_timezone(&chrono::Utc))
                                .num_microseconds()
                                .unwrap_or(0) as f64
                                / 1000.0,
                        );
                    }
                }
                (lat, n)
            }));
        }
    }
    let mut all = Vec::new();
    let mut events = 0usize;
    for h in handles {
        let (lat, n) = h.await?;
        events += n;
        all.extend(lat);
    }
    let secs = t.elapsed().as_secs_f64();
    let lat = sorted(all);
    let p99 = percentile(&lat, 0.99);
    report.add("events", "SSE clients", (runs * clients) as f64, "", None);
    report.add(
        "events",
        "events delivered to clients/s",
        events as f64 / secs,
        "/s",
        None,
    );
    report.add(
        "events",
        "append-to-client latency p50 (1 ms resolution)",
        percentile(&lat, 0.5),
        "ms",
        None,
    );
    report.add(
        "events",
        "append-to-client latency p99 (1 ms resolution)",
        p99,
        "ms",
        Some(("goal <= 10 ms", p99 <= 10.0)),
    );
    if let Some(redis) = limits.get("redis") {
        report.add(
            "events",
            "appended events/s / redis RPUSH/s",
            (events / clients.max(1)) as f64 / secs / redis,
            "ratio",
            None,
        );
    }
    Ok(())
}
