//! The tools one run offers the model (`offer` resolves them from the agent's spec, once per
//! holding), and the catalogs that holdings of one agent share.

use std::sync::{Arc, Weak};

use serde_json::{Value, json};
use uuid::Uuid;

use agentfleet_shared::domain::{AgentSpec, Risk, ToolKind};
use agentfleet_shared::tool_schema::Limits;

use super::weak_map::WeakMap;
use super::{Parameters, builtin, mcp};

/// The run fails with this code when an MCP server's tools cannot be offered.
pub const MCP_UNAVAILABLE: &str = "mcp_server_unavailable";

/// A server's tools cannot be offered: the run fails with [`MCP_UNAVAILABLE`] and this
/// tenant-visible message (naming the entry).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

pub struct Catalog {
    tools: Vec<Offered>,
    /// What [`Catalog::definitions`] answers, built with the catalog (once per holding)
    /// rather than for each model call.
    definitions: Vec<Value>,
    /// `definitions` serialised, for the requests that offer them as they are.
    definitions_json: String,
}

/// One tool as the model sees it and as the worker calls it.
pub struct Offered {
    pub name: String,
    pub description: String,
    pub parameters: Parameters,
    pub risk: Risk,
    pub timeout_ms: Option<u64>,
    pub target: Target,
}

pub enum Target {
    Http {
        url: String,
    },
    Mcp {
        server: Arc<mcp::Server>,
        tool: String,
    },
    /// The built-in `expand_message` (offered only once the history is compacted).
    ExpandMessage,
}

impl Offered {
    /// The built-in `expand_message` as the catalog holds it, so calls to it are checked,
    /// recorded and settled like any other low-risk call.
    pub fn expand_message() -> Offered {
        Offered {
            name: builtin::EXPAND_MESSAGE.into(),
            description: builtin::EXPAND_DESCRIPTION.into(),
            parameters: Parameters::new(builtin::expand_parameters(), Limits::NONE),
            risk: Risk::Low,
            timeout_ms: None,
            target: Target::ExpandMessage,
        }
    }
}

impl Catalog {
    pub fn get(&self, name: &str) -> Option<&Offered> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The `tools` array of a chat-completions request: the offered tools plus the built-ins
    /// (`expand_message` apart: `context_summary` decides when it is offered).
    pub fn definitions(&self) -> &[Value] {
        &self.definitions
    }

    /// [`Catalog::definitions`] serialised.
    pub fn definitions_json(&self) -> &str {
        &self.definitions_json
    }

    /// A plan-and-solve planner's catalog: `plan` and `complete` only (its agent's tools are
    /// its tasks'), and `expand_message` once the history is compacted. Built once.
    pub fn planner() -> Arc<Catalog> {
        static PLANNER: std::sync::LazyLock<Arc<Catalog>> = std::sync::LazyLock::new(|| {
            let definitions = builtin::planner_definitions().to_vec();
            let definitions_json = serde_json::to_string(&definitions).expect("JSON serialises");
            Arc::new(Catalog {
                tools: vec![Offered::expand_message()],
                definitions,
                definitions_json,
            })
        });
        PLANNER.clone()
    }

    pub(super) fn new(tools: Vec<Offered>) -> Catalog {
        let mut definitions: Vec<Value> = tools
            .iter()
            .filter(|t| !matches!(t.target, Target::ExpandMessage))
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters.schema()}})
            })
            .collect();
        definitions.extend_from_slice(builtin::definitions());
        let definitions_json = serde_json::to_string(&definitions).expect("JSON serialises");
        Catalog {
            tools,
            definitions,
            definitions_json,
        }
    }
}

/// The catalogs of agents whose tools are all `http`, shared by the holdings of one parsed
/// agent spec (runs of the same spec share one: `store::agents`) and one tenant while any of
/// them holds it. Such a catalog is a function of the spec alone, and building it per holding
/// copied every tool's schema twice and dropped both at the run's end, a tenth of a worker's
/// CPU per run under `bench --agent-tools` (perf). A catalog with MCP tools is built per
/// holding, as the servers' listings may change. Compiled schemas live with their catalog, so
/// they are still held exactly while a holding uses them (and counted as `compiled::Schemas`
/// counts them: against the tenant whose holding compiled them first).
#[derive(Default)]
pub struct Catalogs {
    /// By the spec's address, pinned by the `Weak` kept beside it (an allocation is not reused
    /// while a `Weak` to it lives), and the tenant.
    shared: WeakMap<(usize, Uuid), Catalog, Weak<AgentSpec>>,
}

impl Catalogs {
    /// The holding's catalog: shared when `agent`'s tools are all `http`, else `build`'s own.
    pub async fn get_or_build<F>(
        &self,
        tenant: Uuid,
        agent: &Arc<AgentSpec>,
        build: F,
    ) -> Result<Arc<Catalog>, Unavailable>
    where
        F: Future<Output = Result<Catalog, Unavailable>>,
    {
        if agent.tools.iter().any(|t| t.kind != ToolKind::Http) {
            return build.await.map(Arc::new);
        }
        let key = (Arc::as_ptr(agent) as usize, tenant);
        let known = self.shared.get(&key);
        if let Some(catalog) = known {
            return Ok(catalog);
        }
        let catalog = Arc::new(build.await?);
        self.shared.insert(key, Arc::downgrade(agent), &catalog);
        Ok(catalog)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(tools: Value) -> Arc<AgentSpec> {
        Arc::new(serde_json::from_value(json!({"model": "m", "tools": tools})).unwrap())
    }

    fn http_tool() -> Value {
        json!([{"name": "t", "kind": "http", "url": "http://tools/t",
                "parameters": {"type": "object"}}])
    }

    /// The holdings of one agent spec and tenant share a catalog while one holds it; another
    /// tenant, another parsed spec, or an agent with MCP tools gets its own.
    #[tokio::test]
    async fn catalogs_are_shared_by_one_agent_and_tenant() {
        let catalogs = Catalogs::default();
        let builds = std::cell::Cell::new(0);
        let get = |tenant, agent: Arc<AgentSpec>| {
            let (catalogs, builds) = (&catalogs, &builds);
            async move {
                let build = async {
                    builds.set(builds.get() + 1);
                    Ok(Catalog::new(Vec::new()))
                };
                catalogs.get_or_build(tenant, &agent, build).await.unwrap()
            }
        };
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let spec = agent(http_tool());
        let first = get(a, spec.clone()).await;
        let again = get(a, spec.clone()).await;
        assert!(Arc::ptr_eq(&first, &again), "one agent, one tenant: shared");
        assert_eq!(builds.get(), 1);
        let other_tenant = get(b, spec.clone()).await;
        assert!(!Arc::ptr_eq(&first, &other_tenant));
        let same_text = get(a, agent(http_tool())).await;
        assert!(
            !Arc::ptr_eq(&first, &same_text),
            "another parse of the spec"
        );
        assert_eq!(builds.get(), 3);
        // Once no holding has it, the next holding builds a new one.
        drop((first, again));
        get(a, spec.clone()).await;
        assert_eq!(builds.get(), 4);
        let mcp = agent(json!([{"name": "m", "kind": "mcp", "url": "http://mcp/"}]));
        let one = get(a, mcp.clone()).await;
        let two = get(a, mcp).await;
        assert!(!Arc::ptr_eq(&one, &two), "MCP listings are per holding");
        assert_eq!(builds.get(), 6);
    }
}
