//! `POST /v1/runs`: validate, commit thread + user message + run in one transaction, publish
//! with confirms, answer 202. A run committed but not yet published is still durable: the
//! sweeper publishes queued runs whose message went missing.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use agentfleet_shared::domain::{AgentSpec, AgentSpecError, RunStatus, ToolKind};
use agentfleet_shared::events::{EventType, Expiry, Floor, NewEvent};
use agentfleet_shared::store::create_many::LimitedRun;
use agentfleet_shared::store::double_text::{self, IfBusy};
use agentfleet_shared::store::runs::RunRow;
use agentfleet_shared::store::transitions::{self, NewRun};
use agentfleet_shared::store::{StoreError, active_runs, mcp_servers, runs};
use agentfleet_shared::tool_schema::{RequestSchemas, SchemaError};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::routes::view;
use crate::state::AppState;
use crate::validate;

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The user message: not blank, no NUL, at most `api.max_input_bytes` bytes of UTF-8.
    #[schema(schema_with = crate::schema::user_text)]
    pub input: String,
    /// Continue this thread; a new thread is made when absent.
    #[serde(default)]
    pub thread_id: Option<Uuid>,
    pub agent: AgentSpec,
    /// Free-form; at most `api.max_metadata_bytes` bytes as JSON.
    #[serde(default)]
    #[schema(value_type = Option<agentfleet_shared::domain::schema::JsonObject>)]
    pub metadata: Option<Value>,
    /// What to do when the thread has an active run: `reject` (409 `thread_busy`),
    /// `enqueue` (start when it ends) or `interrupt` (cancel it at its next safe point, then
    /// start). On a thread that is not busy, every value just starts the run.
    #[serde(default, skip_serializing_if = "is_reject")]
    pub if_busy: Option<IfBusy>,
}

/// Absent and `reject` hash alike, so an Idempotency-Key repeated with `reject` spelled out
/// or left out names the same request.
fn is_reject(v: &Option<IfBusy>) -> bool {
    matches!(v, None | Some(IfBusy::Reject))
}

#[derive(Debug, thiserror::Error)]
pub enum CreateRunError {
    #[error("{0}")]
    Invalid(ApiError),
    #[error("thread not found")]
    ThreadNotFound,
    #[error("thread {thread_id} already has an active run {run_id}")]
    ThreadBusy { thread_id: Uuid, run_id: Uuid },
    #[error("thread {thread_id} already has {limit} runs waiting")]
    ThreadQueueFull { thread_id: Uuid, limit: i64 },
    #[error("Idempotency-Key was used with a different request")]
    IdempotencyMismatch,
    #[error("{active} active runs and {new_runs} more would pass the limit of {max}")]
    TooManyActiveRuns {
        max: u32,
        active: i64,
        new_runs: usize,
    },
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl From<CreateRunError> for ApiError {
    fn from(e: CreateRunError) -> ApiError {
        match e {
            CreateRunError::Invalid(api) => api,
            CreateRunError::ThreadNotFound => ApiError::not_found("thread"),
            CreateRunError::ThreadBusy { thread_id, run_id } => ApiError::new(
                StatusCode::CONFLICT,
                "thread_busy",
                format!("thread {thread_id} already has an active run {run_id}"),
            ),
            CreateRunError::ThreadQueueFull { thread_id, limit } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "thread_queue_full",
                format!(
                    "thread {thread_id} already has {limit} runs waiting (api.max_queued_per_thread); \
                     retry when one has started"
                ),
            ),
            // The request is valid in itself; it conflicts with the run its key already names.
            CreateRunError::IdempotencyMismatch => ApiError::new(
                StatusCode::CONFLICT,
                "idempotency_key_reused",
                "Idempotency-Key was already used with a different request body",
            ),
            CreateRunError::TooManyActiveRuns {
                max,
                active,
                new_runs,
            } => crate::quota::too_many_active_runs(max, active, new_runs),
            CreateRunError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(post, path = "/v1/runs", tag = "runs", operation_id = "create_run", request_body = CreateRun,
    params(("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255, pattern = "^[!-~]([\t -~]{0,253}[!-~])?$", description = "Repeat-safe submission: the same key with the same body answers the same run")),
    responses((status = 202, description = "The run, queued", body = view::Run),
              (status = 404, description = "`thread_id` names no thread of this tenant, or `agent.tools[i].server` no MCP server it registered", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`thread_busy`: the thread has an active run; or `idempotency_key_reused`: the key names a run made from another body", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming the field (`if_busy` must be `reject`, `enqueue` or `interrupt`)", body = crate::routes::view::ErrorBody),
              (status = 429, description = "`thread_queue_full`: `api.max_queued_per_thread` runs already wait for the thread; `rate_limited` (with `Retry-After`), or `too_many_active_runs`: the tenant's `max_active_runs` is reached; nothing was created", body = crate::routes::view::ErrorBody)))]
pub async fn create_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateRun>,
) -> Result<(StatusCode, Json<view::Run>), ApiError> {
    crate::suspension::require_active(&caller)?;
    let key = idempotency_key(&headers)?;
    let fair = crate::fair_dispatch::is_fair(&state.settings, &caller);
    let limit = crate::quota::active_runs_limit(&state, &caller);
    // Boxed: `submit`'s future is ~17.6 KB (sqlx's), and every layer of the router moved the
    // handler's future holding it (memcpy was 15 % of the API's instructions in callgrind).
    let run = Box::pin(submit(&state, caller.tenant_id, fair, limit, body, key)).await?;
    Ok((StatusCode::ACCEPTED, Json(view::run(&run))))
}

pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => {
            let s = v
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.len() <= 255);
            s.map(|s| Some(s.to_owned())).ok_or_else(|| {
                ApiError::invalid("Idempotency-Key", "must be 1-255 visible characters")
            })
        }
    }
}

