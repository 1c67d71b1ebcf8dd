//! Taking deliveries from `agentfleet.runs` into this worker's run slots.
//!
//! The consumer's prefetch equals the number of slots. A run's message is acked as soon as
//! its claim commits, so RabbitMQ would keep sending while the slots are busy; instead, when
//! the last slot is taken the consumer is cancelled, and deliveries already sent are returned
//! to the queue at once, so no delivery waits inside a busy worker while another is idle.
//!
//! When a slot frees up, the worker first *pulls* one message (`basic.get`) and only goes back
//! to consuming when the queue is empty. Re-consuming at once under a backlog would make the
//! broker push a whole prefetch of messages, of which all but one go straight back: at 64
//! slots that was 63 redeliveries per run, and RabbitMQ burned more CPU than the workers.

use std::sync::Arc;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use agentfleet_shared::queue::headers_of;
use agentfleet_shared::telemetry::set_parent_from;

use crate::claim::{ClaimOutcome, claim};
use crate::run;
use crate::shared::Shared;
use crate::stop::StopSignal;

pub struct Intake {
    pub shared: Arc<Shared>,
    pub slots: Arc<Semaphore>,
    pub freed: Arc<Notify>,
    pub tracker: TaskTracker,
    pub draining: CancellationToken,
}

impl Intake {
    /// Consumes until `stop`; returns with the consumer cancelled.
    pub async fn run(&self, channel: &Channel, stop: CancellationToken) -> anyhow::Result<()> {
        let concurrency = self.shared.settings.worker.concurrency;
        channel
            .basic_qos(concurrency, BasicQosOptions::default())
            .await?;
        let queue = self.shared.publisher.topology().queue.clone();
        let mut consumer: Option<Consumer> = None;
        loop {
            if consumer.is_none()
                && let Ok(permit) = self.slots.clone().try_acquire_owned()
            {
                if stop.is_cancelled() {
                    return Ok(());
                }
                let pulled = channel
                    .basic_get(queue.as_str().into(), BasicGetOptions::default())
                    .await?;
                if let Some(message) = pulled {
                    self.start(message.delivery, permit);
                    continue;
                }
                drop(permit);
                consumer = Some(
                    channel
                        .basic_consume(
                            queue.as_str().into(),
                            "".into(),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await?,
                );
            }
            let delivery = tokio::select! {
                _ = stop.cancelled() => {
                    if let Some(c) = consumer.take() { self.pause(channel, c).await; }
                    return Ok(());
                }
                _ = self.freed.notified(), if consumer.is_none() => continue,
                d = next(&mut consumer) => d,
            };
            let delivery = match delivery {
                Some(Ok(d)) => d,
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the consumer was closed by the broker"),
            };
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                // Sent before we paused: give it back for another worker.
                let _ = delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await;
                continue;
            };
            if self.slots.available_permits() == 0
                && let Some(c) = consumer.take()
            {
                self.pause(channel, c).await;
            }
            self.start(delivery, permit);
        }
    }

    /// Claims and executes the run of `delivery` in the slot `permit`.
    fn start(&self, delivery: Delivery, permit: tokio::sync::OwnedSemaphorePermit) {
        let shared = self.shared.clone();
        let freed = self.freed.clone();
        let draining = self.draining.clone();
        let span = tracing::info_span!(
            "run",
            run_id = tracing::field::Empty,
            attempt = tracing::field::Empty
        );
        set_parent_from(&span, &headers_of(&delivery.properties));
        self.tracker.spawn(
            async move {
                match claim(&shared, &delivery).await {
                    Ok(ClaimOutcome::Claimed(claimed)) => {
                        let run_id = claimed.run.id;
                        tracing::Span::current().record("run_id", tracing::field::display(run_id));
                        tracing::Span::current().record("attempt", claimed.run.attempt);
                        let stop = StopSignal::default();
                        shared.active.insert(run_id, stop.clone());
                        metrics::gauge!("agentfleet_runs_in_flight").increment(1.0);
                        run::execute(shared.clone(), *claimed, stop, draining).await;
                        metrics::gauge!("agentfleet_runs_in_flight").decrement(1.0);
                        shared.active.remove(run_id);
                    }
                    Ok(ClaimOutcome::Skipped) => {}
                    Err(e) => {
                        tracing::warn!(error = %agentfleet_shared::report::one_line(&e), "claim failed; message returned to the queue");
                        // Postgres is probably down: don't spin on redeliveries.
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        let _ = delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await;
                    }
                }
                drop(permit);
                freed.notify_one();
            }
            .instrument(span),
        );
    }

    /// Cancels the consumer and returns whatever it had already been sent.
    async fn pause(&self, channel: &Channel, consumer: Consumer) {
        let tag = consumer.tag();
        if let Err(e) = channel
            .basic_cancel(tag, BasicCancelOptions::default())
            .await
        {
            tracing::warn!(error = %e, "could not cancel the consumer");
        }
        tokio::spawn(async move {
            let mut consumer = consumer;
            while let Ok(Some(Ok(d))) =
                tokio::time::timeout(std::time::Duration::from_millis(500), consumer.next()).await
            {
                let _ = d
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await;
            }
        });
    }
}

async fn next(consumer: &mut Option<Consumer>) -> Option<lapin::Result<lapin::message::Delivery>> {
    match consumer {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}
