//! `submit FILE.jsonl`: every non-blank line is a run (the body of `POST /v1/runs`, plus an
//! optional `custom_id`, `line-<n>` by default). The file is checked whole before anything is
//! sent, then sent in chunks of `--chunk-size` runs, one `POST /v1/batches` each, whose
//! `Idempotency-Key` is a hash of that very request body (and `--label`) with the chunk's
//! range. Re-running the same command after Ctrl-C, a crash or a timeout re-sends every chunk;
//! the API answers the ones it already has with the existing batch (200) and creates nothing
//! twice. Keys follow the chunks' content, not the file's: fixing a line the API refused
//! changes only its own chunk's key, so a re-run after the fix still finds the chunks before
//! it. (The same chunks need the same `--chunk-size`.)

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::Ctx;
use crate::client::{Retry, read_bounded};
use crate::commands::batch;
use crate::error::{CtlError, Result};
use crate::progress::Progress;

/// The contract's `custom_id` bound, checked here so a bad file sends nothing.
const MAX_CUSTOM_ID_CHARS: usize = 128;
/// The file is held in memory (hashed, then sliced into chunks); this bounds it.
const MAX_FILE_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// A batch's answer is its view: small.
const MAX_VIEW_BYTES: usize = 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The JSONL file: one run a line.
    pub file: PathBuf,
    /// Runs per batch request (the API's `api.max_batch_items` bounds it).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub chunk_size: u64,
    /// A JSON object recorded as every batch's metadata.
    #[arg(long)]
    pub metadata: Option<String>,
    /// Mixed into the idempotency keys: the same file submitted again under another label
    /// makes new runs (without it, a re-submission is a resume and creates nothing).
    #[arg(long)]
    pub label: Option<String>,
    /// Then follow the batches until every run is finished; exit 1 if any failed or was
    /// cancelled.
    #[arg(long)]
    pub wait: bool,
    /// Milliseconds between two looks with `--wait`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub poll_ms: u64,
}

/// One run of the file: where it is and its physical line number (1-based).
#[derive(Debug)]
struct Item {
    line: usize,
    start: usize,
    end: usize,
}

/// The checked file.
#[derive(Debug)]
pub struct Checked {
    bytes: Vec<u8>,
    items: Vec<Item>,
    /// sha256 of the file, for the record (`--json`).
    pub digest: String,
}

/// Reads and checks the whole file: every line JSON object with a string `input` and an
/// object `agent`; `custom_id`, when given, a string of 1..=128 characters, unique in the
/// file. The first problem is an error naming its line.
pub fn check(path: &PathBuf) -> Result<Checked> {
    let len = std::fs::metadata(path)
        .map_err(CtlError::io(format!("reading {}", path.display())))?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(CtlError::Usage(format!(
            "{}: larger than {MAX_FILE_BYTES} bytes; split it",
            path.display()
        )));
    }
    let bytes = std::fs::read(path).map_err(CtlError::io(format!("reading {}", path.display())))?;
    check_bytes(bytes).map_err(|e| match e {
        CtlError::Usage(m) => CtlError::Usage(format!("{}: {m}", path.display())),
        other => other,
    })
}

pub fn check_bytes(bytes: Vec<u8>) -> Result<Checked> {
    let mut items = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut start = 0usize;
    let mut line = 0usize;
    while start < bytes.len() {
        line += 1;
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|p| start + p)
            .unwrap_or(bytes.len());
        let raw = &bytes[start..end];
        if !raw.iter().all(u8::is_ascii_whitespace) {
            let bad = |m: String| CtlError::Usage(format!("line {line}: {m}"));
            let v: Value =
                serde_json::from_slice(raw).map_err(|e| bad(format!("not JSON: {e}")))?;
            let Value::Object(o) = &v else {
                return Err(bad("expected a JSON object (a run)".into()));
            };
            if !o.get("input").is_some_and(Value::is_string) {
                return Err(bad("`input` must be a string".into()));
            }
            if !o.get("agent").is_some_and(Value::is_object) {
                return Err(bad("`agent` must be an object".into()));
            }
            let id = match o.get("custom_id") {
                None => default_custom_id(line),
                Some(Value::String(s)) => {
                    let n = s.chars().count();
                    if n == 0 || n > MAX_CUSTOM_ID_CHARS {
                        return Err(bad(format!(
                            "`custom_id` must be 1..={MAX_CUSTOM_ID_CHARS} characters"
                        )));
                    }
                    s.clone()
                }
                Some(_) => return Err(bad("`custom_id` must be a string".into())),
            };
            if !seen.insert(id.clone()) {
                return Err(bad(format!("`custom_id` `{id}` is used twice in the file")));
            }
            items.push(Item { line, start, end });
        }
        start = end + 1;
    }
    if items.is_empty() {
        return Err(CtlError::Usage("no runs in the file".into()));
    }
    let digest = hex::encode(Sha256::digest(&bytes));
    Ok(Checked {
        bytes,
        items,
        digest,
    })
}

