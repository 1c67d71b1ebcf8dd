//! Domain types shared by the API and the workers.

mod agent;
mod limits;
mod retention;
mod run_status;
pub mod schema;
mod tool_call_status;

pub use agent::{
    AgentMode, AgentSpec, AgentSpecError, BUILTIN_TOOLS, MAX_MCP_SERVER_NAME, MAX_MCP_TOOL_PICKS,
    MAX_TOOL_URL_BYTES, PlanLimits, PlanSpec, Risk, ToolKind, ToolSpec, check_mcp_server_name,
    check_tool_url,
};
pub use limits::{FairShare, LimitError, LimitOverrides, Limits, MAX_REQUESTS_PER_SECOND};
pub use retention::{
    LEGACY_RETENTION_FIELDS, MAX_RETENTION_SECS, RetentionError, RetentionOverrides,
    RetentionWindows, SECS_PER_DAY,
};
pub use run_status::RunStatus;
pub use tool_call_status::ToolCallStatus;
