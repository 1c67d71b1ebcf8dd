//! What the sections share: the context (the environment, the API process, an HTTP client
//! with the tenant's key), its helpers for submitting runs, counting them and spawning
//! workers, and percentiles.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use agentfleet_tests::harness::{ChildProcess, TestEnv, amqp_url, wait_for};

use crate::Args;

/// Most requests in flight when submissions are paced (`--rate`): enough that the pace, not
/// this bound, sets the rate a fleet that keeps up sees, and a bound all the same.
pub const PACED_IN_FLIGHT: usize = 512;

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Waits, up to `within`, until `iterations` holds `expected` rows (of `runs`, or of every
/// run): a final iteration's timing is written by a later statement of its worker, or by the
/// worker's next sweep (`worker.sweep_interval_ms`), after the run has completed.
pub async fn wait_for_timings(
    pool: &sqlx::PgPool,
    runs: Option<&[String]>,
    expected: i64,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let counted: Result<(i64,), _> = sqlx::query_as(
            "SELECT count(*) FROM iterations WHERE $1::uuid[] IS NULL OR run_id = ANY($1::uuid[])",
        )
        .bind(runs)
        .fetch_one(pool)
        .await;
        if counted.map_or(true, |(n,)| n >= expected) || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v
}

pub struct Ctx {
    pub env: TestEnv,
    pub args: Args,
    pub base: String,
    pub key: String,
    pub http: reqwest::Client,
    pub api: ChildProcess,
    /// `--agent-tools`: parameter schemas of the agent's tools besides `echo`.
    pub extra_tools: Vec<Value>,
}

/// A batch of runs, submitted and completed.
pub struct Batch {
    /// From the first POST to the last completion.
    pub secs: f64,
    /// Queries the wait for completion sent.
    pub polls: u64,
    /// Paced (`rate`): how far behind its moment the latest request was sent.
    pub late: Duration,
}

impl Ctx {
    pub fn wants(&self, section: &str) -> bool {
        self.args.only.is_empty() || self.args.only.iter().any(|s| s == section)
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let v: Value = resp.json().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {v}");
        Ok(v)
    }

    pub fn agent(&self) -> Value {
        let mut tools = vec![
            json!({"name": "echo", "kind": "http", "url": self.env.tools.url("/echo"),
               "parameters": {"type": "object"}}),
        ];
        tools.extend(self.extra_tools());
        // Every tool turn is an iteration, and so is the answer.
        let max_iterations = (self.args.tool_turns + 1).max(10);
        let mut agent = json!({"model": "mock", "tools": tools, "max_iterations": max_iterations});
        if self.args.system_prompt_bytes > 0 {
            agent["system_prompt"] = json!(words(self.args.system_prompt_bytes));
        }
        agent
    }

    /// The `--agent-tools` tools (none by default).
    pub fn extra_tools(&self) -> impl Iterator<Item = Value> + '_ {
        self.extra_tools.iter().enumerate().map(|(i, schema)| {
            json!({"name": format!("tool_{}", i + 1), "kind": "http",
                   "description": "a tool the scripted model never calls",
                   "url": self.env.tools.url("/echo"), "parameters": schema})
        })
    }

    pub async fn count(&self, status: &str) -> i64 {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE status = $1")
            .bind(status)
            .fetch_one(&self.env.pool)
            .await
            .unwrap_or((0,));
        n
    }

    /// Polls until run `id` is completed (panics after `timeout`).
    pub async fn wait_completed(&self, id: &str, timeout: Duration) {
        wait_for("the run to complete", timeout, || async {
            let (status,): (String,) =
                sqlx::query_as("SELECT status FROM runs WHERE id = $1::uuid")
                    .bind(id)
                    .fetch_one(&self.env.pool)
                    .await
                    .ok()?;
            (status == "completed").then_some(())
        })
        .await;
    }

    /// Submits `n` copies of `body` (32 requests in flight) and waits until as many more runs
    /// have completed; returns the seconds from the first POST to the last completion.
    pub async fn run_batch(&self, n: usize, body: &Value, limit: Duration) -> anyhow::Result<f64> {
        let done_before = self.count("completed").await;
        Ok(self
            .submit_and_wait(n, body, 1, None, limit, done_before)
            .await?
            .secs)
    }

    /// `run_batch` after its count of completed runs (`done_before`), so a caller can start
    /// measuring right before the first POST. `per_request` 1 submits each run with its own
    /// `POST /v1/runs` (32 in flight); more submits them `per_request` at a time through
    /// `POST /v1/runs/batch` (4 requests in flight, as a producer with a few threads would).
    ///
    /// With a `rate` (runs per second), each request is sent at its moment of a steady stream
    /// of that many runs a second, whether or not earlier ones have been answered (up to
    /// [`PACED_IN_FLIGHT`] requests in flight): an offered load, as independent clients make
    /// it, instead of as much as the requests in flight let through.
    pub async fn submit_and_wait(
        &self,
        n: usize,
        body: &Value,
        per_request: usize,
        rate: Option<f64>,
        limit: Duration,
        done_before: i64,
    ) -> anyhow::Result<Batch> {
        let t = Instant::now();
        let late = self.submit(n, body, per_request, rate).await?;
        // Counted, because each poll is a query (and a commit) in the database being measured.
        let polls = AtomicU64::new(0);
        wait_for("all runs to complete", limit, || async {
            polls.fetch_add(1, Ordering::Relaxed);
            (self.count("completed").await >= done_before + n as i64).then_some(())
        })
        .await;
        Ok(Batch {
            secs: t.elapsed().as_secs_f64(),
            polls: polls.into_inner(),
            late,
        })
    }

    /// The submissions of [`Ctx::submit_and_wait`], without the wait: returns once every
    /// request is answered (an error if one was refused), with how far behind its moment the
    /// latest paced request went out.
    pub async fn submit(
        &self,
        n: usize,
        body: &Value,
        per_request: usize,
        rate: Option<f64>,
    ) -> anyhow::Result<Duration> {
        let (path, in_flight) = if per_request > 1 {
            ("/v1/runs/batch", 4)
        } else {
            ("/v1/runs", 32)
        };
        let in_flight = if rate.is_some() {
            PACED_IN_FLIGHT
        } else {
            in_flight
        };
        let start = tokio::time::Instant::now();
        let sem = Arc::new(Semaphore::new(in_flight));
        let mut tasks = Vec::new();
        let mut left = n;
        let mut late = Duration::ZERO;
        while left > 0 {
            let size = left.min(per_request.max(1));
            // The moment the first run of this request is due in a steady stream.
            let due = rate.map(|rate| start + Duration::from_secs_f64((n - left) as f64 / rate));
            if let Some(due) = due {
                tokio::time::sleep_until(due).await;
            }
            left -= size;
            let body = if per_request > 1 {
                json!({"runs": vec![body; size]})
            } else {
                body.clone()
            };
            let permit = sem.clone().acquire_owned().await?;
            if let Some(due) = due {
                // Past its moment: the bound on requests in flight held it back.
                late = late.max(tokio::time::Instant::now().saturating_duration_since(due));
            }
            let (http, url, key) = (
                self.http.clone(),
                format!("{}{path}", self.base),
                self.key.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let r = http.post(url).bearer_auth(key).json(&body).send().await;
                drop(permit);
                r.map(|r| r.status() == 202).unwrap_or(false)
            }));
        }
        for task in tasks {
            anyhow::ensure!(task.await?, "a submission failed");
        }
        Ok(late)
    }

    /// Stops everything queued or waiting, so the next section starts clean (planners waiting
    /// for their tasks and tasks waiting for a slot included).
    pub async fn settle(&self) {
        let _ = sqlx::query(
            "UPDATE runs SET status = 'cancelled', finished_at = now(), pending = NULL,
                             lease_owner = NULL, lease_expires_at = NULL
             WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                              'waiting_for_tasks', 'waiting_for_slot')",
        )
        .execute(&self.env.pool)
        .await;
        if let Ok(conn) = agentfleet_shared::queue::connect(&amqp_url(), "bench").await
            && let Ok(ch) = conn.create_channel().await
        {
            let _ = ch
                .queue_purge(
                    format!("{}.runs", self.env.prefix).as_str().into(),
                    Default::default(),
                )
                .await;
        }
    }

    pub fn workers(&self, n: usize, extra: &[(&str, &str)]) -> Vec<ChildProcess> {
        (0..n)
            .map(|_| self.env.spawn_worker_process(extra))
            .collect()
    }
}

/// `len` bytes of words drawn from a small vocabulary by a fixed sequence (the same text in
/// every round).
pub fn words(len: usize) -> String {
    const VOCABULARY: [&str; 16] = [
        "the",
        "result",
        "of",
        "search",
        "returned",
        "twelve",
        "documents",
        "about",
        "quarterly",
        "revenue",
        "in",
        "region",
        "north",
        "with",
        "figures",
        "attached",
    ];
    let mut text = String::with_capacity(len + 16);
    let mut state: u32 = 2_463_534_242;
    while text.len() < len {
        // xorshift32: a fixed, cheap sequence.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        text.push_str(VOCABULARY[(state % 16) as usize]);
        text.push(' ');
    }
    text.truncate(len);
    text
}
