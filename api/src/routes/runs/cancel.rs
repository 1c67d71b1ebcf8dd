//! `POST /v1/runs/{id}/cancel`. Postgres records the cancel at once whatever the status; the
//! owner, if any, is hinted on the control channel and stops within a second. Repeating the
//! call on a cancelled run answers 200 again and changes nothing. Cancelling a plan-and-solve
//! run cancels its unfinished tasks in the same transaction.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use agentfleet_shared::domain::RunStatus;
use agentfleet_shared::store::double_text;
use agentfleet_shared::store::transitions::{self, Cancelled};
use agentfleet_shared::store::{StoreError, runs};

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("run not found")]
    NotFound,
    #[error("run is already {0}")]
    AlreadyFinal(String),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<CancelError> for ApiError {
    fn from(e: CancelError) -> ApiError {
        match e {
            CancelError::NotFound => ApiError::not_found("run"),
            CancelError::AlreadyFinal(status) => ApiError::new(
                StatusCode::CONFLICT,
                "run_finished",
                format!("run is already {status}; it cannot be cancelled"),
            ),
            CancelError::Unexpected(e) => ApiError::unexpected(e),
        }
    }
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs", operation_id = "cancel_run", params(("id" = uuid::Uuid, Path, description = "The run")),
    responses((status = 200, description = "The run, cancelled (repeating is harmless)", body = view::Run),
              (status = 404, description = "No run of this tenant has that id", body = crate::routes::view::ErrorBody),
              (status = 409, description = "`run_finished`: already completed or failed", body = crate::routes::view::ErrorBody)))]
pub async fn cancel_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::Run>, ApiError> {
    let outcome = match transitions::cancel(&state.pool, caller.tenant_id, id).await {
        Ok(o) => o,
        Err(StoreError::NotFound) => return Err(CancelError::NotFound.into()),
        Err(StoreError::WrongStatus { status, .. }) => {
            return Err(CancelError::AlreadyFinal(status).into());
        }
        Err(e) => return Err(CancelError::Unexpected(e.into()).into()),
    };
    if let Cancelled::Now {
        previous,
        thread_id,
        last_event_id,
        tasks,
        ..
    } = outcome
    {
        crate::announce::cancelled(&state, id, thread_id, previous, None, last_event_id).await;
        // A planner's tasks were cancelled with it: each stream ends and each holder stops.
        futures_util::future::join_all(tasks.iter().map(|t| {
            crate::announce::cancelled(&state, t.id, t.thread_id, t.previous, None, t.last_event_id)
        }))
        .await;
        if previous != RunStatus::WaitingForThread {
            publish_promoted(&state, thread_id).await;
        }
    }
    let run = runs::get_for_tenant(&state.pool, caller.tenant_id, id)
        .await
        .map_err(ApiError::unexpected)?;
    if run.fair {
        // Its slot of the tenant's running limit is free: the next held run goes.
        crate::fair_dispatch::dispatch_and_publish(&state, run.tenant_id).await;
    }
    Ok(Json(view::run(&run)))
}

/// The cancel ended the thread's active run: the run waiting next for the thread (if any) was
/// promoted in the same transaction; publish it (the sweeper re-publishes it if this fails).
async fn publish_promoted(state: &AppState, thread_id: uuid::Uuid) {
    let promoted = match state.pool.acquire().await {
        Ok(mut conn) => double_text::runnable_on_thread(&mut conn, thread_id).await,
        Err(e) => Err(e.into()),
    };
    match promoted {
        Ok(Some(id)) => crate::fair_dispatch::publish(state, &[id]).await,
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(%thread_id, error = %e, "promoted run not looked up; the sweeper will publish it");
        }
    }
}
