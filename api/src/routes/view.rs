//! The JSON shape of a run, as every endpoint returns it.

use serde_json::{Value, json};

use agentfleet_shared::store::runs::RunRow;

pub fn run_json(run: &RunRow) -> Value {
    json!({
        "id": run.id,
        "thread_id": run.thread_id,
        "status": run.status,
        "agent": run.agent.0,
        "metadata": run.metadata.0,
        "iteration": run.iteration,
        "max_iterations": run.max_iterations,
        "attempt": run.attempt,
        "pending": run.pending.as_ref().map(|p| &p.0),
        "usage": {
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "total_tokens": run.prompt_tokens + run.completion_tokens,
        },
        "error": run.error.as_ref().map(|e| &e.0),
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    })
}
