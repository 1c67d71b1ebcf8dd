//! RabbitMQ topology and the run-message publisher.
//!
//! A message only says "run R has work to do" and carries trace context; Postgres holds the
//! state. Topology: a durable direct exchange `{prefix}.runs`, a durable quorum queue
//! `{prefix}.runs` bound to it, and a dead-letter exchange and queue `{prefix}.runs.dead`.

use std::collections::HashMap;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct Topology {
    pub exchange: String,
    pub queue: String,
    pub dead_exchange: String,
    pub dead_queue: String,
}

impl Topology {
    pub fn new(prefix: &str) -> Topology {
        Topology {
            exchange: format!("{prefix}.runs"),
            queue: format!("{prefix}.runs"),
            dead_exchange: format!("{prefix}.runs.dlx"),
            dead_queue: format!("{prefix}.runs.dead"),
        }
    }

    /// Idempotent: every binary declares what it uses at start-up.
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.dead_exchange.as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        let queue_opts = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let mut dead_args = FieldTable::default();
        dead_args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        channel
            .queue_declare(self.dead_queue.as_str().into(), queue_opts, dead_args)
            .await?;
        channel
            .queue_bind(
                self.dead_queue.as_str().into(),
                self.dead_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.dead_exchange.as_str().into()),
        );
        channel
            .queue_declare(self.queue.as_str().into(), queue_opts, args)
            .await?;
        channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                self.queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }
}

/// Body of a run message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunMessage {
    pub run_id: Uuid,
}

/// Persistent JSON with the trace-context headers.
fn run_message_properties(headers: HashMap<String, String>) -> BasicProperties {
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(ShortString::from(k), AMQPValue::LongString(v.into()));
    }
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_headers(table)
}

/// Run messages of a burst that the broker did not confirm (`Publisher::publish_runs`).
#[derive(Debug, thiserror::Error)]
#[error("{} of {total} run messages not confirmed: {first}", failed.len())]
pub struct PublishRunsError {
    pub total: usize,
    /// The runs whose messages may not have reached the queue.
    pub failed: Vec<Uuid>,
    /// The first failure.
    pub first: PublishError,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker refused the message (nack)")]
    Nacked,
    #[error("the broker did not confirm within {after_ms} ms (amqp.timeout_ms)")]
    TimedOut { after_ms: u64 },
    /// The broker told this connection it blocks its publishers (`connection.blocked`: a
    /// memory or disk alarm); nothing is sent until it lifts.
    #[error("the broker is blocking publishers (a memory or disk alarm)")]
    Blocked,
}

/// Whether the publisher's connection is up and the broker blocks it (`connection.blocked`).
fn blocked(kept: &Option<(Connection, Channel)>) -> bool {
    kept.as_ref()
        .is_some_and(|(conn, _)| conn.status().connected() && conn.status().blocked())
}

/// Default of `amqp.timeout_ms`.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn connect(url: &str, name: &str) -> lapin::Result<Connection> {
    let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
    Connection::connect(url, props).await
}

/// Publishes run messages with publisher confirms: a publish returns only once the broker
/// has the message durably (quorum queues confirm after a majority wrote it). The publisher
/// owns its connection and makes a new one when the broker went away, so a RabbitMQ restart
/// heals on the next publish.
#[derive(Clone)]
pub struct Publisher {
    url: String,
    name: String,
    topology: Topology,
    channel: std::sync::Arc<tokio::sync::Mutex<Option<(Connection, Channel)>>>,
    /// `amqp.timeout_ms`: the longest a publish (reconnecting included) or the close waits.
    timeout: std::time::Duration,
}

impl Publisher {
    pub async fn new(url: &str, name: &str, topology: Topology) -> lapin::Result<Publisher> {
        let publisher = Publisher {
            url: url.to_owned(),
            name: name.to_owned(),
            topology,
            channel: Default::default(),
            timeout: DEFAULT_TIMEOUT,
        };
        publisher.channel().await?;
        Ok(publisher)
    }

