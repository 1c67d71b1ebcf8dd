//! Domain types shared by the API and the workers.

mod agent;
mod run_status;
mod tool_call_status;

pub use agent::{AgentSpec, AgentSpecError, BUILTIN_TOOLS, Risk, ToolKind, ToolSpec};
pub use run_status::RunStatus;
pub use tool_call_status::ToolCallStatus;
