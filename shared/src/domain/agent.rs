//! The agent spec a client submits with a run, validated once at the edge.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::schema::{
    AllOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder, Ref, Schema, SchemaType, Type,
};

/// Tools every agent has without declaring them.
pub const BUILTIN_TOOLS: [&str; 3] = ["complete", "ask", "expand_message"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// A model name configured under `models.<name>`.
    pub model: String,
    /// At most 200000 bytes of UTF-8, no NUL.
    #[serde(default)]
    #[schema(pattern = "^[^\u{0}]*$")]
    pub system_prompt: Option<String>,
    /// At most `api.max_tools_per_agent` tools, with distinct names.
    #[serde(default)]
    #[schema(schema_with = tools_schema)]
    pub tools: Vec<ToolSpec>,
    /// Model calls at most; `worker.default_max_iterations` when null.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    pub max_iterations: Option<i32>,
    /// The run's token budget (prompt + completion over all its model calls): once reached,
    /// the run fails with `budget_exceeded` instead of calling the model again. At most
    /// `api.max_tokens_total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_tokens_total: Option<i64>,
    /// Tool calls of one response that run at once; `worker.max_parallel_tool_calls` when
    /// absent, and never more than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1024)]
    pub max_parallel_tool_calls: Option<u32>,
    /// `react` (the default): one agent loop. `plan_and_solve`: a planner splits the request
    /// into rounds of tasks, each run as a child run by the executor agent, then a summary
    /// turn writes the answer.
    #[serde(default, skip_serializing_if = "AgentMode::is_react")]
    pub mode: AgentMode,
    /// The plan's settings; only with `mode: plan_and_solve` (defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanSpec>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentMode {
    #[default]
    React,
    PlanAndSolve,
}

impl AgentMode {
    pub fn is_react(&self) -> bool {
        *self == AgentMode::React
    }
}

/// How a plan-and-solve run plans. Every bound is also capped by the deployment
/// (`api.max_plan_rounds`, `api.max_plan_tasks`, `api.max_plan_parallel`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// Rounds of tasks at most; after the last, the planner must call `complete`.
    #[serde(default = "default_max_rounds")]
    #[schema(minimum = 1, default = 5)]
    pub max_rounds: u32,
    /// Tasks one `plan` call may create at most.
    #[serde(default = "default_max_tasks")]
    #[schema(minimum = 1, default = 8)]
    pub max_tasks: u32,
    /// Tasks of a round in flight at once; the others wait for a place.
    #[serde(default = "default_max_parallel")]
    #[schema(minimum = 1, default = 4)]
    pub max_parallel: u32,
    /// The planner's system prompt (a built-in one when absent). At most 200000 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\u{0}]*$")]
    pub planner_prompt: Option<String>,
    /// The agent each task runs (model, tools, prompt), in `react` mode without a plan; the
    /// run's own agent without the plan when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = executor_schema)]
    pub executor: Option<Box<AgentSpec>>,
    /// The system prompt of the summary turn that writes the run's answer (a built-in one
    /// when absent). At most 200000 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\u{0}]*$")]
    pub summary_prompt: Option<String>,
}

impl Default for PlanSpec {
    fn default() -> PlanSpec {
        PlanSpec {
            max_rounds: default_max_rounds(),
            max_tasks: default_max_tasks(),
            max_parallel: default_max_parallel(),
            planner_prompt: None,
            executor: None,
            summary_prompt: None,
        }
    }
}

fn default_max_rounds() -> u32 {
    5
}
fn default_max_tasks() -> u32 {
    8
}
fn default_max_parallel() -> u32 {
    4
}

/// An agent spec (or null) in `react` mode without a plan.
fn executor_schema() -> OneOfBuilder {
    let react = ObjectBuilder::new()
        .property(
            "mode",
            ObjectBuilder::new()
                .schema_type(SchemaType::AnyValue)
                .enum_values(Some(["react"])),
        )
        .property("plan", ObjectBuilder::new().schema_type(Type::Null));
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .item(
            AllOfBuilder::new()
                .item(Ref::from_schema_name("AgentSpec"))
                .item(react),
        )
        .description(Some(
            "The agent of every task (`react`, without `plan`); the run's own agent without the plan when absent",
        ))
}

/// The deployment's caps of a plan's bounds (`api.max_plan_*`).
#[derive(Debug, Clone, Copy)]
pub struct PlanLimits {
    pub max_rounds: u32,
    pub max_tasks: u32,
    pub max_parallel: u32,
}

