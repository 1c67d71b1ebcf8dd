//! Postgres pool and migrations.

use std::time::Duration;

use backon::BackoffBuilder;
use sqlx::PgPool;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

use crate::config::DatabaseSettings;

pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

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

/// Applies the migrations on a connection of their own without `statement_timeout` (an index
/// built on a large table may take longer than any statement of the loop should), which is
/// closed afterwards rather than handed back to the pool with these settings.
///
/// A migration that alters a table waits for every transaction using that table to end, and
/// while it waits every later statement on the table queues behind it: one long transaction
/// (a report, a stuck session) would stall the whole fleet for as long as it lasts. So it
/// waits at most `database.migration_lock_timeout_ms` for a lock; past that its transaction is
/// rolled back, the table's traffic goes on, and it is tried again after a back-off, up to
/// `database.migration_attempts` times in all. The wait for another process applying the
/// migrations (sqlx's advisory lock) is a lock wait too, and is retried the same way.
pub async fn migrate(pool: &PgPool, settings: &DatabaseSettings) -> Result<(), MigrateError> {
    let locks = LockWaits {
        timeout_ms: settings.migration_lock_timeout(),
        attempts: settings.migration_attempts,
        backoff: (MIGRATION_BACKOFF_MIN, MIGRATION_BACKOFF_MAX),
    };
    apply(&MIGRATOR, pool, &locks).await.map(|_| ())
}

/// The back-off between attempts of a migration that met a lock held elsewhere: doubling from
/// the first to the second, and backon's jitter adds up to as much again (0.5–10 s in all).
/// With the defaults (30 attempts of at most 2 s) the attempts end within ~5.5 minutes, inside
/// the Helm migration Job's `activeDeadlineSeconds` (600).
const MIGRATION_BACKOFF_MIN: Duration = Duration::from_millis(500);
const MIGRATION_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How [`apply`] waits for the locks a migration needs.
struct LockWaits {
    /// `lock_timeout` of each attempt, in ms (0: none).
    timeout_ms: u64,
    attempts: u32,
    backoff: (Duration, Duration),
}