/// What [`validate`] reads of a run request (the single and batch endpoints' bodies differ).
pub struct RunFields<'a> {
    pub input: &'a str,
    pub agent: &'a AgentSpec,
    pub metadata: Option<&'a Value>,
}

impl CreateRun {
    pub fn fields(&self) -> RunFields<'_> {
        RunFields {
            input: &self.input,
            agent: &self.agent,
            metadata: self.metadata.as_ref(),
        }
    }
}

/// Validates one run request against the configured limits; errors name the field. Its
/// tools' parameter schemas go into `schemas`, which the caller compiles once every run of
/// the request is validated ([`compile_schemas`]).
pub fn validate<'a>(
    state: &AppState,
    run: RunFields<'a>,
    field_prefix: &str,
    schemas: &mut RequestSchemas<'a>,
) -> Result<(), ApiError> {
    let api = &state.settings.api;
    let f = |name: &str| format!("{field_prefix}{name}");
    validate::user_text(&f("input"), run.input, api.max_input_bytes)?;
    if let Some(meta) = run.metadata {
        if !meta.is_object() {
            return Err(ApiError::invalid(&f("metadata"), "must be an object"));
        }
        if meta.to_string().len() > api.max_metadata_bytes {
            return Err(ApiError::invalid(
                &f("metadata"),
                format!("larger than {} bytes", api.max_metadata_bytes),
            ));
        }
    }
    run.agent
        .validate(
            |m| state.settings.models.contains_key(m),
            api.max_tools_per_agent,
        )
        .map_err(|AgentSpecError { field, message }| ApiError::invalid(&f(&field), message))?;
    let limits = agentfleet_shared::domain::PlanLimits {
        max_rounds: api.max_plan_rounds,
        max_tasks: api.max_plan_tasks,
        max_parallel: api.max_plan_parallel,
    };
    run.agent
        .validate_plan(
            limits,
            |m| state.settings.models.contains_key(m),
            api.max_tools_per_agent,
        )
        .map_err(|AgentSpecError { field, message }| ApiError::invalid(&f(&field), message))?;
    let executor = run
        .agent
        .plan
        .as_ref()
        .and_then(|p| p.executor.as_deref())
        .map(|e| ("agent.plan.executor.", e));
    for (prefix, agent) in std::iter::once(("agent.", run.agent)).chain(executor) {
        if agent
            .max_tokens_total
            .is_some_and(|n| n > api.max_tokens_total)
        {
            return Err(ApiError::invalid(
                &f(&format!("{prefix}max_tokens_total")),
                format!(
                    "must be at most {} (api.max_tokens_total)",
                    api.max_tokens_total
                ),
            ));
        }
        let egress = state.settings.egress_policy();
        for (i, tool) in agent.tools.iter().enumerate() {
            if egress.refuses_literal(&tool.url) {
                return Err(ApiError::invalid(
                    &f(&format!("{prefix}tools[{i}].url")),
                    "this address is not allowed by the deployment's egress policy",
                ));
            }
            schemas.add(
                f(&format!("{prefix}tools[{i}].parameters")),
                &tool.parameters,
            );
        }
    }
    Ok(())
}

