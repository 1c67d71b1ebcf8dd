//! Claiming a delivered run: one conditional UPDATE. A claimed run's delivery is acknowledged
//! by its slot's task when the slot is let go (`intake`), so the prefetch counts busy slots. A
//! claim that matches no row means the message is stale or a duplicate (acknowledged). A
//! run taken over more than `worker.max_recoveries` times after its worker vanished goes to
//! quarantine (`quarantine`: it runs alone in its worker); one that was alone in quarantine
//! when its worker vanished is poison: it is failed and its message dead-lettered.

use std::sync::Arc;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::message::Delivery;
use serde_json::json;

use agentfleet_shared::events::{EventType, Expiry, Floor, NewEvent, worker_fence};
use agentfleet_shared::queue::{RunMessage, headers_of};
use agentfleet_shared::store::runs;
use agentfleet_shared::store::transitions::{self, Claimed};
use agentfleet_shared::telemetry;

use crate::deps::Deps;

pub enum ClaimOutcome {
    Claimed {
        claimed: Box<Claimed>,
        /// Taken over more than `worker.max_recoveries` times: it must run alone in this
        /// worker (`quarantine`).
        alone: bool,
    },
    /// Nothing to run: the delivery is to be settled as said, once its slot is free.
    Skipped(Settle),
}

/// What a delivery's slot sends the broker once it has let go of the slot (`intake`): the
/// broker pushes the next delivery as soon as this lands, and it must find the slot free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Ack,
    /// Back to the queue, for any worker (the claim failed).
    Requeue,
    /// To the dead-letter queue (a malformed message, a poison run).
    DeadLetter,
}

pub async fn claim(deps: &Arc<Deps>, delivery: &Delivery) -> anyhow::Result<ClaimOutcome> {
    let Ok(message) = serde_json::from_slice::<RunMessage>(&delivery.data) else {
        tracing::warn!("malformed run message dead-lettered");
        return Ok(ClaimOutcome::Skipped(Settle::DeadLetter));
    };
    let claimed = deps.writes.claims.write(message.run_id).await?;
    let Some(claimed) = claimed else {
        metrics::counter!("agentfleet_stale_messages_total").increment(1);
        return Ok(ClaimOutcome::Skipped(Settle::Ack));
    };
    if claimed.took_over {
        metrics::counter!("agentfleet_lease_expiries_total").increment(1);
    }
    if claimed.crashed_alone {
        let fence = claimed.fence();
        // The list may be gone (expired, or Redis restarted): ids continue past the last one
        // recorded, and the id of `run_failed` is recorded too, with the same message.
        let listed = deps.bus.len(fence.run_id).await.unwrap_or(0);
        let floor = (claimed.run.last_event_id as u64).max(listed);
        let message = Box::pin(transitions::fail_poisoned(
            &deps.pool,
            fence,
            claimed.run.recoveries,
            floor + 1,
        ))
        .await?;
        let data = json!({"code": "poison_run", "message": message});
        let event = NewEvent {
            run_id: fence.run_id,
            thread_id: claimed.run.thread_id,
            kind: EventType::RunFailed,
            data: &data,
        };
        let appended = deps
            .bus
            .append(
                event,
                worker_fence(fence.attempt),
                Floor::Recorded(floor),
                Expiry::Expire,
            )
            .await;
        if let Ok(appended) = appended {
            let _ = Box::pin(runs::record_last_event_id(
                &deps.pool,
                fence.run_id,
                appended.id,
            ))
            .await;
        }
        metrics::counter!("agentfleet_runs_total", "status" => "failed").increment(1);
        metrics::counter!("agentfleet_poison_runs_total").increment(1);
        tracing::error!(run_id = %fence.run_id, recoveries = claimed.run.recoveries,
            "poison run: its worker died while it ran alone in quarantine; failed and dead-lettered");
        return Ok(ClaimOutcome::Skipped(Settle::DeadLetter));
    }
    if claimed.recovered {
        metrics::counter!("agentfleet_recoveries_total").increment(1);
    }
    let alone = claimed.run.recoveries > deps.settings.worker.max_recoveries;
    Ok(ClaimOutcome::Claimed {
        claimed: Box::new(claimed),
        alone,
    })
}

/// How long a slot waits before it gives back a delivery whose claim failed (Postgres down,
/// the run's row locked elsewhere past `database.lock_timeout_ms`): 500 ms, doubled for each
/// earlier delivery of the same message ([`earlier_deliveries`]), at most `cap`
/// (`worker.claim_retry_max_ms`).
/// The message keeps coming back for as long as the cause lasts — the run is `queued` and must
/// start once it can — but each message is tried at most once per `cap` by then, and every
/// failure is counted (`agentfleet_claim_failures_total`).
pub fn claim_retry_wait(earlier_deliveries: u64, cap: Duration) -> Duration {
    const FIRST: Duration = Duration::from_millis(500);
    // 2^16 × 500 ms is past any sensible cap; the shift stays in range.
    let factor = 1u32 << earlier_deliveries.min(16);
    FIRST.saturating_mul(factor).min(cap)
}