/// An agent's tools, with what each `kind` implies (see `validate`): an `http` tool has a
/// `url` and no `server` or `tools`; an `mcp` tool names its server once, registered
/// (`server`) or inline (`url`), and its name is at most 32 characters (it prefixes its tools').
fn tools_schema() -> ArrayBuilder {
    // (`ObjectBuilder` starts as `type: object`: `AnyValue` leaves the type out.)
    let any = || ObjectBuilder::new().schema_type(SchemaType::AnyValue);
    let null = || ObjectBuilder::new().schema_type(Type::Null);
    let kind = |k: &str| any().enum_values(Some([k]));
    let http = ObjectBuilder::new()
        .property("kind", kind("http"))
        .property("server", null())
        .property("tools", null())
        .required("url");
    let registered = ObjectBuilder::new()
        .property("server", ObjectBuilder::new().schema_type(Type::String))
        .required("server");
    let inline = ObjectBuilder::new().required("url");
    let mcp = AllOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .property("kind", kind("mcp"))
                .property("name", any().max_length(Some(32))),
        )
        .item(OneOfBuilder::new().item(registered).item(inline));
    ArrayBuilder::new()
        .items(
            AllOfBuilder::new()
                .item(Ref::from_schema_name("ToolSpec"))
                .item(OneOfBuilder::new().item(http).item(mcp)),
        )
        .description(Some(
            "At most `api.max_tools_per_agent` tools, with distinct names",
        ))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Unique within the agent; not a built-in tool (`complete`, `ask`, `expand_message`).
    #[schema(schema_with = tool_name_schema)]
    pub name: String,
    #[serde(default)]
    #[schema(pattern = "^[^\u{0}]*$")]
    pub description: String,
    /// The JSON Schema (draft 2020-12 unless `$schema` says otherwise) of the arguments object.
    #[serde(default = "empty_object_schema")]
    #[schema(value_type = super::schema::JsonObject)]
    pub parameters: serde_json::Value,
    pub kind: ToolKind,
    /// Endpoint of an `http` tool; for an `mcp` tool, the server's streamable-HTTP endpoint
    /// when it is given inline (no `server`). Absent: empty (an empty string given is refused).
    #[serde(
        default,
        deserialize_with = "non_empty",
        skip_serializing_if = "String::is_empty"
    )]
    #[schema(schema_with = tool_url_schema)]
    pub url: String,
    /// `mcp`: a server registered under `/v1/mcp-servers`, by name (instead of `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub server: Option<String>,
    /// `mcp`: which of the server's tools to offer (all of them when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = tool_picks_schema)]
    pub tools: Option<Vec<String>>,
    /// `high` calls wait for a human decision before they run.
    #[serde(default)]
    pub risk: Risk,
    /// Deadline of one call; the worker's `tool_timeout_ms` when absent.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3600000)]
    pub timeout_ms: Option<u64>,
}

fn tool_name_schema() -> Schema {
    super::schema::name_but_not(
        "^[A-Za-z0-9_-]{1,64}$",
        &BUILTIN_TOOLS,
        "Unique within the agent; not a built-in tool (`complete`, `ask`, `expand_message`)",
    )
}

fn tool_url_schema() -> ObjectBuilder {
    super::schema::tool_url(
        MAX_TOOL_URL_BYTES,
        "Absolute `http` or `https` URL with a host: no whitespace, control characters, backslashes or `user:password@`",
    )
}

/// `check_mcp`'s rule of `tools`: 1 to `MAX_MCP_TOOL_PICKS` names of 1 to 128 characters.
fn tool_picks_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .min_items(Some(1))
        .max_items(Some(MAX_MCP_TOOL_PICKS))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(128))
                .pattern(Some(super::schema::NO_NUL)),
        )
        .description(Some("`mcp`: the server's tools to offer (all when absent)"))
}

/// A string that, when given, is not empty (absent is the field's default).
fn non_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Err(serde::de::Error::custom("must not be empty when given"));
    }
    Ok(s)
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// POSTs `{run_id, tool_call_id, arguments}` to `url`.
    Http,
    /// The tools of an MCP server (streamable HTTP), offered as `<name>__<tool>`.
    Mcp,
}

/// Longest name of a registered MCP server, and most tools an `mcp` entry may pick.
pub const MAX_MCP_SERVER_NAME: usize = 64;
pub const MAX_MCP_TOOL_PICKS: usize = 64;

/// A registered MCP server's name: 1-64 characters of `[A-Za-z0-9_-]`.
pub fn check_mcp_server_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_MCP_SERVER_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err("must be 1-64 characters of [A-Za-z0-9_-]".into())
    }
}