/// Checks and compiles the request's distinct tool schemas that this process has not accepted
/// before (off the runtime's threads when they hold patterns, `api.max_schema_compiles`
/// requests at once); a schema refused is a 422 naming where it was given.
pub async fn compile_schemas(
    state: &AppState,
    schemas: RequestSchemas<'_>,
) -> Result<(), ApiError> {
    schemas
        .compile(&state.schema_compiles, &state.schema_verdicts)
        .await
        .map_err(|SchemaError { field, message }| {
            if field.is_empty() {
                ApiError::unexpected(anyhow::anyhow!(message))
            } else {
                ApiError::invalid(&field, message)
            }
        })
}

/// Every MCP server the runs' tools name (`kind: mcp` with `server`; a plan's executor's
/// included) must be registered by the tenant: else 404 naming `<prefix>agent.tools[j].server`
/// (as for an unknown `thread_id`),
/// before anything is written. One
/// query for all the runs, none when no tool names a server. (A server deleted later fails the
/// runs that name it when they list their tools: docs/tools.md.)
pub async fn check_servers<'a>(
    state: &AppState,
    tenant: Uuid,
    runs: impl Iterator<Item = (String, &'a AgentSpec)> + Clone,
) -> Result<(), ApiError> {
    let named = |runs: &mut dyn Iterator<Item = (String, &'a AgentSpec)>| {
        runs.flat_map(|(prefix, agent)| {
            // A plan's executor names its servers too.
            let executor = agent.plan.as_ref().and_then(|p| p.executor.as_deref());
            let agents = std::iter::once((format!("{prefix}agent."), agent))
                .chain(executor.map(|e| (format!("{prefix}agent.plan.executor."), e)));
            agents.flat_map(|(base, agent)| {
                agent.tools.iter().enumerate().filter_map(move |(j, t)| {
                    (t.kind == ToolKind::Mcp)
                        .then_some(t.server.as_ref())
                        .flatten()
                        .map(|name| (format!("{base}tools[{j}].server"), name.clone()))
                })
            })
        })
        .collect::<Vec<_>>()
    };
    let wanted = named(&mut runs.clone());
    if wanted.is_empty() {
        return Ok(());
    }
    let mut names: Vec<String> = wanted.iter().map(|(_, n)| n.clone()).collect();
    names.sort_unstable();
    names.dedup();
    let found = mcp_servers::registered(&state.pool, tenant, &names)
        .await
        .map_err(ApiError::unexpected)?;
    match wanted.iter().find(|(_, n)| !found.contains(n)) {
        Some((field, name)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{field}: no MCP server named `{name}` is registered (POST /v1/mcp-servers)"),
        )),
        None => Ok(()),
    }
}

