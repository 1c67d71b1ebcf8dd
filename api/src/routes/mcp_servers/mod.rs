//! `/v1/mcp-servers`: the MCP servers a tenant registers, one file per endpoint (`create.rs`
//! also holds the rules of a registration and the answers of its errors).

pub mod create;
pub mod delete;
pub mod get;
pub mod list;