    /// Sets `amqp.timeout_ms`.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Publisher {
        self.timeout = timeout;
        self
    }

    fn timed_out(&self) -> PublishError {
        PublishError::TimedOut {
            after_ms: self.timeout.as_millis() as u64,
        }
    }

    /// After a publish ran out of time: the channel is dropped (if no other publish holds it
    /// now) so the next publish makes a fresh one rather than wait on a stalled connection.
    /// Not a connection the broker blocked: a new one would be blocked at its first publish
    /// too, and the old one would not go away (the client sends nothing on a blocked
    /// connection, not even its close, while the broker keeps it alive with heartbeats): one
    /// more connection per time-out for as long as the alarm lasts.
    fn forget_channel(&self) {
        if let Ok(mut guard) = self.channel.try_lock()
            && !blocked(&guard)
        {
            guard.take();
        }
    }

    /// Whether the broker blocks this publisher's connection now: a publish then fails at
    /// once instead of waiting `amqp.timeout_ms` for a confirm that cannot come (the sweeper
    /// publishes the run again once the alarm lifts). Never waits for a publish in progress.
    pub fn is_blocked(&self) -> bool {
        self.channel.try_lock().is_ok_and(|guard| blocked(&guard))
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether the broker can be reached now, reconnecting if needed (for readiness probes:
    /// a probe that only reported the last state would stay "not ready" after an outage).
    pub async fn check(&self) -> bool {
        self.channel().await.is_ok()
    }

    /// The confirm channel, re-made if the connection was lost.
    async fn channel(&self) -> lapin::Result<Channel> {
        let mut guard = self.channel.lock().await;
        if let Some((conn, ch)) = guard.as_ref()
            && conn.status().connected()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        *guard = None;
        let conn = connect(&self.url, &self.name).await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        self.topology.declare(&ch).await?;
        *guard = Some((conn, ch.clone()));
        Ok(ch)
    }

    /// The `queue.publish` span of a publish of `count` messages, when traces are exported.
    fn publish_span(&self, count: usize) -> tracing::Span {
        if !crate::telemetry::exporting() {
            return tracing::Span::none();
        }
        tracing::info_span!(
            "queue.publish",
            otel.kind = "producer",
            messaging.system = "rabbitmq",
            messaging.destination.name = %self.topology.queue,
            messaging.batch.message_count = count,
        )
    }

    /// Publishes "run has work", carrying the W3C trace context of a `queue.publish` span.
    pub async fn publish_run(&self, run_id: Uuid) -> Result<(), PublishError> {
        if self.is_blocked() {
            return Err(PublishError::Blocked);
        }
        let span = self.publish_span(1);
        let publish = self.publish_run_in_span(run_id).instrument(span);
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(result) => result,
            Err(_) => {
                self.forget_channel();
                Err(self.timed_out())
            }
        }
    }

    async fn publish_run_in_span(&self, run_id: Uuid) -> Result<(), PublishError> {
        let body = serde_json::to_vec(&RunMessage { run_id }).expect("serializes");
        let result = self
            .publish_raw(
                &self.topology.exchange,
                &self.topology.queue,
                &body,
                crate::telemetry::current_trace_headers(),
            )
            .await;
        if result.is_err() {
            // Drop the channel so the next publish makes a fresh one.
            self.channel.lock().await.take();
        }
        result?;
        metrics::counter!("agentfleet_queue_publishes_total").increment(1);
        Ok(())
    }

    /// Publishes "run has work" for every run as one burst on the confirm channel, then waits
    /// for all the confirms together: one wait for the broker instead of one per message.
    /// Whatever the broker did not confirm is returned (the caller logs it; the sweeper
    /// re-publishes queued runs it finds idle).
    pub async fn publish_runs(&self, ids: &[Uuid]) -> Result<(), PublishRunsError> {
        if ids.is_empty() {
            return Ok(());
        }
        if self.is_blocked() {
            return Err(PublishRunsError {
                total: ids.len(),
                failed: ids.to_vec(),
                first: PublishError::Blocked,
            });
        }
        let span = self.publish_span(ids.len());
        let publish = self.publish_runs_in_span(ids).instrument(span);
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(result) => result,
            Err(_) => {
                self.forget_channel();
                Err(PublishRunsError {
                    total: ids.len(),
                    failed: ids.to_vec(),
                    first: self.timed_out(),
                })
            }
        }
    }

    async fn publish_runs_in_span(&self, ids: &[Uuid]) -> Result<(), PublishRunsError> {
        let unconfirmed = |first: PublishError, failed: Vec<Uuid>| PublishRunsError {
            total: ids.len(),
            failed,
            first,
        };
        let channel = match self.channel().await {
            Ok(ch) => ch,
            Err(e) => return Err(unconfirmed(e.into(), ids.to_vec())),
        };
        let props = run_message_properties(crate::telemetry::current_trace_headers());
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        // All sends are polled in order before any completes, so every frame is queued for the
        // connection's writer at once instead of one hand-off to it per message.
        let sends = ids.iter().map(|&run_id| {
            let (channel, props) = (&channel, props.clone());
            async move {
                let body = serde_json::to_vec(&RunMessage { run_id }).expect("serializes");
                let sent = channel
                    .basic_publish(
                        self.topology.exchange.as_str().into(),
                        self.topology.queue.as_str().into(),
                        options,
                        &body,
                        props,
                    )
                    .await;
                (run_id, sent)
            }
        });
        let mut confirms = Vec::with_capacity(ids.len());
        let mut failed = Vec::new();
        let mut first: Option<PublishError> = None;
        for (run_id, sent) in futures_util::future::join_all(sends).await {
            match sent {
                Ok(confirm) => confirms.push((run_id, confirm)),
                Err(e) => {
                    failed.push(run_id);
                    first.get_or_insert(e.into());
                }
            }
        }
        let outcomes = futures_util::future::join_all(confirms.into_iter().map(
            |(run_id, confirm)| async move {
                let result = match confirm.await {
                    Ok(c) if c.is_nack() => Err(PublishError::Nacked),
                    Ok(_) => Ok(()),
                    Err(e) => Err(PublishError::Amqp(e)),
                };
                (run_id, result)
            },
        ))
        .await;
        let mut confirmed = 0u64;
        for (run_id, result) in outcomes {
            match result {
                Ok(()) => confirmed += 1,
                Err(e) => {
                    failed.push(run_id);
                    first.get_or_insert(e);
                }
            }
        }
        metrics::counter!("agentfleet_queue_publishes_total").increment(confirmed);
        match first {
            None => Ok(()),
            Some(first) => {
                // Drop the channel so the next publish makes a fresh one.
                self.channel.lock().await.take();
                Err(unconfirmed(first, failed))
            }
        }
    }

    /// Closes the connection, waiting at most `amqp.timeout_ms` for the broker's answer.
    pub async fn close(&self) {
        let taken = tokio::time::timeout(self.timeout, self.channel.lock()).await;
        if let Ok(Some((conn, _))) = taken.map(|mut guard| guard.take()) {
            let _ = tokio::time::timeout(self.timeout, conn.close(200, "closing".into())).await;
        }
    }

    async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        headers: HashMap<String, String>,
    ) -> Result<(), PublishError> {
        let props = run_message_properties(headers);
        let confirm = self
            .channel()
            .await?
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                props,
            )
            .await?
            .await?;
        if confirm.is_nack() {
            return Err(PublishError::Nacked);
        }
        Ok(())
    }
}

/// Reads string headers of a delivery, for trace-context extraction.
pub fn headers_of(props: &BasicProperties) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Some(table) = props.headers() {
        for (k, v) in table.inner() {
            let value = match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.as_str().to_owned(),
                _ => continue,
            };
            out.insert(k.as_str().to_owned(), value);
        }
    }
    out
}