impl ToolKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolKind::Http => "http",
            ToolKind::Mcp => "mcp",
        }
    }
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum Risk {
    #[default]
    Low,
    High,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::High => "high",
        }
    }
}

/// A validation failure that names the offending field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct AgentSpecError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> AgentSpecError {
    AgentSpecError {
        field: field.into(),
        message: message.into(),
    }
}

impl AgentSpec {
    /// Checks everything the worker will rely on, so a run never fails late for bad input.
    /// The tools' parameter schemas are only checked to be objects here: what they hold is
    /// checked per request ([`crate::tool_schema::RequestSchemas`]).
    pub fn validate(
        &self,
        model_known: impl Fn(&str) -> bool,
        max_tools: usize,
    ) -> Result<(), AgentSpecError> {
        if self.model.is_empty() {
            return Err(err("agent.model", "must not be empty"));
        }
        if !model_known(&self.model) {
            return Err(err(
                "agent.model",
                format!("unknown model `{}`", self.model),
            ));
        }
        if let Some(n) = self.max_iterations
            && !(1..=10_000).contains(&n)
        {
            return Err(err("agent.max_iterations", "must be within 1..=10000"));
        }
        if let Some(n) = self.max_tokens_total
            && n < 1
        {
            return Err(err("agent.max_tokens_total", "must be at least 1"));
        }
        if let Some(p) = &self.system_prompt
            && p.len() > 200_000
        {
            return Err(err("agent.system_prompt", "longer than 200000 bytes"));
        }
        if let Some(n) = self.max_parallel_tool_calls
            && !(1..=1024).contains(&n)
        {
            return Err(err(
                "agent.max_parallel_tool_calls",
                "must be within 1..=1024",
            ));
        }
        if self.tools.len() > max_tools {
            return Err(err("agent.tools", format!("more than {max_tools} tools")));
        }
        let mut seen = HashSet::new();
        for (i, tool) in self.tools.iter().enumerate() {
            let field = |f: &str| format!("agent.tools[{i}].{f}");
            let name_ok = !tool.name.is_empty()
                && tool.name.len() <= 64
                && tool
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(err(
                    field("name"),
                    "must be 1-64 characters of [A-Za-z0-9_-]",
                ));
            }
            if BUILTIN_TOOLS.contains(&tool.name.as_str()) {
                return Err(err(
                    field("name"),
                    format!("`{}` is a built-in tool", tool.name),
                ));
            }
            if !seen.insert(tool.name.as_str()) {
                return Err(err(
                    field("name"),
                    format!("duplicate tool `{}`", tool.name),
                ));
            }
            if !tool.parameters.is_object() {
                return Err(err(field("parameters"), "must be a JSON Schema object"));
            }
            match tool.kind {
                ToolKind::Http => {
                    check_tool_url(&tool.url).map_err(|m| err(field("url"), m))?;
                    if tool.server.is_some() || tool.tools.is_some() {
                        return Err(err(
                            field("kind"),
                            "`server` and `tools` belong to `mcp` tools",
                        ));
                    }
                }
                ToolKind::Mcp => check_mcp(tool, &field)?,
            }
            if let Some(t) = tool.timeout_ms
                && !(1..=3_600_000).contains(&t)
            {
                return Err(err(field("timeout_ms"), "must be within 1..=3600000"));
            }
        }
        Ok(())
    }

    /// The plan of a `plan_and_solve` agent (its defaults when none was given); `None` for
    /// `react`.
    pub fn planning(&self) -> Option<std::borrow::Cow<'_, PlanSpec>> {
        match self.mode {
            AgentMode::React => None,
            AgentMode::PlanAndSolve => Some(match &self.plan {
                Some(plan) => std::borrow::Cow::Borrowed(plan),
                None => std::borrow::Cow::Owned(PlanSpec::default()),
            }),
        }
    }

    /// The agent a plan's tasks run: the executor, else this agent without the plan.
    pub fn executor(&self) -> AgentSpec {
        match self.plan.as_ref().and_then(|p| p.executor.as_deref()) {
            Some(executor) => executor.clone(),
            None => AgentSpec {
                mode: AgentMode::React,
                plan: None,
                ..self.clone()
            },
        }
    }

    /// The plan's rules, after [`AgentSpec::validate`]: `mode` and `plan` agree, every bound
    /// is within 1 and the deployment's cap, and the executor is a valid `react` agent.
    pub fn validate_plan(
        &self,
        limits: PlanLimits,
        model_known: impl Fn(&str) -> bool,
        max_tools: usize,
    ) -> Result<(), AgentSpecError> {
        let Some(plan) = &self.plan else {
            return Ok(());
        };
        if self.mode == AgentMode::React {
            return Err(err("agent.plan", "only with `mode: plan_and_solve`"));
        }
        let bounded = |field: &str, n: u32, cap: u32, key: &str| {
            if (1..=cap).contains(&n) {
                Ok(())
            } else {
                Err(err(
                    format!("agent.plan.{field}"),
                    format!("must be within 1..={cap} (api.{key})"),
                ))
            }
        };
        bounded(
            "max_rounds",
            plan.max_rounds,
            limits.max_rounds,
            "max_plan_rounds",
        )?;
        bounded(
            "max_tasks",
            plan.max_tasks,
            limits.max_tasks,
            "max_plan_tasks",
        )?;
        bounded(
            "max_parallel",
            plan.max_parallel,
            limits.max_parallel,
            "max_plan_parallel",
        )?;
        for (field, prompt) in [
            ("planner_prompt", &plan.planner_prompt),
            ("summary_prompt", &plan.summary_prompt),
        ] {
            if prompt.as_ref().is_some_and(|p| p.len() > 200_000) {
                return Err(err(
                    format!("agent.plan.{field}"),
                    "longer than 200000 bytes",
                ));
            }
        }
        if let Some(executor) = &plan.executor {
            if executor.mode != AgentMode::React {
                return Err(err(
                    "agent.plan.executor.mode",
                    "an executor runs in `react` mode",
                ));
            }
            if executor.plan.is_some() {
                return Err(err("agent.plan.executor.plan", "an executor has no plan"));
            }
            executor
                .validate(model_known, max_tools)
                .map_err(|e| AgentSpecError {
                    field: e.field.replacen("agent.", "agent.plan.executor.", 1),
                    message: e.message,
                })?;
        }
        Ok(())
    }

    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// An `mcp` entry names its server once: registered (`server`) or inline (`url`). Its name
