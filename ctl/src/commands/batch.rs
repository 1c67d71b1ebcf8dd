//! `batch status ID… [--wait]`, `batch results ID [--output FILE] [--finished]`,
//! `batch cancel ID`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

use crate::Ctx;
use crate::client::{Retry, with_query};
use crate::commands::{s, uuid_arg};
use crate::error::{CtlError, Result};
use crate::progress::Progress;

#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// The batches' status and counts.
    Status {
        #[arg(required = true)]
        ids: Vec<String>,
        /// Follow them until every run is finished; exit 1 if any failed or was cancelled.
        #[arg(long)]
        wait: bool,
        /// Milliseconds between two looks while waiting.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        poll_ms: u64,
    },
    /// One line per item (NDJSON, submission order): custom_id, run_id, status, output, error.
    Results {
        id: String,
        /// Write to this file instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Only items whose run is finished.
        #[arg(long)]
        finished: bool,
    },
    /// Cancel every item not finished yet (repeating it is harmless).
    Cancel { id: String },
}

pub async fn run(ctx: &Ctx, cmd: &BatchCommand) -> Result<()> {
    match cmd {
        BatchCommand::Status { ids, wait, poll_ms } => {
            let ids = ids
                .iter()
                .map(|i| uuid_arg("batch id", i))
                .collect::<Result<Vec<_>>>()?;
            if *wait {
                let views = wait_all(ctx, &ids, Duration::from_millis(*poll_ms)).await?;
                return report_finished(ctx, &views, None);
            }
            let mut views = Vec::new();
            for id in &ids {
                views.push(get(ctx, id).await?);
            }
            if ctx.json {
                crate::print_json(&json!({"batches": views}));
            } else {
                for v in &views {
                    println!("{}", line(v));
                }
            }
            Ok(())
        }
        BatchCommand::Results {
            id,
            output,
            finished,
        } => results(ctx, &uuid_arg("batch id", id)?, output.as_ref(), *finished).await,
        BatchCommand::Cancel { id } => {
            let id = uuid_arg("batch id", id)?;
            let v = ctx
                .client
                .post_json(&format!("/v1/batches/{id}/cancel"), None, Retry::Idempotent)
                .await?;
            if ctx.json {
                crate::print_json(&v);
            } else {
                println!("{}", line(&v));
            }
            Ok(())
        }
    }
}

pub async fn get(ctx: &Ctx, id: &str) -> Result<Value> {
    ctx.client.get_json(&format!("/v1/batches/{id}")).await
}

fn count(v: &Value, k: &str) -> u64 {
    v["counts"][k].as_u64().unwrap_or(0)
}

/// Items whose run is terminal.
pub fn finished(v: &Value) -> u64 {
    count(v, "completed") + count(v, "failed") + count(v, "cancelled")
}

pub fn is_done(v: &Value) -> bool {
    matches!(v["status"].as_str(), Some("completed" | "cancelled"))
}

/// `<id> <status> <finished>/<total> (completed N, failed N, …)`.
pub fn line(v: &Value) -> String {
    let keys = [
        "pending",
        "queued",
        "running",
        "waiting_for_input",
        "waiting_for_confirmation",
        "completed",
        "failed",
        "cancelled",
    ];
    let parts: Vec<String> = keys
        .iter()
        .filter(|k| count(v, k) > 0)
        .map(|k| format!("{k} {}", count(v, k)))
        .collect();
    format!(
        "{} {} {}/{} finished ({})",
        s(v, "id"),
        s(v, "status"),
        finished(v),
        v["total"].as_u64().unwrap_or(0),
        parts.join(", ")
    )
}

/// Polls the batches until every one is done, with a progress bar of finished runs.
pub async fn wait_all(ctx: &Ctx, ids: &[String], every: Duration) -> Result<Vec<Value>> {
    let mut views = Vec::with_capacity(ids.len());
    for id in ids {
        views.push(get(ctx, id).await?);
    }
    let total: u64 = views.iter().map(|v| v["total"].as_u64().unwrap_or(0)).sum();
    let mut progress = Progress::new("finished", "runs", total, ctx.quiet);
    loop {
        progress.set(views.iter().map(finished).sum());
        if views.iter().all(is_done) {
            progress.finish();
            return Ok(views);
        }
        tokio::time::sleep(every).await;
        for (id, view) in ids.iter().zip(views.iter_mut()) {
            if !is_done(view) {
                *view = get(ctx, id).await?;
            }
        }
    }
}

/// Prints the finished batches; exit 1 when any run failed or was cancelled.
pub fn report_finished(ctx: &Ctx, views: &[Value], mut doc: Option<Value>) -> Result<()> {
    let failed: u64 = views.iter().map(|v| count(v, "failed")).sum();
    let cancelled: u64 = views.iter().map(|v| count(v, "cancelled")).sum();
    let completed: u64 = views.iter().map(|v| count(v, "completed")).sum();
    if ctx.json {
        let mut d = doc.take().unwrap_or_else(|| json!({}));
        d["batches"] = json!(views);
        d["completed"] = json!(completed);
        d["failed"] = json!(failed);
        d["cancelled"] = json!(cancelled);
        crate::print_json(&d);
    } else {
        for v in views {
            println!("{}", line(v));
        }
        println!("completed {completed}, failed {failed}, cancelled {cancelled}");
    }
    if failed + cancelled > 0 {
        return Err(CtlError::Outcome(format!(
            "{failed} run(s) failed and {cancelled} were cancelled; see `agentfleetctl batch results ID`"
        )));
    }
    Ok(())
}

/// Streams the results to the file or stdout as they arrive (never all in memory).
async fn results(ctx: &Ctx, id: &str, output: Option<&PathBuf>, finished: bool) -> Result<()> {
    let c = &ctx.client;
    let query = if finished {
        vec![("status", "finished".to_owned())]
    } else {
        vec![]
    };
    let path = with_query(&format!("/v1/batches/{id}/results"), &query);
    let resp = c
        .send(Retry::Idempotent, || c.request(Method::GET, &path, None))
        .await?;
    let mut out: Box<dyn Write> = match output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(CtlError::io(format!("creating {}", p.display())))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let what = output
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "stdout".into());
    let mut body = resp.bytes_stream();
    let mut lines = 0u64;
    let mut last = b'\n';
    // A stalled stream is a dropped one: the idle bound is the request timeout.
    loop {
        let next = tokio::time::timeout(c.timeout, body.next())
            .await
            .map_err(|_| CtlError::Unavailable("the results stream stalled".into()))?;
        let Some(chunk) = next else { break };
        let chunk =
            chunk.map_err(|e| CtlError::Unavailable(format!("the results stream broke: {e}")))?;
        lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        if let Some(&b) = chunk.last() {
            last = b;
        }
        out.write_all(&chunk)
            .map_err(CtlError::io(format!("writing {what}")))?;
    }
    if last != b'\n' {
        out.write_all(b"\n")
            .map_err(CtlError::io(format!("writing {what}")))?;
        lines += 1;
    }
    out.flush()
        .map_err(CtlError::io(format!("writing {what}")))?;
    if let Some(p) = output
        && !ctx.quiet
    {
        eprintln!("wrote {lines} results to {}", p.display());
    }
    Ok(())
}
