/// Status of one row of `tool_calls`; stored as text in `tool_calls.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum ToolCallStatus {
    /// Recorded with the assistant message, not dispatched yet.
    Pending,
    AwaitingConfirmation,
    Approved,
    Rejected,
    /// An `ask` call whose answer has not come yet.
    AwaitingInput,
    /// Dispatched; if the worker dies now the call is dispatched again with the same key.
    Running,
    Succeeded,
    Failed,
    /// Not executed because a terminating tool came before it in the same response.
    Skipped,
}

impl ToolCallStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallStatus::Pending => "pending",
            ToolCallStatus::AwaitingConfirmation => "awaiting_confirmation",
            ToolCallStatus::Approved => "approved",
            ToolCallStatus::Rejected => "rejected",
            ToolCallStatus::AwaitingInput => "awaiting_input",
            ToolCallStatus::Running => "running",
            ToolCallStatus::Succeeded => "succeeded",
            ToolCallStatus::Failed => "failed",
            ToolCallStatus::Skipped => "skipped",
        }
    }

    pub fn parse(s: &str) -> Option<ToolCallStatus> {
        use ToolCallStatus::*;
        [
            Pending,
            AwaitingConfirmation,
            Approved,
            Rejected,
            AwaitingInput,
            Running,
            Succeeded,
            Failed,
            Skipped,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Finished calls are never dispatched again.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            ToolCallStatus::Succeeded
                | ToolCallStatus::Failed
                | ToolCallStatus::Skipped
                | ToolCallStatus::Rejected
        )
    }
}
