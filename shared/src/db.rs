//! Postgres pool and migrations.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

use crate::config::DatabaseSettings;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

fn options(settings: &DatabaseSettings) -> Result<PgConnectOptions, sqlx::Error> {
    let mut options: PgConnectOptions = settings.url.parse()?;
    if loopback_without_sslmode(&settings.url, options.get_host()) {
        options = options.ssl_mode(PgSslMode::Disable);
    }
    let options = options.options([
        (
            "idle_in_transaction_session_timeout",
            settings.idle_in_transaction_timeout_ms.to_string(),
        ),
        (
            "statement_timeout",
            settings.statement_timeout_ms.to_string(),
        ),
        ("lock_timeout", settings.lock_timeout().to_string()),
    ]);
    if settings.generic_plans {
        return Ok(options.options([("plan_cache_mode", "force_generic_plan")]));
    }
    Ok(options)
}

/// A server on this host, reached without an explicit `sslmode` (in the URL or `PGSSLMODE`):
/// TLS would protect nothing there (the bytes never leave the machine) and costs Postgres
/// about 7 % of its CPU per run (`bench --only e2e`, two pairs: 1.92 against 1.77 ms of
/// Postgres CPU, 5.02 against 4.85 ms in all). Name `sslmode` in the URL to have it anyway.
fn loopback_without_sslmode(url: &str, host: &str) -> bool {
    let explicit = url.contains("sslmode=") || std::env::var_os("PGSSLMODE").is_some();
    let loopback = host == "localhost"
        || host.starts_with('/')
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback && !explicit
}

/// No round trip before each use of a pooled connection (sqlx pings by default): a broken
/// connection fails its statement instead, which every caller handles as a transient error,
/// and sqlx then closes it. The ping was one more round trip for each statement of the loop.
fn pool_options(settings: &DatabaseSettings) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(Duration::from_millis(settings.connect_timeout_ms))
        .test_before_acquire(false)
}

pub async fn connect(settings: &DatabaseSettings) -> Result<PgPool, sqlx::Error> {
    crate::store::agents::set_cache_limit(settings.agent_cache_kib);
    pool_options(settings)
        .connect_with(options(settings)?)
        .await
}

/// Like [`connect`] but returns at once; connections are made on first use. Lets a binary
/// start (and report not-ready) while Postgres is down.
pub fn connect_lazy(settings: &DatabaseSettings) -> Result<PgPool, sqlx::Error> {
    // How the pool's rows decode agents: set with the pool, from the same settings.
    crate::store::agents::set_cache_limit(settings.agent_cache_kib);
    Ok(pool_options(settings).connect_lazy_with(options(settings)?))
}

/// Opens and closes one connection: a failure says why the server cannot be reached, where a
/// pool would only time out.
pub async fn probe(settings: &DatabaseSettings) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let conn = sqlx::PgConnection::connect_with(&options(settings)?).await?;
    conn.close().await
}

/// Applies the migrations on a connection of their own without `statement_timeout` or
/// `lock_timeout` (an index built on a large table may take longer than any statement of the
/// loop should, and a table's lock may be a while coming), which is closed afterwards rather
/// than handed back to the pool with those settings.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    let mut conn = pool.acquire().await?;
    conn.close_on_drop();
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    sqlx::query("SET lock_timeout = 0")
        .execute(&mut *conn)
        .await?;
    MIGRATOR.run(&mut *conn).await
}

/// Whether Postgres answers a trivial query (readiness probes).
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query("SELECT 1").execute(pool).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::loopback_without_sslmode as plain;

    #[test]
    fn tls_is_left_out_only_on_loopback_and_only_unless_asked_for() {
        if std::env::var_os("PGSSLMODE").is_some() {
            return; // the environment asks explicitly: nothing to decide
        }
        assert!(plain("postgres://u@127.0.0.1:5432/db", "127.0.0.1"));
        assert!(plain("postgres://u@localhost/db", "localhost"));
        assert!(plain("postgres://u@[::1]:5432/db", "::1"));
        assert!(!plain(
            "postgres://u@127.0.0.1/db?sslmode=require",
            "127.0.0.1"
        ));
        assert!(!plain("postgres://u@db.internal:5432/db", "db.internal"));
        assert!(!plain("postgres://u@10.0.0.5:5432/db", "10.0.0.5"));
    }
}
