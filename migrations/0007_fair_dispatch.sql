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

-- A tenant's runs not yet ended, for two counts of one tenant: its runs in flight (`NOT held`
-- and queued or running), counted under its tenant row lock before dispatching more, and its
-- active runs for `limits.max_active_runs` (api/src/quota.rs), capped at the limit. Both are
-- index-only scans of the tenant's prefix. Its cost on the hot path: an entry per created run
-- and per non-HOT update of an active run; the updates that change `status` or `held` were
-- never HOT (other partial indexes name both), and a run that ends leaves the predicate.
--
-- `status` is carried (INCLUDE), not a key column: as a key column, a generic plan made while
-- the table was small chose this index for every fenced write's `status = 'running'` (a scan
-- of all active runs instead of one primary-key probe per run), which cost the hot path a
-- fifth of its Postgres CPU. Included, it still filters the in-flight count without the heap.
CREATE INDEX runs_active_by_tenant ON runs (tenant_id, held) INCLUDE (status)
    WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation');
