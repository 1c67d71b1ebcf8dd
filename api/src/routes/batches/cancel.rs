//! `POST /v1/batches/{id}/cancel`: no further run of the batch is created, and its runs not yet
//! ended are cancelled as `POST /v1/runs/{id}/cancel` would (same events, same hint to the
//! worker). The answer comes once the batch is marked `cancelling`; the runs are cancelled
//! right after, in chunks, by `crate::batch_driver` (and by whichever replica takes the lease
//! over if this one dies). Repeating it is harmless.

use axum::Json;
use axum::extract::State;

use agentfleet_shared::store::batches;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::PathId;
use crate::routes::view;
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/batches/{id}/cancel", tag = "batches", operation_id = "cancel_batch",
    params(("id" = uuid::Uuid, Path, description = "The batch")),
    responses((status = 200, description = "The batch, `cancelling` (its runs are being cancelled) or already finished; repeating is harmless", body = view::Batch),
              (status = 404, description = "No batch of this tenant has that id", body = crate::routes::view::ErrorBody)))]
pub async fn cancel_batch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathId(id): PathId,
) -> Result<Json<view::Batch>, ApiError> {
    // 404 before anything is written.
    let row = crate::routes::batches::get::load(&state, caller.tenant_id, id).await?;
    let owner = crate::batch_driver::new_owner();
    let lease = state.settings.api.batch_lease_ms;
    let row = match batches::start_cancel(&state.pool, caller.tenant_id, id, &owner, lease)
        .await
        .map_err(ApiError::unexpected)?
    {
        Some(cancelling) => {
            metrics::counter!("agentfleet_batches_cancelled_total").increment(1);
            crate::batch_driver::spawn(state.clone(), id, owner);
            cancelling
        }
        // Cancelled or finished already (perhaps just now): answered as it is.
        None => crate::routes::batches::get::load(&state, caller.tenant_id, row.id).await?,
    };
    Ok(Json(
        crate::routes::batches::get::view_of(&state, row).await?,
    ))
}