/// Validates, commits and publishes one run. `limit`: the tenant's `max_active_runs`, reserved
/// in the run's transaction.
pub async fn submit(
    state: &AppState,
    tenant: Uuid,
    fair: bool,
    limit: Option<u32>,
    body: CreateRun,
    key: Option<String>,
) -> Result<RunRow, CreateRunError> {
    let mut schemas = RequestSchemas::new(
        state.settings.api.schema_limits(),
        "the agent's tool schemas together",
    );
    validate(state, body.fields(), "", &mut schemas).map_err(CreateRunError::Invalid)?;
    compile_schemas(state, schemas)
        .await
        .map_err(CreateRunError::Invalid)?;
    check_servers(state, tenant, std::iter::once((String::new(), &body.agent)))
        .await
        .map_err(CreateRunError::Invalid)?;
    // Only a repeated Idempotency-Key compares requests: without one the hash (a second
    // serialisation of the body) would be written and never read.
    let hash = key
        .is_some()
        .then(|| Sha256::digest(serde_json::to_vec(&body).expect("serializes")).to_vec());
    if let Some(k) = &key
        && let Some(existing) = runs::by_idempotency_key(&state.pool, tenant, k)
            .await
            .map_err(anyhow::Error::from)?
    {
        return same_request(existing, hash.as_deref());
    }
    let max_iterations = body
        .agent
        .max_iterations
        .unwrap_or(state.settings.worker.default_max_iterations);
    let if_busy = body.if_busy.unwrap_or_default();
    let new = NewRun {
        id: Uuid::now_v7(),
        tenant_id: tenant,
        thread_id: body.thread_id,
        max_iterations,
        metadata: body.metadata.unwrap_or_else(|| json!({})),
        idempotency_key: key.clone(),
        request_hash: hash.clone(),
        input: body.input,
        agent: body.agent,
        fair,
        share: state.settings.fair_share.share(),
        traceparent: agentfleet_shared::telemetry::current_traceparent(),
    };
    let created = if new.thread_id.is_none() {
        match limit {
            // Grouped with other creations arriving at once (one transaction, one commit),
            // within the tenant's `max_active_runs`.
            _ if new.idempotency_key.is_none() => state
                .creates
                .write(LimitedRun {
                    run: new,
                    max_active: limit,
                })
                .await
                .and_then(|created| created),
            Some(max) => create_reserved(state, new, max).await,
            None => transitions::create_on_new_thread(&state.pool, new).await,
        }
    } else {
        create_on_thread(state, new, if_busy, limit).await
    };
    let run = match created {
        Ok(run) => run,
        Err(StoreError::NotFound) => return Err(CreateRunError::ThreadNotFound),
        Err(StoreError::ThreadBusy { thread_id, run_id }) => {
            return Err(CreateRunError::ThreadBusy { thread_id, run_id });
        }
        Err(StoreError::ThreadQueueFull { thread_id, limit }) => {
            return Err(CreateRunError::ThreadQueueFull { thread_id, limit });
        }
        Err(StoreError::TooManyActiveRuns {
            max,
            active,
            new_runs,
        }) => {
            return Err(CreateRunError::TooManyActiveRuns {
                max,
                active,
                new_runs,
            });
        }
        Err(StoreError::Db(e)) if key.is_some() && is_idempotency_race(&e) => {
            let k = key.as_deref().expect("checked");
            let existing = runs::by_idempotency_key(&state.pool, tenant, k)
                .await
                .map_err(anyhow::Error::from)?
                .ok_or_else(|| anyhow::anyhow!("idempotency conflict without a row"))?;
            return same_request(existing, hash.as_deref());
        }
        Err(e) => return Err(CreateRunError::Unexpected(e.into())),
    };
    agentfleet_shared::failpoint::hit("api_after_commit");
    metrics::counter!("agentfleet_runs_created_total").increment(1);
    announce(state, &run, fair).await;
    Ok(run)
}

/// A run on a new thread of a tenant with `max_active_runs`: reserved under the tenant's
/// creation lock, and inserted, in one transaction.
async fn create_reserved(state: &AppState, new: NewRun, max: u32) -> Result<RunRow, StoreError> {
    let mut tx = state.pool.begin().await?;
    active_runs::reserve(&mut tx, new.tenant_id, max, 1).await?;
    let run = transitions::create_on_new_thread(&mut *tx, new).await?;
    tx.commit().await?;
    Ok(run)
}

