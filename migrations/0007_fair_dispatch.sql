-- Fair dispatch (store/dispatch.rs). A run of a tenant with a running limit
-- (`max_running_runs` > 0) is created `held`: queued in Postgres but not published. It is
-- dispatched (held = false, then published) when its tenant has fewer runs in flight
-- (queued and published, or running) than its limit, oldest first.
--
-- `fair` remembers that the run counts against such a limit, so whoever ends or pauses it
-- knows to dispatch the next run of its tenant. A held run is never claimed.
ALTER TABLE runs
    ADD COLUMN held boolean NOT NULL DEFAULT false,
    ADD COLUMN fair boolean NOT NULL DEFAULT false;

-- The sweeper re-publishes queued runs whose message seems lost: held runs have none.
DROP INDEX runs_queued_since;
CREATE INDEX runs_queued_since ON runs (enqueued_at) WHERE status = 'queued' AND NOT held;

-- A tenant's held runs, oldest first.
CREATE INDEX runs_held ON runs (tenant_id, enqueued_at, id) WHERE status = 'queued' AND held;

-- A tenant's runs in flight, counted under its tenant row lock before dispatching more.
CREATE INDEX runs_in_flight ON runs (tenant_id) WHERE status IN ('queued', 'running') AND NOT held;