/// How many times this message was delivered before: the larger of the quorum queue's
/// `x-delivery-count` (returns; up to RabbitMQ 4.2 every return, from 4.3 only rejects and
/// lost connections) and `x-acquired-count` (4.3 on: every delivery to a consumer). A failed
/// claim gives its message back with a nack, which counts in the first up to 4.2 and in the
/// second from 4.3; 0 when neither header is there (a first delivery, a queue that does not
/// count).
pub fn earlier_deliveries(properties: &BasicProperties) -> u64 {
    use lapin::types::AMQPValue;
    let Some(headers) = properties.headers() else {
        return 0;
    };
    headers
        .inner()
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "x-delivery-count" | "x-acquired-count"))
        .map(|(_, v)| match v {
            AMQPValue::ShortShortInt(n) => i64::from(*n),
            AMQPValue::ShortShortUInt(n) => i64::from(*n),
            AMQPValue::ShortInt(n) => i64::from(*n),
            AMQPValue::ShortUInt(n) => i64::from(*n),
            AMQPValue::LongInt(n) => i64::from(*n),
            AMQPValue::LongUInt(n) => i64::from(*n),
            AMQPValue::LongLongInt(n) => *n,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
        .max(0) as u64
}

/// The span of one attempt (one holding of the run by this worker). Its parent is the run's
/// stored trace context (`runs.traceparent`, the creating request), so every attempt of a run
/// is in one trace however its message came: published at creation, after a resume, by the
/// sweeper, or handed back. When the message carried another context (a resume request's, a
/// hand-back's), the span links to it. A run without a stored context (created with export
/// off) follows its message's context, if any.
pub fn attempt_span(deps: &Deps, claimed: &Claimed, delivery: &Delivery) -> tracing::Span {
    let span = tracing::info_span!(
        "run.attempt",
        run_id = %claimed.run.id,
        attempt = claimed.run.attempt,
        worker = %deps.worker_id,
        recovered = claimed.recovered,
    );
    if !telemetry::exporting() {
        return span;
    }
    let delivered = telemetry::remote_context(&headers_of(&delivery.properties));
    let stored = claimed
        .run
        .traceparent
        .as_deref()
        .and_then(telemetry::remote_context_of);
    match (stored, delivered) {
        (Some(stored), delivered) => {
            if let Some(delivered) =
                delivered.filter(|d| telemetry::ids_of(d) != telemetry::ids_of(&stored))
            {
                telemetry::add_link(&span, &delivered);
            }
            telemetry::set_parent(&span, stored);
        }
        (None, Some(delivered)) => telemetry::set_parent(&span, delivered),
        (None, None) => {}
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_claim_waits_longer_each_delivery_up_to_the_cap() {
        let cap = Duration::from_secs(10);
        let waits: Vec<u64> = (0..7)
            .map(|n| claim_retry_wait(n, cap).as_millis() as u64)
            .collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 10000, 10000]);
        // A count no queue would reach neither overflows nor passes the cap.
        assert_eq!(claim_retry_wait(u64::MAX, cap), cap);
        // A cap below the first wait is the wait.
        let short = Duration::from_millis(200);
        assert_eq!(claim_retry_wait(0, short), short);
    }

    #[test]
    fn earlier_deliveries_take_the_larger_count_of_either_broker_version() {
        use lapin::types::{AMQPValue, FieldTable, ShortString};
        let with = |headers: &[(&str, AMQPValue)]| {
            let mut table = FieldTable::default();
            for (k, v) in headers {
                table.insert(ShortString::from(*k), v.clone());
            }
            BasicProperties::default().with_headers(table)
        };
        assert_eq!(earlier_deliveries(&BasicProperties::default()), 0);
        // RabbitMQ up to 4.2 (and 3.x, as the broker of the tests sends it).
        assert_eq!(
            earlier_deliveries(&with(&[("x-delivery-count", AMQPValue::LongLongInt(3))])),
            3
        );
        // 4.3 on: a nack leaves the delivery count, the acquired count grows.
        assert_eq!(
            earlier_deliveries(&with(&[
                ("x-delivery-count", AMQPValue::LongLongInt(0)),
                ("x-acquired-count", AMQPValue::LongInt(5)),
            ])),
            5
        );
        // Neither a negative nor a foreign type counts.
        assert_eq!(
            earlier_deliveries(&with(&[
                ("x-delivery-count", AMQPValue::LongLongInt(-2)),
                ("x-acquired-count", AMQPValue::LongString("7".into())),
            ])),
            0
        );
    }
}
