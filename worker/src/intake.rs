//! Taking deliveries from `agentfleet.runs` into this worker's run slots.
//!
//! A run's message stays unacknowledged while the run holds its slot (`claim` does not ack a
//! claimed run; the slot's task does when it lets go), so the consumer's prefetch, equal to
//! the number of slots, is all it takes to keep deliveries to free slots: the broker pushes a
//! message exactly when a slot frees, with no `basic.get` round trip per run.
//!
//! A holding longer than `worker.max_delivery_hold_ms` acknowledges early (RabbitMQ closes a
//! channel whose delivery stays unacknowledged past its `consumer_timeout`), and slots still
//! busy with a delivery of a lost connection are not counted by the new one. Either way the
//! broker may push one delivery more than there are free slots: it goes back to the queue and
//! the consumer pauses; it consumes again when a slot frees, with the prefetch set to the free
//! slots plus the deliveries this channel still holds.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::Acker;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::claim::{
    ClaimOutcome, Settle, attempt_span, claim, claim_retry_wait, earlier_deliveries,
};
use crate::deps::Deps;
use crate::quarantine::{self, Quarantine};
use crate::run;
use crate::stop::StopSignal;

pub struct Intake {
    pub deps: Arc<Deps>,
    pub slots: Arc<Semaphore>,
    pub freed: Arc<Notify>,
    pub tracker: TaskTracker,
    pub draining: CancellationToken,
    pub unacked: Arc<Unacked>,
    pub quarantine: Arc<Quarantine>,
}

/// The deliveries of the current channel that busy slots hold unacknowledged: what the
/// broker counts against the prefetch.
#[derive(Default)]
pub struct Unacked(Mutex<(u64, u16)>);

impl Unacked {
    /// A new channel: nothing of it is held yet. Returns nothing; slots of older channels
    /// still running are simply not counted.
    fn new_channel(&self) {
        let mut g = self.0.lock().expect("unacked lock");
        *g = (g.0 + 1, 0);
    }

    /// A slot took a delivery of the current channel; returns that channel's number.
    fn taken(&self) -> u64 {
        let mut g = self.0.lock().expect("unacked lock");
        g.1 += 1;
        g.0
    }

    /// The slot acknowledged its delivery (or its channel is gone).
    fn let_go(&self, channel: u64) {
        let mut g = self.0.lock().expect("unacked lock");
        if g.0 == channel {
            g.1 = g.1.saturating_sub(1);
        }
    }

    fn count(&self) -> u16 {
        self.0.lock().expect("unacked lock").1
    }
}

