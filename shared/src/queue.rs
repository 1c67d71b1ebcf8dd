//! RabbitMQ topology and the run-message publisher.
//!
//! A message only says "run R has work to do" and carries trace context; Postgres holds the
//! state. Topology: a durable direct exchange `{prefix}.runs`, a durable quorum queue
//! `{prefix}.runs` bound to it, and a dead-letter exchange and queue `{prefix}.runs.dead`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
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

/// The waits before a publish that the broker did not confirm is tried again, on a fresh
/// channel (on the next node when its node is lost): a quorum queue refuses publishes while it
/// elects a new leader, and a node lost mid-publish drops the confirms it owed. All within
/// `amqp.timeout_ms`; past these, the sweeper publishes the run again.
const RETRY_AFTER: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(250),
    Duration::from_millis(1000),
];

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
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the broker refused the message (nack)")]
    Nacked,
    #[error("the broker did not confirm within {after_ms} ms (amqp.timeout_ms)")]
    TimedOut { after_ms: u64 },
    /// The broker told this connection it blocks its publishers (`connection.blocked`: a
    /// memory or disk alarm); nothing is sent until it lifts.
    #[error("the broker is blocking publishers (a memory or disk alarm)")]
    Blocked,
}

impl PublishError {
    /// Whether trying again soon may succeed: a nack (a quorum queue electing a leader) or a
    /// lost connection. Not a blocked publisher (an alarm lasts) nor a time-out (the budget
    /// is spent).
    fn is_transient(&self) -> bool {
        matches!(
            self,
            PublishError::Nacked | PublishError::Amqp(_) | PublishError::Connect(_)
        )
    }
}

/// An `amqp.url` that does not parse. Never shows the address itself: it may hold a password.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadBrokers {
    #[error("address {index} of {count} is empty")]
    Empty { index: usize, count: usize },
    #[error("address {index} of {count} is not an amqp:// or amqps:// URL: {reason}")]
    Malformed {
        index: usize,
        count: usize,
        reason: String,
    },
}

/// One node of `amqp.url` that did not take a connection.
#[derive(Debug)]
pub struct NodeFailure {
    /// `host:port`, without credentials.
    pub address: String,
    pub cause: String,
}

/// Opening a broker connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("amqp.url: {0}")]
    BadUrl(#[from] BadBrokers),
    /// Every node was tried once, in turn.
    #[error("no RabbitMQ node took the connection: {}", list_failures(.0))]
    Unreachable(Vec<NodeFailure>),
    /// A node took the connection, then failed a step after it (a channel, confirms, the
    /// topology's declarations).
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
}

fn list_failures(failures: &[NodeFailure]) -> String {
    failures
        .iter()
        .map(|f| format!("{}: {}", f.address, f.cause))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The broker nodes of `amqp.url`: one URL, or a cluster's nodes as comma-separated URLs (a
/// comma inside a password is written `%2C`). A connection goes to the node that answered
/// last, else to the next one in turn; clones share that choice, so a publisher and a
/// consumer that share a `Brokers` move off a lost node together.
#[derive(Clone)]
pub struct Brokers {
    nodes: Arc<[Node]>,
    /// The node the next connection tries first.
    next: Arc<AtomicUsize>,
}

struct Node {
    uri: AMQPUri,
    address: String,
}

impl std::fmt::Debug for Brokers {
    /// Addresses only: the URLs hold credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brokers")
            .field("nodes", &self.addresses())
            .finish()
    }
}

impl Brokers {
    pub fn parse(spec: &str) -> Result<Brokers, BadBrokers> {
        let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
        let count = parts.len();
        let mut nodes = Vec::with_capacity(count);
        for (i, part) in parts.into_iter().enumerate() {
            let index = i + 1;
            if part.is_empty() {
                return Err(BadBrokers::Empty { index, count });
            }
            let uri: AMQPUri = part.parse().map_err(|reason| BadBrokers::Malformed {
                index,
                count,
                reason,
            })?;
            let address = format!("{}:{}", uri.authority.host, uri.authority.port);
            nodes.push(Node { uri, address });
        }
        Ok(Brokers {
            nodes: nodes.into(),
            next: Default::default(),
        })
    }