pub fn default_custom_id(line: usize) -> String {
    format!("line-{line}")
}

impl Checked {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The request body of items `first..=last` (0-based).
    fn body(&self, first: usize, last: usize, metadata: Option<&Value>) -> Value {
        let mut body = json!({"runs": self.runs(first, last)});
        if let Some(m) = metadata {
            body["metadata"] = m.clone();
        }
        body
    }

    /// The `runs` of items `first..=last`, each with its `custom_id`.
    fn runs(&self, first: usize, last: usize) -> Vec<Value> {
        self.items[first..=last]
            .iter()
            .map(|it| {
                // Checked above: an object.
                let mut o: Map<String, Value> =
                    serde_json::from_slice(&self.bytes[it.start..it.end]).unwrap_or_default();
                o.entry("custom_id")
                    .or_insert_with(|| Value::String(default_custom_id(it.line)));
                Value::Object(o)
            })
            .collect()
    }
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let metadata = match &a.metadata {
        None => None,
        Some(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => return Err(CtlError::Usage("--metadata must be a JSON object".into())),
        },
    };
    let file = check(&a.file)?;
    let total = file.len();
    let size = a.chunk_size as usize;
    let mut progress = Progress::new("submitted", "runs", total as u64, ctx.quiet);
    progress.set(0);
    let mut batches: Vec<Value> = Vec::new();
    let mut first = 0usize;
    while first < total {
        let last = (first + size).min(total) - 1;
        let body = file.body(first, last, metadata.as_ref());
        let key = idempotency_key(&body, a.label.as_deref(), first, last);
        let (status, view) = post_batch(ctx, &body, &key)
            .await
            .map_err(|e| name_the_line(e, &file, first))?;
        let id = view["id"]
            .as_str()
            .ok_or_else(|| CtlError::Protocol("the batch answer has no `id`".into()))?
            .to_owned();
        let created = status == StatusCode::ACCEPTED;
        let (l1, l2) = (file.items[first].line, file.items[last].line);
        if !ctx.json {
            progress.println(&format!(
                "batch {id} lines {l1}-{l2}: {} runs {}",
                last - first + 1,
                if created {
                    "created"
                } else {
                    "already submitted"
                }
            ));
        }
        batches.push(json!({"id": id, "first_line": l1, "last_line": l2,
                            "runs": last - first + 1, "created": created}));
        progress.set(last as u64 + 1);
        first = last + 1;
    }
    progress.finish();
    let ids: Vec<String> = batches
        .iter()
        .filter_map(|b| b["id"].as_str().map(str::to_owned))
        .collect();
    let doc = json!({"file": a.file.display().to_string(), "sha256": file.digest,
                     "runs": total, "batches": batches});
    if a.wait {
        let views = batch::wait_all(ctx, &ids, Duration::from_millis(a.poll_ms)).await?;
        return batch::report_finished(ctx, &views, Some(doc));
    }
    if ctx.json {
        crate::print_json(&doc);
    } else {
        println!(
            "submitted {total} runs in {} batch(es): {}",
            ids.len(),
            ids.join(" ")
        );
    }
    Ok(())
}

/// The key of one chunk: the same body (runs, custom_ids, metadata) and label give the same
/// key, so a re-run finds the batch the first run made; any other body gets another key
/// (never the API's 409 for a key reused with another body). serde_json's maps are sorted, so
/// one body always serializes to the same bytes.
pub fn idempotency_key(body: &Value, label: Option<&str>, first: usize, last: usize) -> String {
    let mut h = Sha256::new();
    if let Some(l) = label {
        h.update(l.as_bytes());
    }
    h.update([0u8]);
    h.update(body.to_string().as_bytes());
    let digest = hex::encode(h.finalize());
    format!("agentfleetctl-{}-{}-{}", &digest[..40], first + 1, last + 1)
}

