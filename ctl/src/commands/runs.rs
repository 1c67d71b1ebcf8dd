//! `runs list [--status S] [--thread ID] [--limit N] [--cursor C]`, `runs get ID`,
//! `runs cancel ID`.

use clap::Subcommand;
use serde_json::Value;

use crate::Ctx;
use crate::client::{Retry, clip, with_query};
use crate::commands::{run_line, s, uuid_arg};
use crate::error::Result;

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// The tenant's runs, newest first (one page; `--cursor` for the next).
    List {
        /// Only runs in this status (queued, running, waiting_for_input, completed, …).
        #[arg(long)]
        status: Option<String>,
        /// Only runs of this thread.
        #[arg(long)]
        thread: Option<String>,
        /// Page size (the API's default page size when absent).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: Option<u32>,
        /// `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One run: status, pending question or calls, usage, error.
    Get { id: String },
    /// Cancel a run (repeating it is harmless; a finished run cannot be cancelled: exit 1).
    Cancel { id: String },
}

pub async fn run(ctx: &Ctx, cmd: &RunsCommand) -> Result<()> {
    match cmd {
        RunsCommand::List {
            status,
            thread,
            limit,
            cursor,
        } => {
            let mut query: Vec<(&str, String)> = Vec::new();
            if let Some(v) = status {
                query.push(("status", v.clone()));
            }
            if let Some(v) = thread {
                query.push(("thread_id", uuid_arg("--thread", v)?));
            }
            if let Some(v) = limit {
                query.push(("limit", v.to_string()));
            }
            if let Some(v) = cursor {
                query.push(("cursor", v.clone()));
            }
            let page = ctx.client.get_json(&with_query("/v1/runs", &query)).await?;
            if ctx.json {
                crate::print_json(&page);
                return Ok(());
            }
            let rows = page["data"].as_array().cloned().unwrap_or_default();
            println!(
                "{:<36}  {:<24}  {:<24}  {:>5}  {:>8}",
                "ID", "STATUS", "CREATED (UTC)", "ITER", "TOKENS"
            );
            for r in &rows {
                println!(
                    "{:<36}  {:<24}  {:<24}  {:>5}  {:>8}",
                    s(r, "id"),
                    s(r, "status"),
                    short_time(s(r, "created_at")),
                    r["iteration"].as_i64().unwrap_or(0),
                    r["usage"]["total_tokens"].as_i64().unwrap_or(0)
                );
            }
            if let Some(next) = page["next_cursor"].as_str() {
                println!("more: --cursor {next}");
            }
            Ok(())
        }
        RunsCommand::Get { id } => {
            let id = uuid_arg("run id", id)?;
            let run = ctx.client.get_json(&format!("/v1/runs/{id}")).await?;
            if ctx.json {
                crate::print_json(&run);
            } else {
                print_run(&run);
            }
            Ok(())
        }
        RunsCommand::Cancel { id } => {
            let id = uuid_arg("run id", id)?;
            let run = ctx
                .client
                .post_json(&format!("/v1/runs/{id}/cancel"), None, Retry::Idempotent)
                .await?;
            if ctx.json {
                crate::print_json(&run);
            } else {
                println!("{}", run_line(&run));
            }
            Ok(())
        }
    }
}

/// `2026-11-23T21:07:12.123456Z` as `2026-11-23 21:07:12` (UTC), for the table.
fn short_time(t: &str) -> String {
    t.get(..19).unwrap_or(t).replacen('T', " ", 1)
}

/// `runs get` in text: one fact a line, the pending question or calls spelled out.
pub fn print_run(run: &Value) {
    println!("id:         {}", s(run, "id"));
    println!("thread:     {}", s(run, "thread_id"));
    // A run taken over too often runs alone in quarantine: worth a word beside its status.
    let quarantined = if run["quarantined"] == true {
        " (quarantined)"
    } else {
        ""
    };
    println!("status:     {}{quarantined}", s(run, "status"));
    println!(
        "iteration:  {}/{} (attempt {})",
        run["iteration"].as_i64().unwrap_or(0),
        run["max_iterations"].as_i64().unwrap_or(0),
        run["attempt"].as_i64().unwrap_or(0)
    );
    let u = &run["usage"];
    println!(
        "usage:      {} tokens ({} prompt, {} completion), {} tool calls",
        u["total_tokens"].as_i64().unwrap_or(0),
        u["prompt_tokens"].as_i64().unwrap_or(0),
        u["completion_tokens"].as_i64().unwrap_or(0),
        u["tool_calls"].as_i64().unwrap_or(0)
    );
    println!("created:    {}", s(run, "created_at"));
    if let Some(f) = run["finished_at"].as_str() {
        println!("finished:   {f}");
    }
    let p = &run["pending"];
    match p["kind"].as_str() {
        Some("confirmation") => {
            println!("pending:    confirmation of:");
            for c in p["tool_calls"].as_array().into_iter().flatten() {
                println!(
                    "  {} {} {} risk={}",
                    s(c, "tool_call_id"),
                    s(c, "name"),
                    clip(&c["arguments"].to_string(), 200),
                    s(c, "risk")
                );
            }
        }
        Some(kind) => println!("pending:    {kind}: {}", clip(s(p, "question"), 500)),
        None => {}
    }
    if !run["error"].is_null() {
        println!(
            "error:      {}: {}",
            s(&run["error"], "code"),
            clip(s(&run["error"], "message"), 500)
        );
    }
}
