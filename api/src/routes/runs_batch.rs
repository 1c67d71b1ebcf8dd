//! `POST /v1/runs/batch`: many runs in one request, for teams that submit thousands. The batch
//! is all or nothing: every run is validated first (errors name `runs[i].field`), then all are
//! committed in one transaction, then announced and published with bounded concurrency.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use agentfleet_shared::store::StoreError;
use agentfleet_shared::store::transitions::{self, NewRun};

use crate::auth::Caller;
use crate::error::{ApiError, JsonBody};
use crate::routes::runs_create::{CreateRun, announce, validate};
use crate::routes::view;
use crate::state::AppState;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    pub runs: Vec<CreateRun>,
}

#[utoipa::path(post, path = "/v1/runs/batch", tag = "runs", operation_id = "create_batch", request_body = CreateBatch,
    responses((status = 202, description = "The runs, queued, in request order", body = view::BatchCreated),
              (status = 404, description = "A run's `thread_id` names no thread of this tenant (`runs[i].thread_id`)", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`thread_busy`: a run's thread has an active run", body = crate::routes::view::ErrorBody),
              (status = 422, description = "`invalid_request` naming the field as `runs[i].field`; nothing was created", body = crate::routes::view::ErrorBody)))]
pub async fn create_batch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    JsonBody(body): JsonBody<CreateBatch>,
) -> Result<(StatusCode, Json<view::BatchCreated>), ApiError> {
    let max = state.settings.api.max_batch_runs;
    if body.runs.is_empty() || body.runs.len() > max {
        return Err(ApiError::invalid(
            "runs",
            format!("must hold 1 to {max} runs"),
        ));
    }
    for (i, run) in body.runs.iter().enumerate() {
        validate(&state, run, &format!("runs[{i}]."))?;
    }
    let mut tx = state.pool.begin().await.map_err(ApiError::unexpected)?;
    let mut created = Vec::with_capacity(body.runs.len());
    for (i, run) in body.runs.into_iter().enumerate() {
        let hash = Sha256::digest(serde_json::to_vec(&run).expect("serializes")).to_vec();
        let new = NewRun {
            id: Uuid::now_v7(),
            tenant_id: caller.tenant_id,
            thread_id: run.thread_id,
            max_iterations: run
                .agent
                .max_iterations
                .unwrap_or(state.settings.worker.default_max_iterations),
            metadata: run.metadata.unwrap_or_else(|| json!({})),
            idempotency_key: None,
            request_hash: Some(hash),
            input: run.input,
            agent: run.agent,
        };
        match transitions::create(&mut tx, new).await {
            Ok(row) => created.push(row),
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
    tx.commit().await.map_err(ApiError::unexpected)?;
    metrics::counter!("agentfleet_runs_created_total").increment(created.len() as u64);
    futures_util::stream::iter(created.iter())
        .for_each_concurrent(32, |run| announce(&state, run))
        .await;
    let runs = created.iter().map(view::run).collect();
    Ok((StatusCode::ACCEPTED, Json(view::BatchCreated { runs })))
}