/// prefixes the offered tools (`<name>__<tool>`), so it leaves room for theirs.
fn check_mcp(tool: &ToolSpec, field: &dyn Fn(&str) -> String) -> Result<(), AgentSpecError> {
    match (&tool.server, tool.url.is_empty()) {
        (Some(_), false) => {
            return Err(err(field("url"), "give either `server` or `url`, not both"));
        }
        (None, true) => {
            return Err(err(
                field("server"),
                "an `mcp` tool names a registered `server` or an inline `url`",
            ));
        }
        (Some(name), true) => check_mcp_server_name(name).map_err(|m| err(field("server"), m))?,
        (None, false) => {
            check_tool_url(&tool.url).map_err(|m| err(field("url"), m))?;
        }
    }
    if tool.name.len() > 32 {
        return Err(err(
            field("name"),
            "an `mcp` tool's name prefixes its tools' names: at most 32 characters",
        ));
    }
    if let Some(picks) = &tool.tools {
        if picks.is_empty() || picks.len() > MAX_MCP_TOOL_PICKS {
            return Err(err(
                field("tools"),
                format!("must list 1-{MAX_MCP_TOOL_PICKS} tool names"),
            ));
        }
        if picks
            .iter()
            .any(|p| p.is_empty() || p.chars().count() > 128)
        {
            return Err(err(field("tools"), "tool names are 1-128 characters"));
        }
    }
    Ok(())
}

/// Longest accepted tool URL.
pub const MAX_TOOL_URL_BYTES: usize = 2048;