impl Intake {
    /// Consumes until `stop`; returns with the consumer cancelled.
    pub async fn run(&self, channel: &Channel, stop: CancellationToken) -> anyhow::Result<()> {
        self.unacked.new_channel();
        let queue = self.deps.publisher.topology().queue.clone();
        let mut consumer: Option<Consumer> = None;
        loop {
            if consumer.is_none() && self.slots.available_permits() > 0 {
                if stop.is_cancelled() {
                    return Ok(());
                }
                // Applies to consumers started after it.
                let free = u16::try_from(self.slots.available_permits()).unwrap_or(u16::MAX);
                let prefetch = free.saturating_add(self.unacked.count());
                let start = async {
                    channel
                        .basic_qos(prefetch, BasicQosOptions::default())
                        .await?;
                    channel
                        .basic_consume(
                            queue.as_str().into(),
                            "".into(),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                };
                // A broker that stops answering (an alarm, a stalled node) must hold neither
                // this session, which then reconnects, nor a drain asked for meanwhile.
                let limit = self.deps.settings.amqp.timeout();
                consumer = Some(tokio::select! {
                    started = tokio::time::timeout(limit, start) => started.map_err(|_| {
                        anyhow::anyhow!("RabbitMQ did not answer the consumer's start within amqp.timeout_ms")
                    })??,
                    _ = stop.cancelled() => return Ok(()),
                });
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
                // Only after an early ack or a reconnection: give it back for another worker,
                // and pause until a slot frees so that it is not pushed straight back here.
                let _ = delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await;
                if let Some(c) = consumer.take() {
                    self.pause(channel, c).await;
                }
                continue;
            };
            self.start(delivery, permit);
        }
    }

    /// Claims and executes the run of `delivery` in the slot `permit`; acknowledges the
    /// delivery when the slot is let go (or after `worker.max_delivery_hold_ms`).
    fn start(&self, delivery: Delivery, permit: tokio::sync::OwnedSemaphorePermit) {
        let deps = self.deps.clone();
        let freed = self.freed.clone();
        let draining = self.draining.clone();
        let unacked = self.unacked.clone();
        let quarantine = self.quarantine.clone();
        let slots = self.slots.clone();
        let channel = unacked.taken();
        self.tracker.spawn(async move {
            // What the delivery still needs once the slot is free (`None`: acked early).
            let settle = match claim(&deps, &delivery).await {
                Ok(ClaimOutcome::Claimed { claimed, alone }) => {
                    let run_id = claimed.run.id;
                    let span = attempt_span(&deps, &claimed, &delivery);
                    let stop = StopSignal::default();
                    deps.active.insert(run_id, stop.clone());
                    metrics::gauge!("agentfleet_runs_in_flight").increment(1.0);
                    let hold = Duration::from_millis(deps.settings.worker.max_delivery_hold_ms);
                    // Boxed: the run's future is the largest of the worker (about 18 KB);
                    // inline, this task would hold it more than once and every move of the
                    // task (its spawn) would copy it. Boxed as a combinator, not an `async`
                    // block: a block awaiting a future it captured keeps room for it twice
                    // (the capture and the future awaited), 34.5 KB a run (heaptrack, bench
                    // load).
                    let run = {
                        let deps = deps.clone();
                        async move {
                            if alone {
                                quarantine::run_alone(deps, *claimed, stop, quarantine, slots)
                                    .await;
                            } else {
                                let handback = quarantine.handback();
                                run::execute(deps, *claimed, stop, handback).await;
                            }
                        }
                    };
                    let execute = Box::pin(
                        AssertUnwindSafe(run.instrument(span))
                            .catch_unwind()
                            .map(move |caught| {
                                // A panic ends this run's attempt, not the slot's bookkeeping
                                // below: the run's lease lapses (its heartbeat is dropped with
                                // it) and the sweeper hands the run to another attempt, counted
                                // as a recovery.
                                if caught.is_err() {
                                    metrics::counter!("agentfleet_run_panics_total").increment(1);
                                    tracing::error!(%run_id, "the run's task panicked; its lease will lapse and the run be recovered");
                                }
                            }),
                    );
                    let early = || async {
                        settle_delivery(&delivery.acker, Settle::Ack).await;
                        unacked.let_go(channel);
                    };
                    let acked = hold_delivery(execute, early, hold).await;
                    metrics::gauge!("agentfleet_runs_in_flight").decrement(1.0);
                    deps.active.remove(run_id);
                    (!acked).then_some(Settle::Ack)
                }
                Ok(ClaimOutcome::Skipped(how)) => Some(how),
                Err(e) => {
                    // Postgres down, or this run's row locked elsewhere: the message goes back
                    // for any worker, after a wait that grows with its earlier deliveries.
                    let earlier = earlier_deliveries(&delivery.properties);
                    let cap = Duration::from_millis(deps.settings.worker.claim_retry_max_ms);
                    let wait = claim_retry_wait(earlier, cap);
                    metrics::counter!("agentfleet_claim_failures_total").increment(1);
                    tracing::warn!(error = %agentfleet_shared::report::one_line(&e),
                        earlier_deliveries = earlier, wait_ms = wait.as_millis() as u64,
                        "claim failed; message returned to the queue after the wait");
                    // A drain does not wait for it: the message goes back at once.
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = draining.cancelled() => {}
                    }
                    Some(Settle::Requeue)
                }
            };
            // The slot is free before the delivery is settled: the broker pushes the next
            // delivery as soon as the ack lands, and it must find the slot free. Acking first
            // raced with that push (the delivery arrived before this task dropped its permit,
            // was given back and the consumer paused: three round trips and a redelivery).
            if settle.is_some() {
                unacked.let_go(channel);
            }
            drop(permit);
            freed.notify_one();
            if let Some(how) = settle {
                settle_delivery(&delivery.acker, how).await;
            }
        });
    }

    /// Cancels the consumer and returns whatever it had already been sent.
    async fn pause(&self, channel: &Channel, consumer: Consumer) {
        let tag = consumer.tag();
        // Bounded: a broker that stopped answering must not hold the drain (the messages it
        // holds for this consumer go back to the queue when the connection closes).
        let timeout = self.deps.settings.amqp.timeout();
        match tokio::time::timeout(
            timeout,
            channel.basic_cancel(tag, BasicCancelOptions::default()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not cancel the consumer"),
            Err(_) => tracing::warn!(
                timeout_ms = timeout.as_millis() as u64,
                "the broker did not answer the consumer's cancel in time"
            ),
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

/// Drives `execute` to its end; acknowledges the delivery early (`early`) if that takes longer
/// than `hold`. Returns whether it did (else the caller acks once the slot is free).
async fn hold_delivery<F: Future<Output = ()>>(
    execute: impl Future<Output = ()>,
    early: impl FnOnce() -> F,
    hold: Duration,
) -> bool {
    tokio::pin!(execute);
    tokio::select! {
        () = &mut execute => false,
        () = tokio::time::sleep(hold) => {
            early().await;
            execute.await;
            true
        }
    }
}

/// A failed ack or nack needs no action: the channel is gone, the broker requeues the
/// message, and its claim finds the run no longer runnable by then (or takes it over once its
/// lease ends).
async fn settle_delivery(acker: &Acker, how: Settle) {
    let sent = match how {
        Settle::Ack => acker.ack(BasicAckOptions::default()).await,
        // A nack, not a reject: from RabbitMQ 4.3 a reject counts towards a quorum queue's
        // delivery limit (20 by default from 4.0), and a claim failing through a database
        // outage must not dead-letter the runs it could not start sooner than it must. The
        // next claim's wait grows with `x-acquired-count` there (`claim::earlier_deliveries`).
        Settle::Requeue | Settle::DeadLetter => {
            let requeue = how == Settle::Requeue;
            acker
                .nack(BasicNackOptions {
                    requeue,
                    ..Default::default()
                })
                .await
        }
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, ?how, "could not settle a run's delivery");
    }
}

async fn next(consumer: &mut Option<Consumer>) -> Option<lapin::Result<lapin::message::Delivery>> {
    match consumer {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}
