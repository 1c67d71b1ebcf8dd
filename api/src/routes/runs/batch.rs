//! `POST /v1/runs/batch`: many runs in one request, for teams that submit thousands. The batch
//! is all or nothing: every run is validated first (errors name `runs[i].field`), then all are
//! committed at once (the runs on new threads as one multi-row statement, see
//! `store::create_many`, with a batch handle so `/v1/batches/{id}` serves them too), then
//! announced in bulk: one Redis round trip for every
//! `run_queued`, one burst of publishes whose confirms are awaited together.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use agentfleet_shared::store::batches::{self, NewBatch, NewItem};
use agentfleet_shared::store::runs::RunRow;
use agentfleet_shared::store::transitions::{self, NewRun};
use agentfleet_shared::store::{StoreError, create_many};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::routes::runs::create::{CreateRun, compile_schemas, validate};
use crate::routes::view;
use crate::state::AppState;
use agentfleet_shared::store::double_text::IfBusy;
use agentfleet_shared::tool_schema::RequestSchemas;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    /// At least one run, at most the tenant's `max_batch_size` (and `api.max_batch_runs`);
    /// `if_busy` is `reject` here (a batch is all or nothing).
    #[schema(schema_with = batch_runs)]
    pub runs: Vec<CreateRun>,
}

/// Each run a `POST /v1/runs` body whose `if_busy`, if any, is `reject`.
fn batch_runs() -> utoipa::openapi::schema::ArrayBuilder {
    use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Ref, SchemaType};
    let any = || ObjectBuilder::new().schema_type(SchemaType::AnyValue);
    let reject = any().enum_values(Some([Some("reject"), None]));
    crate::schema::non_empty_list(Ref::from_schema_name("CreateRun")).items(
        AllOfBuilder::new()
            .item(Ref::from_schema_name("CreateRun"))
            .item(ObjectBuilder::new().property("if_busy", reject)),
    )
    .description(Some(
        "At least one run, at most the tenant's `max_batch_size` (and `api.max_batch_runs`); `if_busy` is `reject` here",
    ))
}

#[utoipa::path(post, path = "/v1/runs/batch", tag = "runs", operation_id = "create_batch", request_body = CreateBatch,
    responses((status = 202, description = "The runs, queued, in request order", body = view::BatchCreated),
              (status = 404, description = "A run's `thread_id` names no thread of this tenant (`runs[i].thread_id`), or a tool's `server` no MCP server it registered (`runs[i].agent.tools[j].server`)", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`thread_busy`: a run's thread has an active run", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming the field as `runs[i].field`, or `runs` when the batch holds more than the tenant's `max_batch_size` (or `api.max_batch_runs`); nothing was created", body = crate::routes::view::ErrorBody),
              (status = 429, description = "`rate_limited` (with `Retry-After`), or `too_many_active_runs`: the batch would take the tenant past its `max_active_runs`; nothing was created", body = crate::routes::view::ErrorBody)))]
pub async fn create_batch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    JsonBody(body): JsonBody<CreateBatch>,
) -> Result<(StatusCode, Json<view::BatchCreated>), ApiError> {
    crate::suspension::require_active(&caller)?;
    crate::quota::check_batch_size(&state, &caller, body.runs.len())?;
    crate::quota::check_active_runs(&state, &caller, body.runs.len()).await?;
    let mut schemas = RequestSchemas::new(
        state.settings.api.schema_limits(),
        "the batch's distinct tool schemas together",
    );
    for (i, run) in body.runs.iter().enumerate() {
        validate(&state, run.fields(), &format!("runs[{i}]."), &mut schemas)?;
        // A batch is all or nothing at once; waiting behind a busy thread is not (yet).
        if !matches!(run.if_busy, None | Some(IfBusy::Reject)) {
            return Err(ApiError::invalid(
                &format!("runs[{i}].if_busy"),
                "only `reject` is supported in a batch; submit the run on its own to enqueue or interrupt",
            ));
        }
    }
    compile_schemas(&state, schemas).await?;
    crate::routes::runs::create::check_servers(
        &state,
        caller.tenant_id,
        body.runs
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("runs[{i}]."), &r.agent)),
    )
    .await?;
    let fair = crate::fair_dispatch::is_fair(&state.settings, &caller);
    let mut on_threads = Vec::new();
    let mut on_new_threads = Vec::with_capacity(body.runs.len());
    // Every run of the request joins the request's trace.
    let traceparent = agentfleet_shared::telemetry::current_traceparent();
    for (i, run) in body.runs.into_iter().enumerate() {
        let new = NewRun {
            id: Uuid::now_v7(),
            tenant_id: caller.tenant_id,
            thread_id: run.thread_id,
            max_iterations: run
                .agent
                .max_iterations
                .unwrap_or(state.settings.worker.default_max_iterations),
            metadata: run.metadata.unwrap_or_else(|| json!({})),
            // No run of a batch request has a key of its own, so nothing compares a hash.
            idempotency_key: None,
            request_hash: None,
            input: run.input,
            agent: run.agent,
            fair,
            share: state.settings.fair_share.share(),
            traceparent: traceparent.clone(),
        };
        if new.thread_id.is_some() {
            on_threads.push((i, new));
        } else {
            on_new_threads.push((i, new));
        }
    }
    let limit = crate::quota::active_runs_limit(&state, &caller);
    let (batch_id, created) = commit(
        &state,
        caller.tenant_id,
        fair,
        limit,
        on_threads,
        on_new_threads,
    )
    .await?;
    metrics::counter!("agentfleet_runs_created_total").increment(created.len() as u64);
    crate::announce::announce_all(&state, &created, fair).await;
    let runs = created.iter().map(view::run).collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(view::BatchCreated { batch_id, runs }),
    ))
}

