use serde::{Deserialize, Serialize};

/// The statuses of a run (docs/architecture.md); stored as text in `runs.status`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema, sqlx::Type,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    WaitingForInput,
    WaitingForConfirmation,
    Completed,
    Failed,
    Cancelled,
    /// Submitted with `if_busy = enqueue | interrupt` while its thread had an active run: it
    /// becomes `queued` when that run ends (docs/architecture.md "Double-texting").
    WaitingForThread,
    /// A plan-and-solve planner whose round of tasks is running: it holds no worker and
    /// becomes `queued` when the round's last task ends (docs/architecture.md "Plan and solve").
    WaitingForTasks,
    /// A plan's task beyond the plan's `max_parallel`: it becomes `queued` as a task of its
    /// round ends.
    WaitingForSlot,
}

impl RunStatus {
    pub const ALL: [RunStatus; 10] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::WaitingForInput,
        RunStatus::WaitingForConfirmation,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::WaitingForThread,
        RunStatus::WaitingForTasks,
        RunStatus::WaitingForSlot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::WaitingForInput => "waiting_for_input",
            RunStatus::WaitingForConfirmation => "waiting_for_confirmation",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::WaitingForThread => "waiting_for_thread",
            RunStatus::WaitingForTasks => "waiting_for_tasks",
            RunStatus::WaitingForSlot => "waiting_for_slot",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            RunStatus::WaitingForInput | RunStatus::WaitingForConfirmation
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        for st in RunStatus::ALL {
            assert_eq!(RunStatus::parse(st.as_str()), Some(st));
            assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        }
        assert_eq!(RunStatus::parse("bogus"), None);
    }
}
