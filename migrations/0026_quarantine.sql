-- Quarantine: a run taken over more than `worker.max_recoveries` times is not failed on
-- suspicion; its next attempt runs alone in a worker, and only a take-over of that attempt
-- (its worker died holding nothing else) fails it as `poison_run`.
-- `quarantined_at`: when it first ran alone (NULL: never at the limit, or replayed since).
-- `quarantine_attempt`: the attempt that holds it alone now or held it last; a claim that
-- takes over exactly that attempt found the run's own crash.
-- Nullable columns without defaults: only the catalog changes.
ALTER TABLE runs
    ADD COLUMN quarantined_at timestamptz,
    ADD COLUMN quarantine_attempt int;

-- `agentfleet-api admin quarantine`: newest first, without a scan of every run.
CREATE INDEX runs_quarantined ON runs (quarantined_at DESC) WHERE quarantined_at IS NOT NULL;
