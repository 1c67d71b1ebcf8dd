//! Resolves an agent's tools into the catalog one holding offers: `http` tools as declared,
//! and each `mcp` entry expanded into its server's tools (listed, cached), named
//! `<entry name>__<tool name>` so names stay unique and valid for the model.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use agentfleet_shared::domain::{AgentSpec, ToolKind, ToolSpec};
use agentfleet_shared::store::mcp_servers::{self, ResolveError};
use agentfleet_shared::tool_schema::Limits;

use super::catalog::{Catalog, Offered, Target, Unavailable};
use super::{Parameters, mcp};
use crate::deps::Deps;

pub async fn build(deps: &Deps, tenant: Uuid, agent: &AgentSpec) -> Result<Catalog, Unavailable> {
    let mut tools = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    for (i, spec) in agent.tools.iter().enumerate() {
        match spec.kind {
            ToolKind::Http => {
                names.insert(spec.name.clone());
                tools.push(Offered {
                    name: spec.name.clone(),
                    description: spec.description.clone(),
                    parameters: Parameters::new(spec.parameters.clone(), Limits::NONE)
                        .within(&deps.schemas, tenant),
                    risk: spec.risk,
                    timeout_ms: spec.timeout_ms,
                    target: Target::Http {
                        url: spec.url.clone(),
                    },
                });
            }
            ToolKind::Mcp => {
                let fail =
                    |why: String| Unavailable(format!("agent.tools[{i}] (`{}`): {why}", spec.name));
                let server = Arc::new(server_of(deps, tenant, spec).await.map_err(&fail)?);
                let settings = &deps.settings.mcp;
                let schema_limits = settings.schema_limits();
                let limits = mcp::Limits {
                    timeout: Duration::from_millis(settings.list_timeout_ms.get()),
                    max_response_bytes: settings.max_list_bytes.get(),
                };
                let remote = mcp::tools(
                    &deps.tools_http,
                    &deps.egress,
                    &deps.mcp_tools,
                    &server,
                    &limits,
                    settings.max_tools_per_server.get(),
                    settings.max_schema_bytes.get(),
                )
                .await
                .map_err(|e| fail(e.to_string()))?;
                for tool in picked(spec, &remote).map_err(&fail)? {
                    let name = offered_name(&spec.name, &tool.name);
                    if !names.insert(name.clone()) {
                        // Two remote names that differ only in characters the model may not
                        // see: the later one is not offered.
                        tracing::info!(name, "MCP tool name collides after sanitizing; skipped");
                        continue;
                    }
                    tools.push(Offered {
                        name,
                        description: tool.description.clone(),
                        parameters: Parameters::new(tool.schema.clone(), schema_limits)
                            .within(&deps.schemas, tenant),
                        risk: spec.risk,
                        timeout_ms: spec.timeout_ms,
                        target: Target::Mcp {
                            server: server.clone(),
                            tool: tool.name.clone(),
                        },
                    });
                }
            }
        }
    }
    tools.push(Offered::expand_message());
    Ok(Catalog::new(tools))
}

async fn server_of(deps: &Deps, tenant: Uuid, spec: &ToolSpec) -> Result<mcp::Server, String> {
    let Some(name) = &spec.server else {
        return Ok(mcp::Server::new(tenant, spec.url.clone(), Vec::new()));
    };
    match mcp_servers::resolve(&deps.pool, tenant, name, deps.mcp_key.as_ref()).await {
        Ok(r) => Ok(mcp::Server::new(tenant, r.url, r.headers)),
        Err(ResolveError::Store(e)) => {
            tracing::warn!(error = %e, "MCP server lookup failed");
            Err("the MCP server's registration could not be read".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The entry's subset (`tools`), in the server's order; a name the server does not offer is
/// an error rather than a silently smaller tool set.
fn picked<'t>(
    spec: &ToolSpec,
    remote: &'t [mcp::RemoteTool],
) -> Result<Vec<&'t mcp::RemoteTool>, String> {
    let Some(picks) = &spec.tools else {
        return Ok(remote.iter().collect());
    };
    if let Some(missing) = picks.iter().find(|p| !remote.iter().any(|t| &t.name == *p)) {
        return Err(format!("the MCP server offers no tool `{missing}`"));
    }
    Ok(remote
        .iter()
        .filter(|t| picks.iter().any(|p| p == &t.name))
        .collect())
}

/// `<prefix>__<tool>`, with characters outside `[A-Za-z0-9_-]` as `_`, at most 64 long.
pub fn offered_name(prefix: &str, tool: &str) -> String {
    let clean: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = format!("{prefix}__{clean}");
    name.truncate(64);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_names_are_valid_function_names() {
        assert_eq!(offered_name("bank", "transfer"), "bank__transfer");
        assert_eq!(offered_name("fs", "read.file/v2"), "fs__read_file_v2");
        assert_eq!(offered_name("p", &"x".repeat(100)).len(), 64);
    }
}
