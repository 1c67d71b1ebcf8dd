-- Tenant erasure (docs/operations.md, "Erasing a tenant"; shared/src/store/erasure.rs,
-- api/src/erasure.rs).
--
-- `DELETE /admin/v1/tenants/{id}` (or `agentfleet-api tenants erase`) sets `erased_at`,
-- revokes the tenant's keys and records an erasure, in one transaction; every row and Redis key
-- of the tenant is then removed in the background, in short transactions of bounded batches,
-- by whichever API replica holds the erasure's lease (any replica takes over an erasure whose
-- lease ran out, so a crash only delays it).
--
-- The tenant's row stays as a tombstone: its id is never reused, and the erasure's status and
-- its proof stay readable. When the erasure is done its name is replaced and its limits are
-- cleared: nothing of the customer is left in it but its id and creation time.
-- A nullable column without a default: only the catalog changes.
ALTER TABLE tenants ADD COLUMN erased_at timestamptz;

CREATE TABLE tenant_erasures (
    tenant_id          uuid PRIMARY KEY REFERENCES tenants (id),
    -- erasing: rows or keys may remain; done: verified empty (`remaining` all 0).
    status             text NOT NULL DEFAULT 'erasing',
    -- cancelling: its active runs are being cancelled; waiting: `erasure.grace_ms` after the
    -- last cancel (cached keys on other replicas, workers stopping); deleting; verifying;
    -- done.
    phase              text NOT NULL DEFAULT 'cancelling',
    requested_at       timestamptz NOT NULL DEFAULT now(),
    -- When a replica first worked on it.
    started_at         timestamptz,
    -- When its last active run was cancelled: deletion begins `erasure.grace_ms` later.
    quiet_since        timestamptz,
    finished_at        timestamptz,
    keys_revoked       integer NOT NULL DEFAULT 0,
    runs_cancelled     integer NOT NULL DEFAULT 0,
    redis_keys_deleted bigint NOT NULL DEFAULT 0,
    -- Rows per table when deletion began, rows deleted per table so far, and rows per table
    -- found by the last verification (all 0 once done: the proof).
    counted            jsonb,
    deleted            jsonb NOT NULL DEFAULT '{}'::jsonb,
    remaining          jsonb,
    verified_at        timestamptz,
    lease_owner        text,
    lease_expires_at   timestamptz,
    last_error         text,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenant_erasures_valid CHECK (
        status IN ('erasing', 'done')
        AND phase IN ('cancelling', 'waiting', 'deleting', 'verifying', 'done')
        AND (status = 'done') = (phase = 'done')
        AND (status = 'done') = (finished_at IS NOT NULL)
        AND length(last_error) <= 1000)
);
-- The replicas' look for erasures to drive: only those not done.
CREATE INDEX tenant_erasures_erasing ON tenant_erasures (requested_at) WHERE status = 'erasing';

-- A tool call's decision names the key that made it (`decided_by`). Keys are deleted with
-- their tenant, after its tool calls; with the foreign key, deleting a key made Postgres look
-- for calls naming it in the whole of `tool_calls` (no index holds `decided_by`), once per key.
-- The key id stays on the call; nothing but an erasure deletes keys.
ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_decided_by_fkey;
