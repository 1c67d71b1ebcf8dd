//! The process's one shared Redis connection: how it is made, kept alive and retried, to one
//! server or to a Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Data sent on a Redis connection and unacknowledged this long means the peer is gone (a
/// failed-over host, a NAT that forgot the connection), not slow: a stalled server's kernel
/// still acknowledges. The kernel then drops the connection, and the shared one is re-made;
/// without it a half-open connection would only time out command after command.
#[cfg(target_os = "linux")]
const DEAD_CONNECTION_AFTER: Duration = Duration::from_secs(10);

/// The TCP settings of every Redis connection. `TCP_NODELAY`: many tasks' small commands share
/// one connection, and none should wait for the acknowledgement of another's.
fn tcp_settings(base: &redis::io::tcp::TcpSettings) -> redis::io::tcp::TcpSettings {
    let tcp = base.clone().set_nodelay(true);
    #[cfg(target_os = "linux")]
    let tcp = tcp.set_user_timeout(DEAD_CONNECTION_AFTER);
    tcp
}

/// The client for `url` (one server).
pub fn redis_client_for(url: &str) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info()?;
    let tcp = tcp_settings(info.tcp_settings());
    redis::Client::open(info.set_tcp_settings(tcp))
}

/// The client for `redis.url` (one server; see [`cluster_client`] for a cluster).
pub fn redis_client(settings: &crate::config::RedisSettings) -> redis::RedisResult<redis::Client> {
    redis_client_for(&settings.url)
}

/// The client for `redis.cluster_nodes`, with `redis.*`'s bounds; `protocol` RESP3 (with a
/// `push` sender) for a connection that subscribes.
pub fn cluster_client(
    settings: &crate::config::RedisSettings,
    push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
) -> redis::RedisResult<ClusterClient> {
    let mut builder = ClusterClientBuilder::new(settings.cluster_nodes())
        .connection_timeout(Duration::from_millis(settings.connect_timeout_ms.get()))
        .response_timeout(Duration::from_millis(settings.response_timeout_ms.get()))
        .tcp_settings(tcp_settings(&redis::io::tcp::TcpSettings::default()))
        .retries(settings.reconnect_retries as u32)
        .min_retry_wait(settings.reconnect_backoff_ms)
        .max_retry_wait(crate::config::RedisSettings::RECONNECT_MAX_BACKOFF.as_millis() as u64);
    if let Some(push) = push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push);
    }
    builder.build()
}

/// A cluster connection's bounds of one connection attempt and one answer (`redis.*`).
fn cluster_config(settings: &crate::config::RedisSettings) -> ClusterConfig {
    ClusterConfig::new()
        .set_connection_timeout(Duration::from_millis(settings.connect_timeout_ms.get()))
        .set_response_timeout(Duration::from_millis(settings.response_timeout_ms.get()))
}

/// A connection to one server or to a cluster: what every Redis call of the fleet goes over.
/// Commands are the same either way (every script names the keys of one run, which share a
/// hash slot); the cluster's connection routes each to the node that owns its slot and follows
/// the cluster's changes (a failover, a slot moved).
#[derive(Clone)]
pub enum RedisConnection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConnection {
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConnection::Cluster(_))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

/// The per-command bounds of `settings` for a connection made outside the shared one.
pub fn connection_config(settings: &crate::config::RedisSettings) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(
            settings.connect_timeout_ms.get(),
        )))
        .set_response_timeout(Some(Duration::from_millis(
            settings.response_timeout_ms.get(),
        )))
}

/// The process's shared connection to Redis: one multiplexed connection, connected on first
/// use. When it breaks, the call that finds out fails, and the connection is re-made in the
/// background: `redis.reconnect_retries` attempts, backing off from
/// `redis.reconnect_backoff_ms`; calls made meanwhile wait for it (within `redis.timeout_ms`).
/// For a cluster, one such connection to each node, made as the cluster's map is learnt.
pub fn redis_connection(
    settings: &crate::config::RedisSettings,
) -> redis::RedisResult<RedisConnection> {
    if settings.is_cluster() {
        let client = cluster_client(settings, None)?;
        return Ok(RedisConnection::Cluster(
            client.get_pending_async_connection_with_config(cluster_config(settings)),
        ));
    }
    Ok(RedisConnection::Single(single_connection(
        settings,
        ConnectionManagerConfig::new(),
    )?))
}

/// A connection manager for `redis.url` with `redis.*`'s bounds, added to `config`.
pub fn single_connection(
    settings: &crate::config::RedisSettings,
    config: ConnectionManagerConfig,
) -> redis::RedisResult<ConnectionManager> {
    bounded_manager(redis_client(settings)?, settings, config)
}

