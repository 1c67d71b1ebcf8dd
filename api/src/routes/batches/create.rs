//! `POST /v1/batches`: up to `api.max_batch_items` runs, answered at once. Every item is
//! validated (errors name `runs[i].field`), then the batch row and its items are written in
//! one statement and the answer is 202; the runs are created afterwards, in chunks, by
//! `crate::batch_driver` (a crash mid-way is finished by whichever replica takes the lease
//! over). An `Idempotency-Key` makes a retried submission answer the batch it made before.

use std::collections::HashSet;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use agentfleet_shared::domain::AgentSpec;
use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::batches::{self, BatchRow, Counts, NewBatch, NewItem};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::routes::runs::create::{CreateRun, RunFields, compile_schemas, validate};
use crate::routes::view;
use crate::state::AppState;
use agentfleet_shared::tool_schema::RequestSchemas;

/// Longest `custom_id`, in characters.
pub const MAX_CUSTOM_ID_CHARS: usize = 128;
/// Longest `Idempotency-Key` of a batch, in characters.
pub const MAX_KEY_CHARS: usize = 200;

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBatch {
    /// The runs, each the body of `POST /v1/runs` plus its `custom_id` (at most
    /// `api.max_batch_items`).
    #[schema(schema_with = batch_items)]
    pub runs: Vec<BatchItem>,
    /// Free-form; at most `api.max_metadata_bytes` bytes as JSON.
    #[serde(default)]
    #[schema(value_type = Option<agentfleet_shared::domain::schema::JsonObject>)]
    pub metadata: Option<Value>,
}

/// One run of a batch: the body of `POST /v1/runs` and the caller's name for it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// Unique within the batch, 1 to 128 characters; the results name the item by it.
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\u{0}]*$")]
    pub custom_id: String,
    /// The user message: not blank, no NUL, at most `api.max_input_bytes` bytes of UTF-8.
    #[schema(schema_with = crate::schema::user_text)]
    pub input: String,
    #[serde(default)]
    pub thread_id: Option<Uuid>,
    pub agent: AgentSpec,
    /// Free-form; at most `api.max_metadata_bytes` bytes as JSON.
    #[serde(default)]
    #[schema(value_type = Option<agentfleet_shared::domain::schema::JsonObject>)]
    pub metadata: Option<Value>,
}

