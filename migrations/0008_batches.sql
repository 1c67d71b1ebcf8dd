-- Batches as a resource (`/v1/batches`, api/src/batch_driver.rs, store/batches.rs).
--
-- A submission writes its batch row and one item per run (custom_id, position, the run
-- request) in one statement and is answered at once; the runs are then created in chunks,
-- each chunk one transaction that creates its runs and sets their items' `run_id` together,
-- under the batch row's lock: an item never gets two runs, and a crash between chunks leaves
-- exactly the items without `run_id` to do. Whoever holds the lease (`lease_owner`,
-- `lease_expires_at`) drives the batch: the replica that took the submission, or, once the
-- lease has expired, any replica's periodic sweep.
CREATE TABLE batches (
    id               uuid PRIMARY KEY,
    tenant_id        uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- creating: runs still being created; in_progress: every item has its run (or its
    -- error); completed: every run ended; cancelling: cancelled, its runs being cancelled;
    -- cancelled: every run ended after a cancel.
    status           text NOT NULL,
    total            integer NOT NULL,
    metadata         jsonb NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key  text,
    request_hash     bytea,
    -- The tenant had a running limit when the batch was submitted: its runs are created held.
    fair             boolean NOT NULL DEFAULT false,
    lease_owner      text,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    CONSTRAINT batches_valid CHECK (
        status IN ('creating', 'in_progress', 'completed', 'cancelling', 'cancelled')
        AND total >= 1
        AND jsonb_typeof(metadata) = 'object'
        AND length(idempotency_key) BETWEEN 1 AND 255
        AND (status IN ('completed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT batches_idempotency UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX batches_tenant_created ON batches (tenant_id, created_at DESC, id DESC);
-- The periodic sweep's list: batches not yet finished.
CREATE INDEX batches_unfinished ON batches (status)
    WHERE status IN ('creating', 'in_progress', 'cancelling');

CREATE TABLE batch_items (
    batch_id  uuid NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    position  integer NOT NULL,
    custom_id text NOT NULL CHECK (length(custom_id) BETWEEN 1 AND 128),
    -- The run request, until its run exists (then the run holds it, and this is cleared).
    body      jsonb,
    run_id    uuid,
    -- Why the item got no run (its thread was busy or gone when its chunk came): terminal.
    error     jsonb,
    PRIMARY KEY (batch_id, position),
    CONSTRAINT batch_items_custom_id UNIQUE (batch_id, custom_id)
);
-- The items still to create, in order: what a chunk takes and what `pending` counts.
CREATE INDEX batch_items_pending ON batch_items (batch_id, position)
    WHERE run_id IS NULL AND error IS NULL;

-- A batch's runs. No default, so adding it rewrites nothing. Both indexes are partial on
-- `batch_id IS NOT NULL`: a run outside a batch has no entry in either, so creating, claiming
-- and ending it costs nothing more (`batch_id` never changes, so it blocks no HOT update).
-- No foreign key: `runs` is the hot table, and the batch driver is its only writer.
ALTER TABLE runs ADD COLUMN batch_id uuid;
-- Counts per status and usage of one batch (`GROUP BY status`).
CREATE INDEX runs_batch ON runs (batch_id) WHERE batch_id IS NOT NULL;
-- A batch's runs not yet ended: the completion check is one probe, and cancelling a batch
-- walks exactly what is left. A run leaves it when it ends.
CREATE INDEX runs_batch_active ON runs (batch_id)
    WHERE batch_id IS NOT NULL
      AND status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation');
