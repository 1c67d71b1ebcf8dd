//! `DELETE /v1/mcp-servers/{name}`: removes a registration; runs that name it fail when they
//! next list their tools.

use axum::Json;
use axum::extract::{Path, State};

use agentfleet_shared::domain::check_mcp_server_name;
use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::mcp_servers::{self, McpServer};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::routes::mcp_servers::create::{McpServerError, invalid};
use crate::state::AppState;

#[utoipa::path(delete, path = "/v1/mcp-servers/{name}", tag = "mcp", operation_id = "delete_mcp_server",
    params(("name" = String, Path, pattern = "^[A-Za-z0-9_-]{1,64}$", description = "The server's name")),
    responses((status = 200, description = "Deleted; the server as it was. Runs naming it fail when they next list their tools", body = McpServer),
              (status = 404, description = "No server of this tenant has that name", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request`: `name` is not a server name", body = crate::routes::view::ErrorBody)))]
pub async fn delete_mcp_server(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
) -> Result<Json<McpServer>, ApiError> {
    check_mcp_server_name(&name).map_err(|m| invalid("name", m))?;
    match mcp_servers::delete(&state.pool, caller.tenant_id, &name).await {
        Ok(s) => Ok(Json(s)),
        Err(StoreError::NotFound) => Err(McpServerError::NotFound.into()),
        Err(e) => Err(McpServerError::Unexpected(e.into()).into()),
    }
}