/// The syntax of an `http` tool's URL: absolute `http` or `https` with a host, written as
/// such (no whitespace or control characters, no `user:password@`, no backslashes or extra
/// slashes that a lenient parser would repair). Whether the address may be reached is a
/// separate policy.
pub fn check_tool_url(raw: &str) -> Result<url::Url, String> {
    if raw.len() > MAX_TOOL_URL_BYTES {
        return Err(format!("longer than {MAX_TOOL_URL_BYTES} bytes"));
    }
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters".into());
    }
    if raw.contains('\\') {
        return Err("must not contain backslashes".into());
    }
    let lower = raw.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    else {
        return Err("must be an http:// or https:// URL".into());
    };
    // The authority as written: up to the first `/`, `?` or `#`.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err("must name a host".into());
    }
    if authority.contains('@') {
        return Err("must not carry credentials (user:password@)".into());
    }
    let url = url::Url::parse(raw).map_err(|e| {
        match e {
            url::ParseError::EmptyHost => "must name a host",
            url::ParseError::InvalidPort => "has an invalid port",
            _ => "is not a valid URL",
        }
        .to_owned()
    })?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials (user:password@)".into());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> AgentSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn accepts_a_full_spec() {
        let s = spec(json!({
            "model": "m", "system_prompt": "be brief", "max_iterations": 5,
            "tools": [{"name": "add", "kind": "http", "url": "http://x/add", "risk": "high",
                       "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}]
        }));
        s.validate(|m| m == "m", 8).unwrap();
        assert_eq!(s.tool("add").unwrap().risk, Risk::High);
    }

    #[test]
    fn errors_name_the_field() {
        let s = spec(json!({"model": "nope"}));
        assert_eq!(
            s.validate(|m| m == "m", 8).unwrap_err().field,
            "agent.model"
        );
        let s = spec(json!({"model": "m", "tools": [
            {"name": "a", "kind": "http", "url": "http://x"},
            {"name": "a", "kind": "http", "url": "http://x"}]}));
        assert_eq!(
            s.validate(|_| true, 8).unwrap_err().field,
            "agent.tools[1].name"
        );
        let s = spec(
            json!({"model": "m", "tools": [{"name": "ask", "kind": "http", "url": "http://x"}]}),
        );
        assert_eq!(
            s.validate(|_| true, 8).unwrap_err().field,
            "agent.tools[0].name"
        );
        let s =
            spec(json!({"model": "m", "tools": [{"name": "t", "kind": "http", "url": "ftp://x"}]}));
        assert_eq!(
            s.validate(|_| true, 8).unwrap_err().field,
            "agent.tools[0].url"
        );
        // Parameters are objects; what they hold is `tool_schema::RequestSchemas`' to check.
        let s = spec(
            json!({"model": "m", "tools": [{"name": "t", "kind": "http", "url": "http://x",
            "parameters": [12]}]}),
        );
        assert_eq!(
            s.validate(|_| true, 8).unwrap_err().field,
            "agent.tools[0].parameters"
        );
        let s =
            spec(json!({"model": "m", "tools": [{"name": "t", "kind": "http", "url": "http://"}]}));
        let e = s.validate(|_| true, 8).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("agent.tools[0].url", "must name a host")
        );
        let s = spec(json!({"model": "m", "max_iterations": 0}));
        assert_eq!(
            s.validate(|_| true, 8).unwrap_err().field,
            "agent.max_iterations"
        );
    }
}

#[cfg(test)]
mod url_tests {
    use super::check_tool_url;

    #[test]
    fn tool_urls_are_absolute_http_with_a_host() {
        for ok in [
            "http://tools.example/add",
            "https://tools.example:8443/a/b?x=1#f",
            "HTTPS://Tools.Example/x",
            "http://127.0.0.1:9000/t",
            "http://[::1]:9000/t",
            "http://xn--nxasmq6b.example/",
            "http://tools.example",
        ] {
            assert!(check_tool_url(ok).is_ok(), "{ok}");
        }
        let cases = [
            ("http://", "must name a host"),
            ("https://", "must name a host"),
            ("http:///path", "must name a host"),
            ("http://?q=1", "must name a host"),
            ("http://\\\\host/x", "must not contain backslashes"),
            ("http://host/a\\b", "must not contain backslashes"),
            ("http://:80/x", "must name a host"),
            (
                "http://tools .example/",
                "must not contain spaces or control characters",
            ),
            (
                "http://tools.example/a b",
                "must not contain spaces or control characters",
            ),
            (
                " http://tools.example/",
                "must not contain spaces or control characters",
            ),
            (
                "http://tools.example/\t",
                "must not contain spaces or control characters",
            ),
            (
                "http://user:pw@tools.example/",
                "must not carry credentials (user:password@)",
            ),
            (
                "http://user@tools.example/",
                "must not carry credentials (user:password@)",
            ),
            ("ftp://tools.example/", "must be an http:// or https:// URL"),
            ("file:///etc/passwd", "must be an http:// or https:// URL"),
            ("javascript:alert(1)", "must be an http:// or https:// URL"),
            ("http:tools.example", "must be an http:// or https:// URL"),
            ("tools.example/x", "must be an http:// or https:// URL"),
            ("", "must be an http:// or https:// URL"),
            (
                "http://exa mple.com",
                "must not contain spaces or control characters",
            ),
            ("http://[::1/", "is not a valid URL"),
            ("http://host:99999/", "has an invalid port"),
            ("http://host:x/", "has an invalid port"),
            ("http://exa<mple/", "is not a valid URL"),
        ];
        for (bad, why) in cases {
            assert_eq!(check_tool_url(bad).unwrap_err(), why, "{bad}");
        }
        let long = format!("http://tools.example/{}", "a".repeat(2048));
        assert_eq!(check_tool_url(&long).unwrap_err(), "longer than 2048 bytes");
    }
}
