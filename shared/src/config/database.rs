//! `[database]`: the Postgres server, its pool and the time limits of its statements.

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// The database. A server on this host (loopback or a Unix socket) is reached without TLS
    /// unless the URL names `sslmode` (TLS there protects nothing and costs Postgres about 7 %
    /// of its CPU per run; see `db::options`).
    pub url: String,
    /// Connections of a process's pool. Each grouped write in flight
    /// (`api.create_groups_in_flight`, `worker.write_groups_in_flight`) keeps its own
    /// connection besides these.
    pub max_connections: u32,
    /// How long taking a connection from the pool may wait (a new connection included) before
    /// the statement fails.
    pub connect_timeout_ms: u64,
    /// Apply migrations when a binary starts (the `migrate` subcommand always can).
    pub migrate_on_start: bool,
    /// How long a migration waits for a table's lock (`lock_timeout` of its connection; 0: no
    /// limit) before it is rolled back and tried again: while a migration that alters a table
    /// waits for the transactions using it, every later statement on that table queues behind
    /// it. At most half of a non-zero `database.lock_timeout_ms`
    /// ([`DatabaseSettings::migration_lock_timeout`]), so a statement queued behind a waiting
    /// migration never fails first (docs/operations.md, "Upgrade"). 0–600000.
    pub migration_lock_timeout_ms: u64,
    /// Attempts of the migrations, in all, while a lock wait is what fails them (backing off
    /// 0.5–10 s between them, jittered): then the binary fails with `… canceling statement due
    /// to lock timeout`. Waiting for another process that applies the migrations is such a
    /// lock wait too. 1–1000.
    pub migration_attempts: u32,
    /// Postgres ends a transaction left idle this long (a frozen or partitioned process), so
    /// its row locks cannot block other workers' claims. Positive, and below
    /// `worker.lease_ms`.
    pub idle_in_transaction_timeout_ms: u64,
    /// Postgres cancels any statement of the API or a worker running longer
    /// (`statement_timeout`; 0: never), so a statement stalled for any reason (a lock held
    /// elsewhere when `database.lock_timeout_ms` is off, a stalled disk) fails instead of
    /// holding the runs grouped with it: the worker hands such a run back (counted by
    /// `worker.max_handbacks`) and the API answers 503 `unavailable`. A grouped write also
    /// gives up on its own a second later, in case the server cannot answer at all.
    /// Migrations and the operator subcommands of `agentfleet-api` (`tenants`, `keys`,
    /// `admin`) run without it.
    pub statement_timeout_ms: u64,
    /// Postgres fails any statement of the API or a worker that waits longer than this for a
    /// lock (`lock_timeout`, SQLSTATE 55P03; 0: never), at most half of a non-zero
    /// `database.statement_timeout_ms` (capped there: [`DatabaseSettings::lock_timeout`]).
    /// Shorter than the statement's, it tells a wait on a row locked elsewhere from a slow
    /// statement: a worker writes a group that met a locked row again item by item (within
    /// the group's time limit), so only the runs on locked rows are handed back (counted)
    /// while the rest of the group is written (a group cancelled by
    /// `database.statement_timeout_ms` fails whole); the API answers 503 `unavailable`.
    /// Migrations and the operator subcommands of `agentfleet-api` run without it.
    pub lock_timeout_ms: u64,
    /// Postgres plans each prepared statement once per connection (`plan_cache_mode =
    /// force_generic_plan`) instead of re-planning it with each call's values: every hot
    /// statement has the same best plan whatever its values, and planning the grouped writes
    /// cost Postgres about a fifth of its CPU per run.
    pub generic_plans: bool,
    /// Agent specs (KiB of their JSON) a process keeps parsed, so that the runs of one agent
    /// share one parse (`store::agents`; the parsed form takes several times the text). 0
    /// keeps none; at most 1048576 (1 GiB).
    pub agent_cache_kib: usize,
}

impl DatabaseSettings {
    /// How long a grouped write waits for its answer before it gives up on the connection:
    /// a second past `statement_timeout_ms`, so the server's own cancel (which keeps the
    /// connection) normally answers first. `None` when statements have no time-out.
    pub fn write_timeout(&self) -> Option<std::time::Duration> {
        (self.statement_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(self.statement_timeout_ms + 1000))
    }

    /// The `lock_timeout` of a migration's connection, in ms (0: never):
    /// `migration_lock_timeout_ms`, capped at half of a non-zero [`Self::lock_timeout`]. The
    /// fleet's statements queued behind a migration's waiting `ALTER TABLE` wait for it as for
    /// any lock; capped, the migration always gives up first and they go on.
    pub fn migration_lock_timeout(&self) -> u64 {
        match (self.migration_lock_timeout_ms, self.lock_timeout()) {
            (0, _) => 0,
            (migration, 0) => migration,
            (migration, fleet) => migration.min(fleet / 2).max(1),
        }
    }

    /// The `lock_timeout` connections carry, in ms (0: never): `lock_timeout_ms`, capped at
    /// half of a non-zero `statement_timeout_ms`, so that a wait for a lock always ends before
    /// the statement's own cancel would fail its whole group (a deployment that lowered only
    /// the statement's time-out keeps a working pair).
    pub fn lock_timeout(&self) -> u64 {
        match (self.lock_timeout_ms, self.statement_timeout_ms) {
            (0, _) => 0,
            (lock, 0) => lock,
            (lock, statement) => lock.min(statement / 2).max(1),
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.migration_lock_timeout_ms > 600_000 {
            return Err(invalid(
                "database.migration_lock_timeout_ms",
                "must be within 0..=600000 (0: no limit)",
            ));
        }
        if !(1..=1000).contains(&self.migration_attempts) {
            return Err(invalid(
                "database.migration_attempts",
                "must be within 1..=1000",
            ));
        }
        if self.agent_cache_kib > 1_048_576 {
            return Err(invalid(
                "database.agent_cache_kib",
                "must be within 0..=1048576 (1 GiB)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn the_lock_time_out_stays_below_the_statement_time_out_or_off() {
        let effective = |lock: &str, statement: &str| {
            load(&[
                ("database.lock_timeout_ms", lock),
                ("database.statement_timeout_ms", statement),
            ])
            .unwrap()
            .database
            .lock_timeout()
        };
        assert_eq!(load(&[]).unwrap().database.lock_timeout(), 5000);
        let migration =
            |pairs: &[(&str, &str)]| load(pairs).unwrap().database.migration_lock_timeout();
        assert_eq!(migration(&[]), 2000, "within the fleet's default");
        assert_eq!(
            migration(&[("database.lock_timeout_ms", "1000")]),
            500,
            "half of the fleet's: a statement queued behind it never fails first"
        );
        assert_eq!(
            migration(&[("database.lock_timeout_ms", "0")]),
            2000,
            "the fleet waits forever"
        );
        assert_eq!(migration(&[("database.migration_lock_timeout_ms", "0")]), 0);
        assert_eq!(effective("4000", "10000"), 4000);
        assert_eq!(effective("10000", "10000"), 5000, "capped at half");
        assert_eq!(effective("5000", "500"), 250, "capped at half");
        assert_eq!(
            effective("5000", "1"),
            1,
            "never 0 (which would mean never)"
        );
        assert_eq!(effective("5000", "0"), 5000, "statements without a limit");
        assert_eq!(effective("0", "500"), 0, "off");
    }
}
