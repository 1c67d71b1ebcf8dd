//! `answer RUN "text"`: resumes a run waiting for input (a question, or its tenant's token
//! budget) with that text. `-` reads the text from stdin.

use std::io::Read;

use serde_json::json;

use crate::Ctx;
use crate::client::Retry;
use crate::commands::{run_line, uuid_arg};
use crate::error::{CtlError, Result};

/// The API's `api.max_input_bytes` decides; this only stops a runaway pipe early.
const MAX_STDIN_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run.
    pub run: String,
    /// The answer; `-` reads it from stdin.
    pub text: String,
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let id = uuid_arg("run id", &a.run)?;
    let text = if a.text == "-" {
        let mut buf = String::new();
        std::io::stdin()
            .take(MAX_STDIN_BYTES)
            .read_to_string(&mut buf)
            .map_err(CtlError::io("reading the answer from stdin"))?;
        buf
    } else {
        a.text.clone()
    };
    // A resume is not repeatable (the second would meet a running run): retried only when
    // it surely was not sent.
    let run = ctx
        .client
        .post_json(
            &format!("/v1/runs/{id}/resume"),
            Some(&json!({"input": text})),
            Retry::Once,
        )
        .await?;
    if ctx.json {
        crate::print_json(&run);
    } else {
        println!("resumed {}", run_line(&run));
    }
    Ok(())
}
