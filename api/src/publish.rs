//! Publishing committed runs to RabbitMQ from a request: bounded, so a stalled broker cannot
//! hold the request, and never failing it (the runs are durable; the sweeper re-publishes a
//! queued run whose message went missing).

use uuid::Uuid;

use crate::state::AppState;

/// The longest a request waits for its publishes' confirms.
pub const PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Publishes runs already committed as one burst whose confirms are awaited together, within
/// [`PUBLISH_TIMEOUT`]. Failures are logged, not returned.
pub async fn publish_bounded(state: &AppState, ids: &[Uuid]) {
    match tokio::time::timeout(PUBLISH_TIMEOUT, state.publisher.publish_runs(ids)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(run_ids = ?e.failed, error = %e, "publish failed; the sweeper will re-enqueue");
        }
        Err(_) => {
            tracing::warn!(
                runs = ids.len(),
                "publish timed out; the sweeper will re-enqueue"
            );
        }
    }
}
