-- Dead letters (issue 16): a run failed as poison (taken over too many times after its worker
-- vanished) can be replayed by an operator: `replays` counts those, so a run that keeps
-- crashing its workers after a replay is visible as such; `replayed_at` is the last one.
ALTER TABLE runs
    ADD COLUMN replays int NOT NULL DEFAULT 0,
    ADD COLUMN replayed_at timestamptz;

-- `agentfleet-api admin dead-letters list`: newest first, without a scan of every failed run.
CREATE INDEX runs_dead_letters ON runs (finished_at DESC)
    WHERE status = 'failed' AND (error ->> 'code') = 'poison_run';
