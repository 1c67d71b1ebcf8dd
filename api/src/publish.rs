//! Publishing committed runs to RabbitMQ from a request: bounded, so a stalled broker cannot
//! hold the request, and never failing it (the runs are durable; the sweeper re-publishes a
//! queued run whose message went missing).

use uuid::Uuid;

use crate::state::AppState;

/// Publishes runs already committed as one burst whose confirms are awaited together, within
/// the publisher's `amqp.timeout_ms`. Failures are logged, not returned.
pub async fn publish_bounded(state: &AppState, ids: &[Uuid]) {
    if let Err(e) = state.publisher.publish_runs(ids).await {
        tracing::warn!(run_ids = ?e.failed, error = %e, "publish failed; the sweeper will re-enqueue");
    }
}