/// A connection manager for `client` with `redis.*`'s bounds (time-outs, reconnect attempts and
/// back-off), added to `config`.
fn bounded_manager(
    client: redis::Client,
    settings: &crate::config::RedisSettings,
    config: ConnectionManagerConfig,
) -> redis::RedisResult<ConnectionManager> {
    let config = config
        .set_connection_timeout(Some(Duration::from_millis(
            settings.connect_timeout_ms.get(),
        )))
        .set_response_timeout(Some(Duration::from_millis(
            settings.response_timeout_ms.get(),
        )))
        .set_number_of_retries(settings.reconnect_retries)
        .set_min_delay(Duration::from_millis(settings.reconnect_backoff_ms))
        .set_max_delay(crate::config::RedisSettings::RECONNECT_MAX_BACKOFF);
    ConnectionManager::new_lazy_with_config(client, config)
}

/// Whether a failed command is worth sending again: when the connection broke or could not be
/// made (the manager is re-making it, and a second attempt waits for the new one; a server
/// that is back after a restart answers it). Not after a time-out: the server may still be
/// executing the first attempt. The command must be safe to repeat (see `again` in
/// `APPEND_LUA`).
pub(super) fn worth_retrying(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
}

/// A connection for classic (unsharded) pub/sub, as the few process-wide subscriptions use (a
/// worker's cancel hints, the API's auth invalidations): to `redis.url`, or on a cluster to the
/// first of `redis.cluster_nodes` that answers, since a cluster delivers a classic `PUBLISH` on
/// every node. When that node goes, the subscription breaks and its owner makes it again,
/// here, on another.
pub async fn classic_pubsub(
    settings: &crate::config::RedisSettings,
) -> redis::RedisResult<redis::aio::PubSub> {
    let connect = |url: &str| {
        let client = redis_client_for(url);
        let limit = Duration::from_millis(settings.connect_timeout_ms.get());
        async move {
            let client = client?;
            tokio::time::timeout(limit, client.get_async_pubsub())
                .await
                .unwrap_or_else(|_| {
                    Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no connection in time",
                    )))
                })
        }
    };
    if !settings.is_cluster() {
        return connect(&settings.url).await;
    }
    let mut last = None;
    for node in settings.cluster_nodes() {
        match connect(node).await {
            Ok(pubsub) => return Ok(pubsub),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("a cluster has a node"))
}

/// A connection of its own for a process's live-event subscriptions, in RESP3: every message,
/// subscription confirmation and disconnection is sent to `push`. On one server it subscribes
/// with `SUBSCRIBE`, on a cluster with `SSUBSCRIBE` to the node owning each channel's slot;
/// either way the subscriptions are made again after a reconnect (a new confirmation is pushed
/// for each). Connected on first use.
pub fn subscriber_connection(
    settings: &crate::config::RedisSettings,
    push: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
) -> redis::RedisResult<RedisConnection> {
    use redis::IntoConnectionInfo;
    if settings.is_cluster() {
        let client = cluster_client(settings, Some(push))?;
        return Ok(RedisConnection::Cluster(
            client.get_pending_async_connection_with_config(cluster_config(settings)),
        ));
    }
    let info = settings.url.as_str().into_connection_info()?;
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let tcp = tcp_settings(info.tcp_settings());
    let client = redis::Client::open(info.set_redis_settings(resp3).set_tcp_settings(tcp))?;
    let config = ConnectionManagerConfig::new()
        .set_push_sender(push)
        .set_automatic_resubscription();
    Ok(RedisConnection::Single(bounded_manager(
        client, settings, config,
    )?))
}

impl RedisConnection {
    /// Subscribes to runs' live channels (`SUBSCRIBE`; on a cluster `SSUBSCRIBE`, one per
    /// channel since each may live on another node) and to classic channels (`SUBSCRIBE`).
    /// Only for a [`subscriber_connection`].
    pub async fn subscribe_live(
        &mut self,
        sharded: &[String],
        classic: &[String],
    ) -> redis::RedisResult<()> {
        self.change_subscriptions(true, sharded, classic).await
    }

    /// Undoes [`RedisConnection::subscribe_live`].
    pub async fn unsubscribe_live(
        &mut self,
        sharded: &[String],
        classic: &[String],
    ) -> redis::RedisResult<()> {
        self.change_subscriptions(false, sharded, classic).await
    }

    async fn change_subscriptions(
        &mut self,
        subscribe: bool,
        sharded: &[String],
        classic: &[String],
    ) -> redis::RedisResult<()> {
        match self {
            RedisConnection::Single(c) => {
                let all: Vec<&String> = sharded.iter().chain(classic).collect();
                match (all.is_empty(), subscribe) {
                    (true, _) => {}
                    (false, true) => c.subscribe(all).await?,
                    (false, false) => c.unsubscribe(all).await?,
                }
            }
            RedisConnection::Cluster(c) => {
                let each = sharded.iter().map(|channel| {
                    let mut c = c.clone();
                    async move {
                        if subscribe {
                            c.ssubscribe(channel).await
                        } else {
                            c.sunsubscribe(channel).await
                        }
                    }
                });
                for done in futures_util::future::join_all(each).await {
                    done?;
                }
                match (classic.is_empty(), subscribe) {
                    (true, _) => {}
                    (false, true) => c.subscribe(classic).await?,
                    (false, false) => c.unsubscribe(classic).await?,
                }
            }
        }
        Ok(())
    }
}