/// Applies `migrator`'s migrations, trying again while a lock wait is what fails them; the
/// number of attempts it took.
async fn apply(migrator: &Migrator, pool: &PgPool, locks: &LockWaits) -> Result<u32, MigrateError> {
    let mut backoff = backon::ExponentialBuilder::default()
        .with_min_delay(locks.backoff.0)
        .with_max_delay(locks.backoff.1)
        .with_jitter()
        .without_max_times()
        .build();
    let attempts = locks.attempts.max(1);
    for attempt in 1.. {
        match apply_once(migrator, pool, locks.timeout_ms).await {
            Ok(()) => return Ok(attempt),
            Err(e) if attempt < attempts && is_lock_wait(&e) => {
                let wait = backoff.next().unwrap_or(locks.backoff.1);
                tracing::warn!(
                    attempt,
                    attempts,
                    wait_ms = wait.as_millis() as u64,
                    lock_timeout_ms = locks.timeout_ms,
                    "a migration waited too long for a lock held by another transaction \
                     (a long transaction on the table it alters, or another process applying \
                     the migrations); it was rolled back and is tried again after the wait"
                );
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// One attempt on a fresh connection: a failed migration leaves nothing behind on it (its
/// transaction and sqlx's advisory lock end with the connection). Each migration is applied in
/// a transaction of its own, so a retry resumes after the last one recorded. (A migration
/// marked `-- no-transaction` would be run again from its start: none is, and one that is must
/// be safe to repeat.)
async fn apply_once(
    migrator: &Migrator,
    pool: &PgPool,
    lock_timeout_ms: u64,
) -> Result<(), MigrateError> {
    let mut conn = pool.acquire().await?;
    conn.close_on_drop();
    sqlx::query(
        "SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', $1, false)",
    )
    .bind(lock_timeout_ms.to_string())
    .execute(&mut *conn)
    .await?;
    migrator.run(&mut *conn).await
}

/// A statement of the migration gave up waiting for a lock (`lock_not_available`, 55P03).
fn is_lock_wait(e: &MigrateError) -> bool {
    let (MigrateError::Execute(sqlx::Error::Database(db))
    | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _)) = e
    else {
        return false;
    };
    db.code().as_deref() == Some("55P03")
}

/// Whether Postgres answers a trivial query (readiness probes).
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query("SELECT 1").execute(pool).await.is_ok()
}

#[cfg(test)]
mod migration_locks {
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use sqlx::PgPool;
    use sqlx::SqlStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    use super::{LockWaits, MIGRATOR, apply, is_lock_wait};

    /// Longer than either test needs by far: past it the migration or the table's traffic
    /// waited for the long transaction, which is what the lock timeout is there to prevent.
    const DEADLINE: Duration = Duration::from_secs(60);

    /// The project's migrations and one more, altering `runs` (the table every run writes).
    fn with_an_alter_of_runs() -> Migrator {
        let mut migrations = MIGRATOR.migrations.to_vec();
        migrations.push(Migration::new(
            9_999,
            Cow::Borrowed("alter runs (test)"),
            MigrationType::Simple,
            SqlStr::from_static("ALTER TABLE runs ADD COLUMN lock_probe int"),
            false,
        ));
        Migrator {
            migrations: Cow::Owned(migrations),
            ..Migrator::DEFAULT
        }
    }

    /// A long transaction that has read `runs`: it holds the table's lock until it ends.
    async fn long_reader(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT count(*) FROM runs")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx
    }

    async fn probe_added(pool: &PgPool) -> bool {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                            WHERE table_name = 'runs' AND column_name = 'lock_probe')",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// Someone waits for a lock on `runs` (the migration's `ALTER TABLE`).
    async fn runs_lock_awaited(pool: &PgPool) -> bool {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks
                            WHERE relation = 'runs'::regclass AND NOT granted)",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    }

    async fn poll_until(pool: &PgPool, awaited: bool) {
        while runs_lock_awaited(pool).await != awaited {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_migration_behind_a_long_transaction_gives_up_without_stalling_the_table(
        pool: PgPool,
    ) {
        let holder = long_reader(&pool).await;
        let locks = LockWaits {
            timeout_ms: 200,
            attempts: 3,
            backoff: (Duration::from_millis(50), Duration::from_millis(50)),
        };
        let migrator = with_an_alter_of_runs();
        let done = AtomicBool::new(false);
        let migrating = async {
            let result = apply(&migrator, &pool, &locks).await;
            done.store(true, Ordering::SeqCst);
            result
        };
        // The table's traffic while the migration tries: each statement queues behind the
        // waiting ALTER for at most one attempt's lock timeout, never for the long transaction.
        let traffic = async {
            let mut statements = 0;
            while !done.load(Ordering::SeqCst) {
                sqlx::query("SELECT count(*) FROM runs")
                    .execute(&pool)
                    .await
                    .unwrap();
                statements += 1;
            }
            statements
        };
        let (result, statements) =
            tokio::time::timeout(DEADLINE, async { tokio::join!(migrating, traffic) })
                .await
                .expect("neither the migration nor the table's traffic waits for the transaction");
        let err = result.expect_err("the table stays locked through every attempt");
        assert!(is_lock_wait(&err), "{err}");
        assert!(statements > 0);
        assert!(
            !probe_added(&pool).await,
            "nothing of the migration is applied"
        );
        holder.rollback().await.unwrap();
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn a_migration_behind_a_long_transaction_is_applied_once_it_ends(pool: PgPool) {
        let holder = long_reader(&pool).await;
        let locks = LockWaits {
            timeout_ms: 100,
            attempts: 1000,
            backoff: (Duration::from_millis(200), Duration::from_millis(200)),
        };
        let migrator = with_an_alter_of_runs();
        let release = async {
            // The first attempt waits for the lock and gives up; then the transaction ends.
            poll_until(&pool, true).await;
            poll_until(&pool, false).await;
            holder.rollback().await.unwrap();
        };
        let (attempts, ()) = tokio::time::timeout(DEADLINE, async {
            tokio::join!(apply(&migrator, &pool, &locks), release)
        })
        .await
        .expect("applied soon after the transaction ended");
        let attempts = attempts.expect("applied once the lock was free");
        assert!(attempts >= 2, "tried again after a lock wait: {attempts}");
        assert!(probe_added(&pool).await);
    }
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
