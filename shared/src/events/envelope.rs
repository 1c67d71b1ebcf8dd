//! The envelope every event shares (docs/events.md): its types, how it is written and
//! peeked at, and the events built in one place for several writers.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    RunQueued,
    RunStarted,
    IterationStarted,
    MessageDelta,
    MessageCompleted,
    ToolStarted,
    ToolCompleted,
    InputRequired,
    ConfirmationRequired,
    RunResumed,
    RunRecovered,
    RunCompleted,
    RunFailed,
    RunCancelled,
    /// First event of a stream rebuilt from Postgres after Redis lost the run's list.
    StreamRebuilt,
    /// The history sent to the model was compacted to fit its context budget.
    ContextCompacted,
    /// A plan-and-solve planner created a round of tasks (child runs) and waits for them.
    PlanCreated,
    /// A task of the planner's round ended (appended when the planner takes the round up).
    TaskCompleted,
    /// Every task of a round ended; the planner goes on with their results.
    RoundCompleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::RunQueued => "run_queued",
            EventType::RunStarted => "run_started",
            EventType::IterationStarted => "iteration_started",
            EventType::MessageDelta => "message_delta",
            EventType::MessageCompleted => "message_completed",
            EventType::ToolStarted => "tool_started",
            EventType::ToolCompleted => "tool_completed",
            EventType::InputRequired => "input_required",
            EventType::ConfirmationRequired => "confirmation_required",
            EventType::RunResumed => "run_resumed",
            EventType::RunRecovered => "run_recovered",
            EventType::RunCompleted => "run_completed",
            EventType::RunFailed => "run_failed",
            EventType::RunCancelled => "run_cancelled",
            EventType::StreamRebuilt => "stream_rebuilt",
            EventType::ContextCompacted => "context_compacted",
            EventType::PlanCreated => "plan_created",
            EventType::TaskCompleted => "task_completed",
            EventType::RoundCompleted => "round_completed",
        }
    }

    /// The run is over: nothing ever follows.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled
        )
    }

    /// After a pausing or terminal event nothing follows until the run is resumed.
    pub fn ends_stream(self) -> bool {
        matches!(
            self,
            EventType::InputRequired
                | EventType::ConfirmationRequired
                | EventType::RunCompleted
                | EventType::RunFailed
                | EventType::RunCancelled
        )
    }
}

/// An event as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub id: u64,
    pub run_id: Uuid,
    pub thread_id: Uuid,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub at: String,
    pub data: Value,
}

/// The envelope without its id: the id is assigned inside Redis.
#[derive(Serialize)]
pub(crate) struct Unnumbered<'a> {
    pub run_id: Uuid,
    pub thread_id: Uuid,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub at: String,
    pub data: &'a Value,
}

pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Clone, Copy)]
pub struct NewEvent<'a> {
    pub run_id: Uuid,
    pub thread_id: Uuid,
    pub kind: EventType,
    pub data: &'a Value,
}

/// The event's JSON envelope without its id (the script numbers it), and its time.
pub(super) fn envelope(event: &NewEvent<'_>) -> (String, DateTime<Utc>) {
    let at = Utc::now();
    let body = serde_json::to_string(&Unnumbered {
        run_id: event.run_id,
        thread_id: event.thread_id,
        kind: event.kind,
        at: timestamp(at),
        data: event.data,
    })
    .expect("event serializes");
    (body, at)
}

/// Reads the `id` and `type` of a stored event without parsing all of it.
pub fn peek(raw: &str) -> Option<(u64, String)> {
    #[derive(Deserialize)]
    struct Head {
        id: u64,
        #[serde(rename = "type")]
        kind: String,
    }
    let head: Head = serde_json::from_str(raw).ok()?;
    Some((head.id, head.kind))
}

/// The pausing event for a run's pending item. Built in one place so the API can append it on
/// a worker's behalf (if the worker died between its commit and its append) identically.
pub fn pending_event(pending: &Value) -> (EventType, Value) {
    let kind = pending.get("kind").and_then(Value::as_str);
    if kind == Some("budget") {
        // A budget pause is answered like a question (`{"input": ...}`), so it is announced as
        // one; `kind` and the absent `tool_call_id` tell it from the agent's `ask`.
        let data = serde_json::json!({
            "kind": "budget",
            "tool_call_id": null,
            "budget": pending.get("budget"),
            "used": pending.get("used"),
            "limit": pending.get("limit"),
            "question": pending.get("question"),
            "attachments": [],
        });
        (EventType::InputRequired, data)
    } else if kind == Some("input") {
        let data = serde_json::json!({
            "tool_call_id": pending.get("tool_call_id"),
            "question": pending.get("question"),
            "attachments": pending.get("attachments"),
        });
        (EventType::InputRequired, data)
    } else {
        let data = serde_json::json!({"tool_calls": pending.get("tool_calls")});
        (EventType::ConfirmationRequired, data)
    }
}

/// `run_cancelled`'s data, built in one place so that the event the API restores from Postgres
/// (Redis lost it, or its append failed) says what the live one said: the status the run was
/// cancelled from (unknown for runs cancelled before migration 0024 recorded it) and, when a
/// newer message interrupted the run, the `code` and `message` of its `error`.
pub fn cancelled_data(previous: Option<crate::domain::RunStatus>, error: Option<&Value>) -> Value {
    let mut data = serde_json::Map::new();
    if let Some(previous) = previous {
        data.insert("previous_status".into(), Value::from(previous.as_str()));
    }
    if let Some(Value::Object(error)) = error {
        for key in ["code", "message"] {
            if let Some(v) = error.get(key) {
                data.insert(key.into(), v.clone());
            }
        }
    }
    Value::Object(data)
}
