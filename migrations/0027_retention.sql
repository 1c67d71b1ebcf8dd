-- Retention of finished runs (shared/src/store/retention.rs, worker/src/retention.rs,
-- docs/operations.md "Retention").
--
-- Runs and threads are deleted from now on, which 0003 relied on not happening when it dropped
-- the foreign keys of `messages`, `tool_calls` and `iterations`: it still holds, because only
-- runs that ended or wait are removed, locked, and every writer of those rows selects the run
-- it writes for in the same statement (a fenced write needs the run running; a run's creation
-- inserts it), so nothing writes a row for a removed run.
--
-- `retention` holds only what an operator set for this tenant (e.g. {"finished_runs_days": 7}),
-- like `limits` (0004): anything absent falls back to the configured `[retention]`.
ALTER TABLE tenants
    ADD COLUMN retention jsonb NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT tenants_retention_object CHECK (jsonb_typeof(retention) = 'object');

-- A tenant's finished runs by end time: what a removal batch takes, oldest first, and the
-- backlog's count, without a scan of the runs still inside the window or still active. Partial:
-- a run gets its entry when it ends (an update that was never HOT: it changes `status`, which
-- other partial indexes name), none at creation or while it runs.
--
-- Built while the table's writes wait: on a large `runs` table, build it first with
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_finished ON runs (tenant_id, finished_at)
--       WHERE finished_at IS NOT NULL;
-- and this statement finds it (docs/operations.md, "Retention").
CREATE INDEX IF NOT EXISTS runs_finished ON runs (tenant_id, finished_at)
    WHERE finished_at IS NOT NULL;

-- The fleet's one removal schedule. Every worker may run the next batch; the one that takes the
-- advisory lock does, at `next_batch_at` at the earliest, so the pauses between batches (the duty
-- cycle, yielding under load) hold for the whole fleet, not per worker. `last_pass_at` is when
-- the backlog was last found empty, `backlog` the runs past their window when the current pass
-- began (a capped count): every worker exports both, so any of them shows the fleet's figure.
CREATE TABLE retention_state (
    id              boolean PRIMARY KEY DEFAULT true CONSTRAINT retention_state_one_row CHECK (id),
    next_batch_at   timestamptz NOT NULL DEFAULT now(),
    pass_started_at timestamptz,
    last_pass_at    timestamptz NOT NULL DEFAULT now(),
    backlog         bigint NOT NULL DEFAULT 0
);
INSERT INTO retention_state DEFAULT VALUES;
