//! `approve RUN --all | --call ID… [--reject] [--reason TEXT] [--rest approve|reject]`:
//! settles a run's pending tool calls. The API needs a decision for every pending call:
//! `--all` reads them from the run; with `--call`, `--rest` decides the calls not named.

use clap::ValueEnum;
use serde_json::{Value, json};

use crate::Ctx;
use crate::client::Retry;
use crate::commands::{run_line, s, uuid_arg};
use crate::error::{ApiRefusal, CtlError, Result};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Rest {
    Approve,
    Reject,
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["all", "call"]))]
pub struct Args {
    /// The run.
    pub run: String,
    /// Every pending call of the run.
    #[arg(long)]
    pub all: bool,
    /// This call (repeatable).
    #[arg(long = "call", value_name = "TOOL_CALL_ID")]
    pub call: Vec<String>,
    /// Reject the named calls (or all of them) instead of approving.
    #[arg(long)]
    pub reject: bool,
    /// Why (sent with every decision of this command; the model sees it on a rejection).
    #[arg(long)]
    pub reason: Option<String>,
    /// With `--call`: decide every other pending call this way.
    #[arg(long, value_enum, requires = "call")]
    pub rest: Option<Rest>,
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let id = uuid_arg("run id", &a.run)?;
    let approve = !a.reject;
    let mut decisions: Vec<Value> = Vec::new();
    let decision = |call: &str, approve: bool| {
        let mut d = json!({"tool_call_id": call, "approve": approve});
        if let Some(r) = &a.reason {
            d["reason"] = json!(r);
        }
        d
    };
    if a.all || a.rest.is_some() {
        let run = ctx.client.get_json(&format!("/v1/runs/{id}")).await?;
        let pending = &run["pending"];
        if pending["kind"] != "confirmation" {
            // The same refusal the API gives a resume of a run that is not waiting.
            return Err(CtlError::Api(ApiRefusal {
                status: 409,
                code: "run_not_waiting".into(),
                message: format!(
                    "run {id} is {}, not waiting for a confirmation",
                    s(&run, "status")
                ),
            }));
        }
        for c in pending["tool_calls"].as_array().into_iter().flatten() {
            let call = s(c, "tool_call_id");
            if a.all {
                decisions.push(decision(call, approve));
            } else if !a.call.iter().any(|n| n == call) {
                let rest_approve = matches!(a.rest, Some(Rest::Approve));
                decisions.push(decision(call, rest_approve));
            }
        }
    }
    if !a.all {
        for call in &a.call {
            decisions.push(decision(call, approve));
        }
    }
    if decisions.is_empty() {
        return Err(CtlError::Usage(format!("no decision to send for run {id}")));
    }
    let run = ctx
        .client
        .post_json(
            &format!("/v1/runs/{id}/resume"),
            Some(&json!({"decisions": decisions})),
            Retry::Once,
        )
        .await?;
    if ctx.json {
        crate::print_json(&run);
    } else {
        for d in &decisions {
            let verb = if d["approve"] == true {
                "approved"
            } else {
                "rejected"
            };
            println!("{verb} {}", s(d, "tool_call_id"));
        }
        println!("resumed {}", run_line(&run));
    }
    Ok(())
}