/// A refusal naming `runs[i]…` of a chunk names the file's line instead (`line 1234
/// (runs[233]…)`), so the file can be fixed; the chunks before it were accepted and a re-run
/// after the fix resumes.
fn name_the_line(e: CtlError, file: &Checked, first: usize) -> CtlError {
    let CtlError::Api(mut r) = e else { return e };
    if let Some(rest) = r.message.strip_prefix("runs[")
        && let Some((i, _)) = rest.split_once(']')
        && let Ok(i) = i.parse::<usize>()
        && let Some(item) = file.items.get(first + i)
    {
        r.message = format!("line {}: {}", item.line, r.message);
    }
    CtlError::Api(r)
}

/// One chunk: 202 (created) or 200 (the key's existing batch), with retries (the key makes
/// them safe).
async fn post_batch(ctx: &Ctx, body: &Value, key: &str) -> Result<(StatusCode, Value)> {
    let c = &ctx.client;
    // A large chunk takes longer to upload than a plain request.
    let timeout = c.timeout.max(Duration::from_secs(60));
    let resp = c
        .send_within(Retry::Idempotent, timeout, || {
            c.request(Method::POST, "/v1/batches", Some(timeout))
                .header("Idempotency-Key", key)
                .json(body)
        })
        .await?;
    let status = resp.status();
    let bytes = read_bounded(resp, MAX_VIEW_BYTES).await?;
    let view = serde_json::from_slice(&bytes)
        .map_err(|e| CtlError::Protocol(format!("the batch answer is not JSON: {e}")))?;
    Ok((status, view))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(input: &str) -> String {
        json!({"input": input, "agent": {"model": "m"}}).to_string()
    }

    #[test]
    fn bad_lines_are_named_and_nothing_is_accepted() {
        let good = line("a");
        for (text, want) in [
            (format!("{good}\n{{oops\n"), "line 2: not JSON"),
            (format!("{good}\n[1]\n"), "line 2: expected a JSON object"),
            (format!("{good}\n{{\"agent\":{{}}}}\n"), "line 2: `input`"),
            (
                format!("{{\"custom_id\":\"line-3\",\"input\":\"x\",\"agent\":{{}}}}\n\n{good}\n"),
                "line 3: `custom_id` `line-3` is used twice",
            ),
            ("\n \n".to_owned(), "no runs"),
        ] {
            let e = check_bytes(text.into_bytes()).unwrap_err();
            assert!(e.to_string().contains(want), "{e} / {want}");
            assert_eq!(e.exit_code(), 2);
        }
    }

    #[test]
    fn chunks_carry_custom_ids_and_keys_are_stable_per_content_and_range() {
        let text = format!("{}\n\n{}\n{}", line("a"), line("b"), line("c"));
        let f = check_bytes(text.clone().into_bytes()).unwrap();
        assert_eq!(f.len(), 3);
        let runs = f.runs(0, 1);
        assert_eq!(runs[0]["custom_id"], "line-1");
        assert_eq!(runs[1]["custom_id"], "line-3", "physical line numbers");
        let key = |f: &Checked, first, last, meta: Option<&Value>, label| {
            idempotency_key(&f.body(first, last, meta), label, first, last)
        };
        let again = check_bytes(text.into_bytes()).unwrap();
        assert_eq!(key(&f, 0, 1, None, None), key(&again, 0, 1, None, None));
        assert_ne!(key(&f, 0, 1, None, None), key(&f, 2, 2, None, None));
        assert_ne!(
            key(&f, 0, 1, None, None),
            key(&f, 0, 1, Some(&json!({"a": 1})), None)
        );
        assert_ne!(
            key(&f, 0, 1, None, None),
            key(&f, 0, 1, None, Some("again"))
        );
        assert!(key(&f, 0, 1, None, None).len() <= 200);
        // A fixed line changes its own chunk's key only.
        let fixed = format!("{}\n\n{}\n{}", line("a"), line("b"), line("C"));
        let fixed = check_bytes(fixed.into_bytes()).unwrap();
        assert_eq!(key(&f, 0, 1, None, None), key(&fixed, 0, 1, None, None));
        assert_ne!(key(&f, 2, 2, None, None), key(&fixed, 2, 2, None, None));
        let refusal = |m: &str| {
            CtlError::Api(crate::error::ApiRefusal {
                status: 422,
                code: "invalid_request".into(),
                message: m.into(),
            })
        };
        let named = name_the_line(refusal("runs[1].agent.model: unknown"), &f, 1);
        assert!(
            named.to_string().contains("line 4: runs[1].agent.model"),
            "{named}"
        );
        let other = name_the_line(refusal("runs: too many"), &f, 0);
        assert!(other.to_string().contains(": runs: too many"), "{other}");
    }
}
