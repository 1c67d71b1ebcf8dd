//! The process's one shared Redis connection: how it is made, kept alive and retried.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Data sent on a Redis connection and unacknowledged this long means the peer is gone (a
/// failed-over host, a NAT that forgot the connection), not slow: a stalled server's kernel
/// still acknowledges. The kernel then drops the connection, and the shared one is re-made;
/// without it a half-open connection would only time out command after command.
#[cfg(target_os = "linux")]
const DEAD_CONNECTION_AFTER: Duration = Duration::from_secs(10);

/// The client for `redis.url`. `TCP_NODELAY`: many tasks' small commands share one
/// connection, and none should wait for the acknowledgement of another's.
pub fn redis_client(settings: &crate::config::RedisSettings) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = settings.url.as_str().into_connection_info()?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    #[cfg(target_os = "linux")]
    let tcp = tcp.set_user_timeout(DEAD_CONNECTION_AFTER);
    redis::Client::open(info.set_tcp_settings(tcp))
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
pub fn redis_connection(
    settings: &crate::config::RedisSettings,
) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(
            settings.connect_timeout_ms.get(),
        )))
        .set_response_timeout(Some(Duration::from_millis(
            settings.response_timeout_ms.get(),
        )))
        .set_number_of_retries(settings.reconnect_retries)
        .set_min_delay(Duration::from_millis(settings.reconnect_backoff_ms))
        .set_max_delay(crate::config::RedisSettings::RECONNECT_MAX_BACKOFF);
    ConnectionManager::new_lazy_with_config(redis_client(settings)?, config)
}

/// Whether a failed command is worth sending again: when the connection broke or could not be
/// made (the manager is re-making it, and a second attempt waits for the new one; a server
/// that is back after a restart answers it). Not after a time-out: the server may still be
/// executing the first attempt. The command must be safe to repeat (see `again` in
/// `APPEND_LUA`).
pub(super) fn worth_retrying(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
}