/// At least one item, all distinct (their `custom_id`s are: the document says so in words).
fn batch_items() -> utoipa::openapi::schema::ArrayBuilder {
    crate::schema::non_empty_list(utoipa::openapi::schema::Ref::from_schema_name("BatchItem"))
        .unique_items(true)
        .description(Some(
            "The runs, each the body of `POST /v1/runs` plus its `custom_id` (distinct); at most `api.max_batch_items`",
        ))
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitBatchError {
    #[error("{0}")]
    Invalid(ApiError),
    #[error("Idempotency-Key was used with a different request")]
    IdempotencyMismatch,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<SubmitBatchError> for ApiError {
    fn from(e: SubmitBatchError) -> ApiError {
        match e {
            SubmitBatchError::Invalid(api) => api,
            SubmitBatchError::IdempotencyMismatch => ApiError::new(
                StatusCode::CONFLICT,
                "idempotency_key_reused",
                "Idempotency-Key was already used with a different request body",
            ),
            SubmitBatchError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

impl From<StoreError> for SubmitBatchError {
    fn from(e: StoreError) -> Self {
        SubmitBatchError::Unexpected(e.into())
    }
}

#[utoipa::path(post, path = "/v1/batches", tag = "batches", operation_id = "submit_batch", request_body = SubmitBatch,
    params(("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 200, pattern = "^[!-~]([\t -~]{0,198}[!-~])?$", description = "Repeat-safe submission: the same key with the same body answers the same batch (200), never a second one")),
    responses((status = 202, description = "The batch, accepted; its runs are created in the background", body = view::Batch),
              (status = 200, description = "The batch this `Idempotency-Key` made before (same body); nothing new was created", body = view::Batch),
              (status = 404, description = "A run's `thread_id` names no thread of this tenant (`runs[i].thread_id`), or a tool's `server` no MCP server it registered (`runs[i].agent.tools[j].server`)", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`idempotency_key_reused`: the key names a batch made from another body", body = crate::routes::view::ErrorBody),
              (status = 413, description = "`payload_too_large`: the body is over `api.max_batch_body_bytes`", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming the field as `runs[i].field`, or `runs` when the batch holds more than `api.max_batch_items` (or the tenant's `max_batch_size`); nothing was created", body = crate::routes::view::ErrorBody),
              (status = 429, description = "`rate_limited` (with `Retry-After`), `too_many_active_runs`: the batch would take the tenant past its `max_active_runs`, or `too_many_large_requests`: the tenant already has `api.max_large_bodies_per_tenant` bodies over `api.max_body_bytes` in flight on this API process; nothing was created", body = crate::routes::view::ErrorBody)))]
pub async fn submit_batch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody<SubmitBatch>,
) -> Result<(StatusCode, Json<view::Batch>), ApiError> {
    crate::suspension::require_active(&caller)?;
    let key = idempotency_key(&headers)?;
    let hash = Sha256::digest(serde_json::to_vec(&body).expect("serializes")).to_vec();
    if let Some(k) = &key
        && let Some(existing) = batches::by_idempotency_key(&state.pool, caller.tenant_id, k)
            .await
            .map_err(ApiError::unexpected)?
    {
        return replay(&state, existing, &hash).await;
    }
    let max = crate::quota::max_batch_runs(
        &crate::quota::limits_of(&state, &caller),
        state.settings.api.max_batch_items,
    );
    crate::quota::check_batch_len(body.runs.len(), max)?;
    let mut schemas = RequestSchemas::new(
        state.settings.api.schema_limits(),
        "the batch's distinct tool schemas together",
    );
    let metadata = check(&state, &body, &mut schemas)?;
    compile_schemas(&state, schemas).await?;
    check_threads(&state, caller.tenant_id, &body.runs).await?;
    crate::routes::runs::create::check_servers(
        &state,
        caller.tenant_id,
        body.runs
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("runs[{i}]."), &r.agent)),
    )
    .await?;
    crate::quota::check_active_runs(&state, &caller, body.runs.len()).await?;
    let owner = crate::batch_driver::new_owner();
    let new = NewBatch {
        id: Uuid::now_v7(),
        tenant_id: caller.tenant_id,
        status: "creating",
        metadata,
        idempotency_key: key.clone(),
        request_hash: Some(hash.clone()),
        fair: crate::fair_dispatch::is_fair(&state.settings, &caller),
        lease: Some((owner.clone(), state.settings.api.batch_lease_ms)),
        traceparent: agentfleet_shared::telemetry::current_traceparent(),
    };
    let items: Vec<NewItem> = body
        .runs
        .into_iter()
        .map(|item| NewItem {
            custom_id: item.custom_id,
            body: Some(
                serde_json::to_value(CreateRun {
                    input: item.input,
                    thread_id: item.thread_id,
                    agent: item.agent,
                    metadata: item.metadata,
                    if_busy: None,
                })
                .expect("serializes"),
            ),
            run_id: None,
        })
        .collect();
    let written = insert(&state, &caller, &new, &items).await?;
    let Some(row) = written else {
        // Another submission with this key committed first.
        let k = key.as_deref().unwrap_or_default();
        let existing = batches::by_idempotency_key(&state.pool, caller.tenant_id, k)
            .await
            .map_err(ApiError::unexpected)?
            .ok_or_else(|| {
                ApiError::unexpected(anyhow::anyhow!("batch key conflict without a row"))
            })?;
        return replay(&state, existing, &hash).await;
    };
    metrics::counter!("agentfleet_batches_created_total").increment(1);
    crate::batch_driver::spawn(state.clone(), row.id, owner);
    let counts = Counts {
        pending: i64::from(row.total),
        ..Counts::default()
    };
    Ok((StatusCode::ACCEPTED, Json(view::batch(&row, &counts))))
}

/// Writes the batch and its items; for a tenant with `max_active_runs`, only when they fit
/// (each pending item counts as a run), checked under the tenant's creation lock in the same
/// statement.
async fn insert(
    state: &AppState,
    caller: &agentfleet_shared::store::tenants::Principal,
    new: &NewBatch,
    items: &[NewItem],
) -> Result<Option<BatchRow>, ApiError> {
    let written = match crate::quota::active_runs_limit(state, caller) {
        None => batches::insert(&state.pool, new, items).await,
        Some(max) => batches::insert_within_limit(&state.pool, new, items, max).await,
    };
    written.map_err(crate::quota::refusal)
}

/// The answer to a submission whose key made a batch before: that batch when the body is the
/// same, else 409.
async fn replay(
    state: &AppState,
    existing: BatchRow,
    hash: &[u8],
) -> Result<(StatusCode, Json<view::Batch>), ApiError> {
    if existing.request_hash.as_deref() != Some(hash) {
        return Err(SubmitBatchError::IdempotencyMismatch.into());
    }
    let view = crate::routes::batches::get::view_of(state, existing).await?;
    Ok((StatusCode::OK, Json(view)))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.chars().count() <= MAX_KEY_CHARS)
        .map(|s| Some(s.to_owned()))
        .ok_or_else(|| {
            ApiError::invalid(
                "Idempotency-Key",
                format!("must be 1-{MAX_KEY_CHARS} visible characters"),
            )
        })
}

/// Every item as `POST /v1/runs` checks it (its tool schemas into `schemas`), `custom_id`s
/// unique; the batch's metadata.
fn check<'a>(
    state: &AppState,
    body: &'a SubmitBatch,
    schemas: &mut RequestSchemas<'a>,
) -> Result<Value, ApiError> {
    let mut seen = HashSet::with_capacity(body.runs.len());
    for (i, item) in body.runs.iter().enumerate() {
        let field = format!("runs[{i}].custom_id");
        let chars = item.custom_id.chars().count();
        if chars == 0 || chars > MAX_CUSTOM_ID_CHARS {
            return Err(ApiError::invalid(
                &field,
                format!("must be 1 to {MAX_CUSTOM_ID_CHARS} characters"),
            ));
        }
        if item.custom_id.contains('\0') {
            return Err(ApiError::invalid(&field, "must not contain NUL characters"));
        }
        if !seen.insert(item.custom_id.as_str()) {
            return Err(ApiError::invalid(
                &field,
                format!(
                    "`{}` is used by an earlier run of this batch",
                    item.custom_id
                ),
            ));
        }
        let run = RunFields {
            input: &item.input,
            agent: &item.agent,
            metadata: item.metadata.as_ref(),
        };
        validate(state, run, &format!("runs[{i}]."), schemas)?;
    }
    match &body.metadata {
        None => Ok(json!({})),
        Some(meta) if !meta.is_object() => Err(ApiError::invalid("metadata", "must be an object")),
        Some(meta) if meta.to_string().len() > state.settings.api.max_metadata_bytes => {
            Err(ApiError::invalid(
                "metadata",
                format!(
                    "larger than {} bytes",
                    state.settings.api.max_metadata_bytes
                ),
            ))
        }
        Some(meta) => Ok(meta.clone()),
    }
}

/// Every named thread is the tenant's (404 naming the first that is not), checked now so that
/// a typo is refused rather than becoming a failed item later. A thread that is busy when its
/// item's chunk comes makes that item fail (`thread_busy`), not the batch.
async fn check_threads(state: &AppState, tenant: Uuid, runs: &[BatchItem]) -> Result<(), ApiError> {
    let named: Vec<Uuid> = runs.iter().filter_map(|r| r.thread_id).collect();
    if named.is_empty() {
        return Ok(());
    }
    let found = batches::owned_threads(&state.pool, tenant, &named)
        .await
        .map_err(ApiError::unexpected)?;
    let found: HashSet<Uuid> = found.into_iter().collect();
    for (i, run) in runs.iter().enumerate() {
        if let Some(t) = run.thread_id
            && !found.contains(&t)
        {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("runs[{i}].thread_id: thread not found"),
            ));
        }
    }
    Ok(())
}