    /// `host:port` of every node, comma-separated, without credentials.
    pub fn addresses(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.address.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A connection to the first node that takes one, each node tried once in turn starting
    /// with the one that answered last, each attempt given at most `attempt` (a black-holed
    /// node must not hold the others back).
    pub async fn connect(&self, name: &str, attempt: Duration) -> Result<Connection, ConnectError> {
        let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
        let count = self.nodes.len();
        let first = self.next.load(Ordering::Relaxed) % count;
        let mut failures = Vec::new();
        for k in (first..count).chain(0..first) {
            // Moved on before the attempt: one that the caller's own time-out cuts short still
            // sends the caller's next connection to the next node.
            self.next.store((k + 1) % count, Ordering::Relaxed);
            let node = &self.nodes[k];
            let cause = match tokio::time::timeout(
                attempt,
                Connection::connect_uri(node.uri.clone(), props.clone()),
            )
            .await
            {
                Ok(Ok(conn)) => {
                    self.next.store(k, Ordering::Relaxed);
                    return Ok(conn);
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {} ms", attempt.as_millis()),
            };
            if count > 1 {
                tracing::debug!(node = %node.address, error = %cause, "RabbitMQ node did not take the connection; trying the next");
            }
            failures.push(NodeFailure {
                address: node.address.clone(),
                cause,
            });
        }
        Err(ConnectError::Unreachable(failures))
    }
}

/// Whether the publisher's connection is up and the broker blocks it (`connection.blocked`).
fn blocked(kept: &Option<(Connection, Channel)>) -> bool {
    kept.as_ref()
        .is_some_and(|(conn, _)| conn.status().connected() && conn.status().blocked())
}

/// Default of `amqp.timeout_ms`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to a node of `url` (the form of `amqp.url`), for one-off work (the admin
/// commands, tests).
pub async fn connect(url: &str, name: &str) -> Result<Connection, ConnectError> {
    Brokers::parse(url)?.connect(name, DEFAULT_TIMEOUT).await
}

/// Publishes run messages with publisher confirms: a publish returns only once the broker
/// has the message durably (quorum queues confirm after a majority wrote it). The publisher
/// owns its connection and makes a new one when the broker went away, so a RabbitMQ restart
/// heals on the next publish.
#[derive(Clone)]
pub struct Publisher {
    brokers: Brokers,
    name: String,
    topology: Topology,
    channel: Arc<tokio::sync::Mutex<Option<(Connection, Channel)>>>,
    /// `amqp.timeout_ms`: the longest a publish (reconnecting included) or the close waits.
    timeout: Duration,
}

impl Publisher {
    /// `url` is `amqp.url`: one node, or a cluster's nodes (see [`Brokers`]).
    pub async fn new(url: &str, name: &str, topology: Topology) -> Result<Publisher, ConnectError> {
        let publisher = Publisher {
            brokers: Brokers::parse(url)?,
            name: name.to_owned(),
            topology,
            channel: Default::default(),
            timeout: DEFAULT_TIMEOUT,
        };
        publisher.channel().await?;
        Ok(publisher)
    }

    /// Sets `amqp.timeout_ms`.
    pub fn with_timeout(mut self, timeout: Duration) -> Publisher {
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

    /// The broker nodes this publisher connects to; a consumer that connects through them too
    /// follows the publisher off a lost node.
    pub fn brokers(&self) -> &Brokers {
        &self.brokers
    }

    /// Whether the broker can be reached now, reconnecting if needed (for readiness probes:
    /// a probe that only reported the last state would stay "not ready" after an outage).
    pub async fn check(&self) -> bool {
        self.channel().await.is_ok()
    }

    /// The confirm channel, re-made if the connection was lost (on the next node that takes
    /// it, when `amqp.url` names several).
    async fn channel(&self) -> Result<Channel, ConnectError> {
        let mut guard = self.channel.lock().await;
        if let Some((conn, ch)) = guard.as_ref()
            && conn.status().connected()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        *guard = None;
        let conn = self.brokers.connect(&self.name, self.timeout).await?;
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
        let mut retries = RETRY_AFTER.iter();
        loop {
            match self.publish_run_once(run_id).await {
                Err(e)
                    if e.is_transient()
                        && let Some(&wait) = retries.next() =>
                {
                    tracing::debug!(%run_id, error = %e, "publish not confirmed; trying again");
                    tokio::time::sleep(wait).await;
                }
                result => return result,
            }
        }
    }

    async fn publish_run_once(&self, run_id: Uuid) -> Result<(), PublishError> {
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
        let mut retries = RETRY_AFTER.iter();
        let mut pending = ids.to_vec();
        loop {
            match self.publish_burst(&pending).await {
                Err(e)
                    if e.first.is_transient()
                        && let Some(&wait) = retries.next() =>
                {
                    tracing::debug!(error = %e, "publishes not confirmed; trying them again");
                    pending = e.failed;
                    tokio::time::sleep(wait).await;
                }
                Ok(()) => return Ok(()),
                Err(e) => {
                    return Err(PublishRunsError {
                        total: ids.len(),
                        ..e
                    });
                }
            }
        }
    }

    async fn publish_burst(&self, ids: &[Uuid]) -> Result<(), PublishRunsError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_is_one_node() {
        let b = Brokers::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(b.addresses(), "127.0.0.1:5672");
    }

    #[test]
    fn a_cluster_is_its_nodes_in_order_without_credentials() {
        let b = Brokers::parse(
            "amqp://u:s3cret@rabbit-0:5672/%2f, amqp://u:s3cret@rabbit-1/%2f,amqps://u:p%2Cq@rabbit-2:5671/x",
        )
        .unwrap();
        assert_eq!(b.addresses(), "rabbit-0:5672,rabbit-1:5672,rabbit-2:5671");
        assert!(!format!("{b:?}").contains("s3cret"));
        assert_eq!(b.nodes[2].uri.authority.userinfo.password, "p,q");
    }

    #[test]
    fn a_bad_address_is_named_by_its_place_not_its_text() {
        assert_eq!(
            Brokers::parse("amqp://a:1/%2f,").unwrap_err(),
            BadBrokers::Empty { index: 2, count: 2 }
        );
        let err = Brokers::parse("amqp://u:s3cret@a:1/%2f,http://u:s3cret@b:2/")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("address 2 of 2 is not an amqp:// or amqps:// URL"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        assert!(Brokers::parse("rabbit-0:5672").is_err());
    }

    /// Every node is tried once, in turn, and the error names each with its cause; the next
    /// connection starts after the node tried last.
    #[tokio::test]
    async fn every_node_is_tried_once_and_named() {
        let closed = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (a, b) = (closed(), closed());
        let brokers = Brokers::parse(&format!(
            "amqp://127.0.0.1:{a}/%2f,amqp://127.0.0.1:{b}/%2f"
        ))
        .unwrap();
        let err = brokers
            .connect("test", Duration::from_secs(5))
            .await
            .unwrap_err();
        let ConnectError::Unreachable(failures) = &err else {
            panic!("{err}")
        };
        let tried: Vec<_> = failures.iter().map(|f| f.address.clone()).collect();
        assert_eq!(tried, [format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}")]);
        assert!(
            err.to_string()
                .starts_with("no RabbitMQ node took the connection: 127.0.0.1:")
        );
        // The last tried was the second: the next round starts over at the first.
        assert_eq!(brokers.next.load(Ordering::Relaxed), 0);
    }

    /// A dead node first and a live one second: the connection goes to the live one, and the
    /// next connection starts there.
    #[tokio::test]
    async fn a_dead_node_is_passed_over() {
        let live = std::env::var("AGENTFLEET_TEST_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let brokers = Brokers::parse(&format!("amqp://127.0.0.1:{dead}/%2f,{live}")).unwrap();
        let conn = brokers
            .connect("test", Duration::from_secs(5))
            .await
            .expect("the live node takes it");
        assert_eq!(brokers.next.load(Ordering::Relaxed), 1);
        let _ = conn.close(200, "done".into()).await;
    }
}
