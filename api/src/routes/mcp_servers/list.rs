//! `GET /v1/mcp-servers`: the tenant's registered servers, by name; header names only.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use agentfleet_shared::store::mcp_servers::{self, McpServer};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::routes::mcp_servers::create::McpServerError;
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct McpServerList {
    pub data: Vec<McpServer>,
}

#[utoipa::path(get, path = "/v1/mcp-servers", tag = "mcp", operation_id = "list_mcp_servers",
    responses((status = 200, description = "The tenant's servers, by name (at most `mcp.max_servers_per_tenant`)", body = McpServerList)))]
pub async fn list_mcp_servers(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<McpServerList>, ApiError> {
    let data = mcp_servers::list(&state.pool, caller.tenant_id)
        .await
        .map_err(|e| McpServerError::Unexpected(e.into()))?;
    Ok(Json(McpServerList { data }))
}
