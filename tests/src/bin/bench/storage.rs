//! The `storage` section (`--only storage`): what a finished run leaves in Postgres (heap,
//! TOAST and indexes of every table, and the WAL written on the way), for the no-op run and
//! for a run shaped like the load section's; then the retention soak (`soak.rs`).

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::mock_llm::script;

use crate::Report;
use crate::common::{Ctx, words};

/// The database's tables: heap (with free space and visibility maps), TOAST (with its
/// indexes) and indexes, in bytes; and the server's WAL position.
#[derive(Clone, Copy, Debug, Default)]
pub struct PgBytes {
    pub heap: i64,
    pub toast: i64,
    pub indexes: i64,
    pub wal: i64,
}

impl PgBytes {
    /// Heap, TOAST and indexes together: what the tables hold on disk.
    pub fn tables(&self) -> i64 {
        self.heap + self.toast + self.indexes
    }
}

pub async fn pg_bytes(pool: &sqlx::PgPool) -> anyhow::Result<PgBytes> {
    let (heap, toast, indexes, wal): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(pg_table_size(c.oid)), 0)::int8
                  - coalesce(sum(CASE WHEN c.reltoastrelid <> 0
                                      THEN pg_total_relation_size(c.reltoastrelid) END), 0)::int8,
                coalesce(sum(CASE WHEN c.reltoastrelid <> 0
                                  THEN pg_total_relation_size(c.reltoastrelid) END), 0)::int8,
                coalesce(sum(pg_indexes_size(c.oid)), 0)::int8,
                (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind IN ('r', 'm', 'p')
            AND n.nspname NOT IN ('pg_catalog', 'information_schema')
            AND n.nspname NOT LIKE 'pg_toast%'",
    )
    .fetch_one(pool)
    .await?;
    Ok(PgBytes {
        heap,
        toast,
        indexes,
        wal,
    })
}

/// Each table's whole size (heap, TOAST, indexes), largest first.
async fn table_bytes(pool: &sqlx::PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT c.relname::text, pg_total_relation_size(c.oid)::int8
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind = 'r' AND n.nspname = 'public'
          ORDER BY 2 DESC",
    )
    .fetch_all(pool)
    .await?)
}

/// The load section's run without its waits: three model calls streaming 80 tokens each, the
/// first two with a tool call whose arguments (and so its result) are a sentence or two.
fn agent_shaped() -> Value {
    let turn = |call: bool| {
        let mut t = json!({"content": "tokn".repeat(80), "chunks": 80});
        if call {
            t["tool_calls"] = json!([{"name": "echo", "arguments": {"text": words(240)}}]);
        }
        t
    };
    json!([turn(true), turn(true), turn(false)])
}

pub async fn storage(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    bytes_per_run(ctx, report).await?;
    ctx.settle().await;
    crate::soak::soak(ctx, report).await
}

async fn bytes_per_run(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let n = if ctx.args.smoke { 20 } else { 1000 };
    let _workers = ctx.workers(ctx.args.workers(), &[("database.max_connections", "20")]);
    // Let the workers connect before the first run.
    tokio::time::sleep(Duration::from_millis(if ctx.args.smoke {
        300
    } else {
        1500
    }))
    .await;
    let limit = Duration::from_secs(if ctx.args.smoke { 60 } else { 600 });
    let workloads = [
        (
            "no-op",
            json!([{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}, {"content": "done"}]),
        ),
        ("agent-shaped", agent_shaped()),
    ];
    for (name, turns) in workloads {
        let body = json!({"input": script(turns), "agent": ctx.agent()});
        let (before, tables_before) = (
            pg_bytes(&ctx.env.pool).await?,
            table_bytes(&ctx.env.pool).await?,
        );
        ctx.run_batch(n, &body, limit).await?;
        let (after, tables_after) = (
            pg_bytes(&ctx.env.pool).await?,
            table_bytes(&ctx.env.pool).await?,
        );
        let per_run = |f: fn(&PgBytes) -> i64| (f(&after) - f(&before)) as f64 / n as f64;
        let grown: Vec<String> = tables_after
            .iter()
            .filter_map(|(table, bytes)| {
                let was = tables_before
                    .iter()
                    .find(|(t, _)| t == table)
                    .map_or(0, |(_, b)| *b);
                let d = (bytes - was) as f64 / n as f64;
                (d >= 1.0).then(|| format!("{table} {d:.0}"))
            })
            .collect();
        println!(
            "storage, {name}: {n} runs; per run, by table: {}",
            grown.join(" · ")
        );
        report.add(
            "storage",
            &format!("{name}: Postgres bytes per run"),
            per_run(PgBytes::tables),
            &format!(
                "B (heap {:.0}, TOAST {:.0}, indexes {:.0})",
                per_run(|b| b.heap),
                per_run(|b| b.toast),
                per_run(|b| b.indexes)
            ),
            None,
        );
        report.add(
            "storage",
            &format!("{name}: WAL per run"),
            per_run(|b| b.wal),
            "B (the whole server's)",
            None,
        );
    }
    Ok(())
}
