-- Lease renewals change only `lease_expires_at`; while an index holds that column, every renewal
-- is a non-HOT update that writes an entry into each of `runs`'s indexes (and their WAL). A
-- worker renews all its runs' leases each `worker.lease_renew_ms`, so with a thousand runs
-- waiting on their models that was most of Postgres's writing. The sweeper's look for expired
-- leases reads the running runs instead: a small partial index whose key never changes.
DROP INDEX runs_expired_leases;
CREATE INDEX runs_running ON runs (id) WHERE status = 'running';
