//! The JSON shapes the API answers with. Every endpoint serializes these types, and the
//! OpenAPI document is derived from them, so the document and the answers cannot drift apart.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use agentfleet_shared::domain::{AgentMode, AgentSpec, RunStatus};
use agentfleet_shared::store::batches::{BatchRow, Counts};
use agentfleet_shared::store::messages::MessageRow;
use agentfleet_shared::store::plans::TaskRow;
use agentfleet_shared::store::runs::RunRow;

/// A run, as every endpoint returns it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Run {
    pub id: Uuid,
    pub thread_id: Uuid,
    pub status: RunStatus,
    /// The agent as it was submitted.
    pub agent: AgentSpec,
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// Model calls made so far.
    pub iteration: i32,
    pub max_iterations: i32,
    /// How many times a worker has claimed the run.
    pub attempt: i32,
    /// The run is in quarantine: its workers stopped responding while holding it more times
    /// than the deployment allows, so each of its attempts now runs alone in a worker. If such
    /// a worker stops responding too, the run fails with `poison_run`; otherwise it goes on as
    /// any run.
    pub quarantined: bool,
    /// While the run waits: `{"kind": "input", ...}` (a question),
    /// `{"kind": "confirmation", "tool_calls": [...]}`, or `{"kind": "budget", "budget",
    /// "used", "limit", "question"}` (the tenant's daily token budget, answered with
    /// `input`); otherwise null.
    #[schema(value_type = Option<Object>)]
    pub pending: Option<Value>,
    pub usage: Usage,
    /// Why a failed run failed: `{"code", "message"}`; otherwise null.
    #[schema(value_type = Option<ErrorDetail>)]
    pub error: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// `react` or `plan_and_solve` (the agent's `mode`).
    pub mode: AgentMode,
    /// A plan-and-solve run, on `GET /v1/runs/{id}`: its rounds and their tasks, and the
    /// tokens its tasks used; otherwise (and in lists) null.
    pub plan: Option<PlanView>,
    /// A plan's task: the plan-and-solve run that created it; otherwise null.
    pub parent_run_id: Option<Uuid>,
    /// A plan's task: its round, place and title; otherwise null.
    pub task: Option<TaskPlace>,
}

/// Where a task stands in its plan.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskPlace {
    pub round: i32,
    pub task_index: i32,
    pub title: Option<String>,
}

/// A plan-and-solve run's plan as it stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanView {
    /// Rounds created so far.
    pub rounds_created: i32,
    /// Prompt + completion tokens of its ended tasks (they count towards the run's budget).
    pub task_tokens: i64,
    /// The run's own tokens plus its tasks'.
    pub total_tokens: i64,
    pub rounds: Vec<PlanRound>,
}

/// One round of a plan.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanRound {
    pub round: i32,
    pub tasks: Vec<Task>,
}

/// A task of a plan: a run of its own (`GET /v1/runs/{run_id}`, its events and messages).
#[derive(Debug, Serialize, ToSchema)]
pub struct Task {
    pub run_id: Uuid,
    pub thread_id: Uuid,
    pub round: i32,
    pub task_index: i32,
    pub title: Option<String>,
    pub status: RunStatus,
    pub total_tokens: i64,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The tasks of a plan-and-solve run, by round and place (none for another run).
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    pub data: Vec<Task>,
}

impl From<&TaskRow> for Task {
    fn from(t: &TaskRow) -> Task {
        Task {
            run_id: t.id,
            thread_id: t.thread_id,
            round: t.plan_round,
            task_index: t.task_index,
            title: t.title.clone(),
            status: t.status,
            total_tokens: t.prompt_tokens + t.completion_tokens,
            created_at: t.created_at,
            started_at: t.started_at,
            finished_at: t.finished_at,
        }
    }
}

/// The plan of a plan-and-solve run, from its tasks.
pub fn plan(run: &RunRow, tasks: &[TaskRow]) -> PlanView {
    let mut rounds: Vec<PlanRound> = Vec::new();
    for t in tasks {
        match rounds.last_mut() {
            Some(r) if r.round == t.plan_round => r.tasks.push(Task::from(t)),
            _ => rounds.push(PlanRound {
                round: t.plan_round,
                tasks: vec![Task::from(t)],
            }),
        }
    }
    PlanView {
        rounds_created: run.plan_round,
        task_tokens: run.task_tokens,
        total_tokens: run.prompt_tokens + run.completion_tokens + run.task_tokens,
        rounds,
    }
}