/// A run on an existing thread: the thread row is locked first (see `transitions::create`).
/// With `if_busy = enqueue | interrupt`, a creation that lost the race with a concurrent
/// promotion (the unique index refused it) tries again and waits behind the promoted run.
/// `limit`: the tenant's `max_active_runs`, reserved first.
async fn create_on_thread(
    state: &AppState,
    new: NewRun,
    if_busy: IfBusy,
    limit: Option<u32>,
) -> Result<RunRow, StoreError> {
    const ATTEMPTS: usize = 3;
    let max_waiting = state.settings.api.max_queued_per_thread;
    let mut new = new;
    for attempt in 1.. {
        let mut tx = state.pool.begin().await?;
        if let Some(max) = limit {
            active_runs::reserve(&mut tx, new.tenant_id, max, 1).await?;
        }
        match double_text::create(&mut tx, new.clone(), if_busy, max_waiting).await {
            Ok(created) => {
                tx.commit().await?;
                after_double_text(state, &created).await;
                return Ok(created.run);
            }
            Err(e)
                if if_busy != IfBusy::Reject
                    && attempt < ATTEMPTS
                    && double_text::lost_race(&e) =>
            {
                drop(tx);
                new.id = Uuid::now_v7();
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// After a double-text committed: the run it cancelled at once gets its final event, the
/// running run it interrupts is hinted, and a run its cancel promoted is published.
async fn after_double_text(state: &AppState, created: &double_text::Created) {
    let thread_id = created.run.thread_id;
    if let Some((id, previous, last_event_id)) = created.cancelled {
        // Cancelled by this newer message: its error says so (`double_text::create`).
        let error = double_text::interrupted_error();
        crate::announce::cancelled(state, id, thread_id, previous, Some(&error), last_event_id)
            .await;
    }
    if let Some(id) = created.interrupting
        && let Err(e) = state.bus.send_control(id, "interrupt").await
    {
        tracing::warn!(run_id = %id, error = %e, "could not hint the worker to interrupt");
    }
    if let Some(id) = created.promoted {
        crate::fair_dispatch::publish(state, &[id]).await;
    }
    if created.run.fair && (created.cancelled.is_some() || created.promoted.is_some()) {
        // A slot of the tenant's running limit may be free, and a promoted run is held.
        crate::fair_dispatch::dispatch_and_publish(state, created.run.tenant_id).await;
    }
}

fn same_request(existing: RunRow, hash: Option<&[u8]>) -> Result<RunRow, CreateRunError> {
    if hash.is_some() && existing.request_hash.as_deref() == hash {
        Ok(existing)
    } else {
        Err(CreateRunError::IdempotencyMismatch)
    }
}

fn is_idempotency_race(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.constraint() == Some("runs_idempotency"))
}

/// Appends the run's `run_queued` event, then publishes its message (in that order, so
/// `run_queued` is always event 1). The run is already durable, so a failure here is logged,
/// not returned: the sweeper re-publishes queued runs it finds idle. The publish is bounded
/// so a stalled broker cannot hold the request. A held run (its tenant has a running limit)
/// is not published: its tenant's runs are dispatched in turn instead (`crate::fair_dispatch`).
pub async fn announce(state: &AppState, run: &RunRow, limited: bool) {
    let data = crate::announce::queued_data();
    let event = NewEvent {
        run_id: run.id,
        thread_id: run.thread_id,
        kind: EventType::RunQueued,
        data: &data,
    };
    if let Err(e) = state
        .bus
        .append(event, 0, Floor::Exact(0), Expiry::Persist)
        .await
    {
        tracing::warn!(run_id = %run.id, error = %e, "could not append run_queued");
    }
    if run.status == RunStatus::WaitingForThread {
        // Published when promoted (the end of its thread's active run).
        return;
    }
    if run.held {
        // Held by its tenant's running limit: a slot may be free (the limit is exact, counted
        // under the tenant's lock). Held by the fair share: the window was full when the insert
        // counted, and the runs in flight dispatch it as they end (the sweeper, after a race).
        if limited {
            crate::fair_dispatch::dispatch_and_publish(state, run.tenant_id).await;
        }
        return;
    }
    // Bounded by the publisher's `amqp.timeout_ms`: a stalled broker cannot hold the request.
    if let Err(e) = state.publisher.publish_run(run.id).await {
        tracing::warn!(run_id = %run.id, error = %e, "publish failed; the sweeper will re-enqueue");
    }
}
