//! Reaching Postgres, Redis and RabbitMQ.
//!
//! At start-up a binary waits for each server with back-off for a bounded time
//! (`startup.dependency_wait_ms`), logging every few seconds which server and address it waits
//! for, then gives up with an error naming both. A server that is briefly away (a restart, a
//! rolling upgrade) therefore delays start-up instead of turning it into a crash loop, and one
//! that is really missing is named. Later, a long-lived connection (a subscription, a
//! consumer) is re-made with back-off by [`reconnecting`].

use std::fmt;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::{DatabaseSettings, RedisSettings};
use crate::queue::{Publisher, Topology};
use crate::report;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Redis,
    RabbitMq,
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Server::Postgres => "Postgres",
            Server::Redis => "Redis",
            Server::RabbitMq => "RabbitMQ",
        })
    }
}

/// A server could not be reached within the start-up budget.
#[derive(Debug, thiserror::Error)]
#[error("could not reach {server} at {address} within {waited_secs} s: {cause}")]
pub struct Unreachable {
    pub server: Server,
    pub address: String,
    pub waited_secs: u64,
    pub cause: String,
}

/// `host:port` of a server URL, without credentials: what a log line or an error may show.
/// A list of URLs (`amqp.url` naming a cluster's nodes) gives each one's, comma-separated; a
/// comma not followed by a URL (a libpq host list, a password) stays inside its URL.
pub fn address(url: &str) -> String {
    let mut urls: Vec<String> = Vec::new();
    for part in url.split(',') {
        match urls.last_mut() {
            Some(last) if !part.contains("://") => {
                last.push(',');
                last.push_str(part);
            }
            _ => urls.push(part.to_owned()),
        }
    }
    urls.iter()
        .map(|u| one_address(u.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

fn one_address(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    &rest[..end]
}

/// How often a start-up wait says what it is waiting for.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(5);
/// One connection attempt never takes longer than this (a black-holed address).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

fn backoff() -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build()
}

/// Calls `connect` until it succeeds or `budget` has passed.
pub async fn wait_for<T, E, F, Fut>(
    server: Server,
    url: &str,
    budget: Duration,
    mut connect: F,
) -> Result<T, Unreachable>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<anyhow::Error>,
{
    let address = address(url);
    let started = Instant::now();
    let mut delays = backoff();
    let mut logged: Option<Instant> = None;
    let mut cause: Option<String> = None;
    loop {
        let left = budget.saturating_sub(started.elapsed());
        let attempt = ATTEMPT_TIMEOUT.min(left);
        let seen = match tokio::time::timeout(attempt, connect()).await {
            Ok(Ok(connected)) => {
                if logged.is_some() {
                    tracing::info!(%server, %address, "{server} is reachable");
                }
                return Ok(connected);
            }
            Ok(Err(e)) => report::one_line(&e.into()),
            // An attempt cut short by the end of the budget (down to 0 ms after the last
            // back-off) says nothing of the server: the cause seen before stands.
            Err(_) if attempt < ATTEMPT_TIMEOUT && cause.is_some() => {
                cause.take().expect("checked")
            }
            Err(_) => format!("no answer within {} ms", attempt.as_millis()),
        };
        let cause = cause.insert(seen).clone();
        let left = budget.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(Unreachable {
                server,
                address,
                waited_secs: started.elapsed().as_secs(),
                cause,
            });
        }
        if logged.is_none_or(|at| at.elapsed() >= WAIT_LOG_EVERY) {
            tracing::warn!(%server, %address, error = %cause, give_up_in_s = left.as_secs(),
                "waiting for {server} at {address}");
            logged = Some(Instant::now());
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(2)).min(left);
        tokio::time::sleep(delay).await;
    }
}

/// A Postgres pool, once the server answers. Each attempt opens one connection directly, so a
/// failure says why (refused, unknown host, authentication) instead of a pool time-out.
pub async fn postgres(
    settings: &DatabaseSettings,
    budget: Duration,
) -> Result<PgPool, Unreachable> {
    wait_for(Server::Postgres, &settings.url, budget, || async {
        crate::db::probe(settings).await?;
        crate::db::connect(settings).await
    })
    .await
}

/// The process's shared Redis connection (`events::redis_connection`), once the server answers
/// `PING` (on a cluster, every node). Each attempt makes one connection of its own, so a failure
/// says why (refused, unknown host, authentication) rather than after the shared connection's
/// reconnect policy.
pub async fn redis(
    settings: &RedisSettings,
    budget: Duration,
) -> Result<crate::events::RedisConnection, Unreachable> {
    let invalid = |e: redis::RedisError| Unreachable {
        server: Server::Redis,
        address: address(settings.address()),
        waited_secs: 0,
        cause: report::error_line(&e),
    };
    if settings.is_cluster() {
        let client = crate::events::cluster_client(settings, None).map_err(invalid)?;
        wait_for(Server::Redis, settings.address(), budget, || async {
            let mut conn = client.get_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await?;
    } else {
        let client = crate::events::redis_client(settings).map_err(invalid)?;
        let config = crate::events::connection_config(settings);
        wait_for(Server::Redis, &settings.url, budget, || async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await?;
    }
    crate::events::redis_connection(settings).map_err(invalid)
}

/// A confirming publisher with the queue topology declared, once RabbitMQ answers.
pub async fn rabbitmq(
    url: &str,
    name: &str,
    topology: Topology,
    budget: Duration,
) -> Result<Publisher, Unreachable> {
    wait_for(Server::RabbitMq, url, budget, || {
        Publisher::new(url, name, topology.clone())
    })
    .await
}

/// Runs `session` again and again, each time on a fresh connection, until it returns `Ok` (it
/// is done; a session that should end on shutdown watches for it and returns `Ok`) or `stop` is
/// cancelled between sessions. A session that fails is logged naming `what`, the server and
/// its address, and followed by back-off (reset after a session that held a while).
pub async fn reconnecting<F, Fut>(
    what: &str,
    server: Server,
    url: &str,
    stop: &CancellationToken,
    mut session: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    const HELD_A_WHILE: Duration = Duration::from_secs(30);
    let address = address(url);
    let mut delays = backoff();
    while !stop.is_cancelled() {
        let began = Instant::now();
        let Err(e) = session().await else { return };
        if began.elapsed() >= HELD_A_WHILE {
            delays = backoff();
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(2));
        tracing::warn!(%server, %address, error = %report::one_line(&e),
            retry_in_ms = delay.as_millis() as u64, "{what} lost its connection to {server}; reconnecting");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_never_show_credentials() {
        assert_eq!(
            address("postgres://app:s3cret@db.internal:5432/agentfleet?sslmode=require"),
            "db.internal:5432"
        );
        assert_eq!(address("redis://:pw@127.0.0.1:6379/0"), "127.0.0.1:6379");
        assert_eq!(
            address("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "127.0.0.1:5672"
        );
        assert_eq!(address("redis://cache:6379"), "cache:6379");
        assert_eq!(
            address("amqp://u:s3cret@r0:5672/%2f, amqp://u:s3cret@r1:5672/%2f"),
            "r0:5672,r1:5672"
        );
        assert_eq!(address("postgres://u:a,b@db:5432/x"), "db:5432");
        assert_eq!(
            address("postgres://u:p@h1:5432,h2:5432/x"),
            "h1:5432,h2:5432"
        );
    }

    /// `wait_for` of a Redis that never answers, with a budget of 300 ms.
    async fn redis_refusing<F, Fut>(connect: F) -> Unreachable
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), anyhow::Error>>,
    {
        wait_for(
            Server::Redis,
            "redis://127.0.0.1:1",
            Duration::from_millis(300),
            connect,
        )
        .await
        .unwrap_err()
    }

    #[tokio::test]
    async fn gives_up_after_the_budget_naming_the_server() {
        let mut attempts = 0;
        let err = redis_refusing(|| {
            attempts += 1;
            async { Err::<(), _>(anyhow::anyhow!("connection refused")) }
        })
        .await;
        assert!(attempts >= 2, "it retried ({attempts} attempts)");
        assert_eq!(
            err.to_string(),
            format!(
                "could not reach Redis at 127.0.0.1:1 within {} s: connection refused",
                err.waited_secs
            )
        );
    }

    /// The last attempt, cut short by the budget's end, does not replace the cause seen
    /// before (a worker that could not reach Redis reported "no answer within 0 ms").
    #[tokio::test]
    async fn the_cause_is_not_an_attempt_cut_short_by_the_budget() {
        let mut attempts = 0;
        let err = redis_refusing(|| {
            attempts += 1;
            let first = attempts == 1;
            async move {
                if first {
                    return Err::<(), _>(anyhow::anyhow!("connection refused"));
                }
                std::future::pending().await
            }
        })
        .await;
        assert_eq!(attempts, 2, "the second attempt waited to the budget's end");
        assert_eq!(err.cause, "connection refused");
    }

    #[tokio::test]
    async fn succeeds_once_the_server_answers() {
        let mut attempts = 0;
        let got = wait_for(
            Server::Postgres,
            "postgres://x@h:1/db",
            Duration::from_secs(10),
            || {
                attempts += 1;
                let ready = attempts >= 3;
                async move {
                    if ready {
                        Ok(42)
                    } else {
                        Err(anyhow::anyhow!("not yet"))
                    }
                }
            },
        )
        .await
        .unwrap();
        assert_eq!((got, attempts), (42, 3));
    }
}