/// What the run's model calls used. Where a provider reported no usage for a call, the
/// worker estimated it with a tokenizer: `estimated_tokens` is that part of the total, and
/// `estimated` says whether there is any.
#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub total_tokens: i64,
    pub estimated_tokens: i64,
    pub estimated: bool,
    /// Tool calls the model made.
    pub tool_calls: i64,
}

/// A tenant's usage over `from..=to` (UTC days, inclusive).
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReport {
    #[schema(value_type = String, format = Date)]
    pub from: chrono::NaiveDate,
    #[schema(value_type = String, format = Date)]
    pub to: chrono::NaiveDate,
    /// The days with any usage, oldest first (a day without any is left out).
    pub days: Vec<UsageDay>,
    pub total: UsageFigures,
}

/// One UTC day of a tenant's usage.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageDay {
    #[schema(value_type = String, format = Date)]
    pub day: chrono::NaiveDate,
    #[serde(flatten)]
    pub figures: UsageFigures,
}

/// Tokens (prompt + completion = total; `estimated_tokens` of it were estimated by the
/// worker because the provider reported none), tool calls the model made, and runs whose
/// first model call fell in the period.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct UsageFigures {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub total_tokens: i64,
    pub estimated_tokens: i64,
    pub tool_calls: i64,
    pub runs: i64,
}

impl From<&RunRow> for Run {
    fn from(run: &RunRow) -> Run {
        Run {
            id: run.id,
            thread_id: run.thread_id,
            status: run.status,
            agent: AgentSpec::clone(&run.agent),
            metadata: run.metadata.0.clone(),
            iteration: run.iteration,
            max_iterations: run.max_iterations,
            attempt: run.attempt,
            quarantined: run.quarantined_at.is_some(),
            pending: run.pending.as_ref().map(|p| p.0.clone()),
            usage: Usage {
                prompt_tokens: run.prompt_tokens,
                completion_tokens: run.completion_tokens,
                total_tokens: run.prompt_tokens + run.completion_tokens,
                estimated_tokens: run.estimated_tokens,
                estimated: run.estimated_tokens > 0,
                tool_calls: run.tool_calls.into(),
            },
            error: run.error.as_ref().map(|e| e.0.clone()),
            created_at: run.created_at,
            updated_at: run.updated_at,
            started_at: run.started_at,
            finished_at: run.finished_at,
            mode: run.agent.mode,
            plan: None,
            parent_run_id: run.parent_run_id,
            task: run.task_index.map(|task_index| TaskPlace {
                round: run.plan_round,
                task_index,
                title: run.task_title.clone(),
            }),
        }
    }
}

pub fn run(run: &RunRow) -> Run {
    Run::from(run)
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunPage {
    pub data: Vec<Run>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Runs per status (every status present, 0 when none) among the newest `window` runs that
/// match; `counted` = `window` means older runs exist that were not counted.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunCounts {
    #[schema(value_type = Object)]
    pub counts: serde_json::Map<String, Value>,
    pub counted: i64,
    pub window: i64,
}

pub fn run_counts(rows: &[(String, i64)], window: i64) -> RunCounts {
    let mut counts = serde_json::Map::new();
    for status in RunStatus::ALL {
        let n = rows
            .iter()
            .find(|(s, _)| s == status.as_str())
            .map_or(0, |(_, n)| *n);
        counts.insert(status.as_str().to_owned(), n.into());
    }
    RunCounts {
        counted: rows.iter().map(|(_, n)| n).sum(),
        counts,
        window,
    }
}

/// The runs of a batch, in request order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchCreated {
    /// The batch these runs make up (`GET /v1/batches/{id}`, its results and events).
    pub batch_id: Uuid,
    pub runs: Vec<Run>,
}

/// A batch's statuses (the `batches.status` check of the schema).
fn batch_status() -> utoipa::openapi::schema::ObjectBuilder {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some([
            "creating",
            "in_progress",
            "completed",
            "cancelling",
            "cancelled",
        ]))
        .description(Some(
            "`creating` (runs still being created), `in_progress`, `completed` (every run ended), `cancelling`, `cancelled` (every run ended after a cancel)",
        ))
}