/// Commits every run and the batch handle (`batches`, status `in_progress`, one item per run
/// with its index as `custom_id`), all or nothing, and returns the batch id and the runs in
/// request order (`i` is a run's index in the request). Runs on existing threads go first, one
/// by one through `transitions::create` (each locks its thread and checks it has no active
/// run, so the first refusal is the lowest such index, as before); the runs on new threads are
/// then one statement, and the handle one more. `limit`: the tenant's `max_active_runs`,
/// reserved first in the same transaction.
async fn commit(
    state: &AppState,
    tenant: Uuid,
    fair: bool,
    limit: Option<u32>,
    on_threads: Vec<(usize, NewRun)>,
    on_new_threads: Vec<(usize, NewRun)>,
) -> Result<(Uuid, Vec<RunRow>), ApiError> {
    let batch_id = Uuid::now_v7();
    let (new_at, new_runs): (Vec<usize>, Vec<NewRun>) = on_new_threads.into_iter().unzip();
    let mut created: Vec<(usize, RunRow)> = Vec::with_capacity(new_runs.len() + on_threads.len());
    let mut tx = state.pool.begin().await.map_err(ApiError::unexpected)?;
    if let Some(max) = limit {
        let runs = new_runs.len() + on_threads.len();
        crate::quota::reserve(&mut tx, tenant, max, runs).await?;
    }
    let mut adopted = Vec::with_capacity(on_threads.len());
    for (i, new) in on_threads {
        match transitions::create(&mut tx, new).await {
            Ok(row) => {
                adopted.push(row.id);
                created.push((i, row));
            }
            Err(StoreError::NotFound) => {
                // As for a single run: 404, naming the run.
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("runs[{i}].thread_id: thread not found"),
                ));
            }
            Err(StoreError::ThreadBusy { thread_id, run_id }) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "thread_busy",
                    format!("runs[{i}]: thread {thread_id} already has an active run {run_id}"),
                ));
            }
            Err(e) => return Err(ApiError::unexpected(e)),
        }
    }
    if !adopted.is_empty() {
        batches::adopt_runs(&mut tx, batch_id, &adopted)
            .await
            .map_err(ApiError::unexpected)?;
    }
    let rows = create_many::create_on_new_threads_in(&mut *tx, &new_runs, Some(batch_id))
        .await
        .map_err(ApiError::unexpected)?;
    created.extend(new_at.into_iter().zip(rows));
    created.sort_unstable_by_key(|(i, _)| *i);
    let handle = NewBatch {
        id: batch_id,
        tenant_id: tenant,
        status: "in_progress",
        metadata: json!({}),
        idempotency_key: None,
        request_hash: None,
        fair,
        lease: None,
        // Its runs carry the request's context themselves; nothing is made later.
        traceparent: None,
    };
    let items: Vec<NewItem> = created
        .iter()
        .map(|(i, row)| NewItem {
            custom_id: i.to_string(),
            body: None,
            run_id: Some(row.id),
        })
        .collect();
    batches::insert(&mut *tx, &handle, &items)
        .await
        .map_err(ApiError::unexpected)?;
    tx.commit().await.map_err(ApiError::unexpected)?;
    Ok((batch_id, created.into_iter().map(|(_, row)| row).collect()))
}
