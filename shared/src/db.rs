//! Postgres pool and migrations.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::DatabaseSettings;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

fn options(settings: &DatabaseSettings) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = settings.url.parse()?;
    let options = options.options([(
        "idle_in_transaction_session_timeout",
        settings.idle_in_transaction_timeout_ms.to_string(),
    )]);
    if settings.generic_plans {
        return Ok(options.options([("plan_cache_mode", "force_generic_plan")]));
    }
    Ok(options)
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
    pool_options(settings)
        .connect_with(options(settings)?)
        .await
}

/// Like [`connect`] but returns at once; connections are made on first use. Lets a binary
/// start (and report not-ready) while Postgres is down.
pub fn connect_lazy(settings: &DatabaseSettings) -> Result<PgPool, sqlx::Error> {
    Ok(pool_options(settings).connect_lazy_with(options(settings)?))
}

/// Opens and closes one connection: a failure says why the server cannot be reached, where a
/// pool would only time out.
pub async fn probe(settings: &DatabaseSettings) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let conn = sqlx::PgConnection::connect_with(&options(settings)?).await?;
    conn.close().await
}

pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

/// Whether Postgres answers a trivial query (readiness probes).
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query("SELECT 1").execute(pool).await.is_ok()
}