/// A batch: what its items have come to.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Batch {
    pub id: Uuid,
    /// `creating` (runs still being created), `in_progress`, `completed` (every run ended),
    /// `cancelling`, `cancelled` (every run ended after a cancel).
    #[schema(schema_with = batch_status)]
    pub status: String,
    /// Items submitted.
    pub total: i64,
    pub counts: BatchCounts,
    pub usage: BatchUsage,
    #[schema(value_type = Object)]
    pub metadata: Value,
    pub created_at: DateTime<Utc>,
    /// When its first run started.
    pub started_at: Option<DateTime<Utc>>,
    /// When its last run ended (status `completed` or `cancelled`).
    pub finished_at: Option<DateTime<Utc>>,
}

/// Items per status: `pending` = no run created yet; the others are the statuses of the
/// items' runs (an item that could get no run, its thread busy or gone, counts as `failed`;
/// after a cancel, items never created count as `cancelled`; a plan-and-solve run waiting for
/// its tasks counts as `running`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct BatchCounts {
    pub pending: i64,
    pub queued: i64,
    pub running: i64,
    pub waiting_for_input: i64,
    pub waiting_for_confirmation: i64,
    pub completed: i64,
    pub failed: i64,
    pub cancelled: i64,
}

/// What the batch's runs used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct BatchUsage {
    /// Prompt + completion tokens of all its runs.
    pub total_tokens: i64,
}

/// A batch with its counts.
pub fn batch(row: &BatchRow, counts: &Counts) -> Batch {
    let total = i64::from(row.total);
    let mut c = BatchCounts {
        pending: counts.pending,
        queued: counts.of("queued"),
        running: counts.of("running") + counts.of("waiting_for_tasks"),
        waiting_for_input: counts.of("waiting_for_input"),
        waiting_for_confirmation: counts.of("waiting_for_confirmation"),
        completed: counts.of("completed"),
        failed: counts.of("failed"),
        cancelled: counts.of("cancelled"),
    };
    // Items that got an error instead of a run.
    c.failed += (total - counts.created() - counts.pending).max(0);
    if row.is_cancelled() {
        c.cancelled += c.pending;
        c.pending = 0;
    }
    Batch {
        id: row.id,
        status: row.status.clone(),
        total,
        counts: c,
        usage: BatchUsage {
            total_tokens: counts.total_tokens,
        },
        metadata: row.metadata.0.clone(),
        created_at: row.created_at,
        started_at: row.started_at,
        finished_at: row.finished_at,
    }
}

/// A page of batches, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchPage {
    pub batches: Vec<Batch>,
    /// Pass as `before` for the next page; null on the last page.
    pub next: Option<String>,
}

/// One message of a thread.
#[derive(Debug, Serialize, ToSchema)]
pub struct Message {
    pub id: i64,
    /// The run that added it; null for messages from before runs were recorded.
    pub run_id: Option<Uuid>,
    /// `user`, `assistant`, `tool`, or `status` (not sent to the model: e.g. a
    /// `context_compacted` record, whose body says what compaction did and holds its summary).
    pub role: String,
    pub is_llm_message: bool,
    /// The message as the model sees it.
    #[schema(value_type = Object)]
    pub body: Value,
    pub created_at: DateTime<Utc>,
}

impl From<&MessageRow> for Message {
    fn from(m: &MessageRow) -> Message {
        Message {
            id: m.id,
            run_id: m.run_id,
            role: m.role.clone(),
            is_llm_message: m.is_llm_message,
            body: m.body.0.clone(),
            created_at: m.created_at,
        }
    }
}

/// A page of a thread's messages, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessagePage {
    pub data: Vec<Message>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<i64>,
}

/// A token for one run's event stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamToken {
    pub token: String,
    pub expires_at: DateTime<Utc>,
    /// The stream's path with the token, for `new EventSource(url)`.
    pub url: String,
}

/// Every failed request: a stable code and a short message naming what was wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable: `invalid_request`, `unauthorized`, `not_found`, `thread_busy`, ...
    pub code: String,
    pub message: String,
}

/// Liveness.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

/// Readiness: whether each backing service answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: String,
    pub postgres: bool,
    pub redis: bool,
    pub rabbitmq: bool,
    /// Whether this process holds a subscription to live events now. Not part of readiness: it
    /// subscribes only to the runs it serves streams of, until `events.hub_linger_ms` after
    /// their last stream (false on an idle, healthy API).
    pub event_hub: bool,
}
