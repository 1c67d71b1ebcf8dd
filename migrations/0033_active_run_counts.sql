-- Every tenant's runs not yet ended, kept by triggers as deltas (shared/src/store/active_runs.rs),
-- so `limits.max_active_runs` is checked by summing a few rows instead of counting the
-- tenant's active runs (a count of 12,000 active runs, made under the tenant's creation lock,
-- held a limited tenant's creates to about 35 a second).
--
-- Deltas, not one counter row per tenant: an insert takes no row lock, so the ends of one
-- tenant's runs on many connections never queue behind each other, and no two transactions
-- can deadlock over counters of several tenants. The sweeper folds each tenant's deltas into
-- one row (`store::active_runs::fold`), so a sum reads a handful of rows.
CREATE TABLE tenant_active_deltas (
    tenant_id uuid   NOT NULL,
    delta     bigint NOT NULL
);
CREATE INDEX tenant_active_deltas_tenant ON tenant_active_deltas (tenant_id) INCLUDE (delta);

-- A run is active while `queued`, `running`, `waiting_for_input` or
-- `waiting_for_confirmation` (the predicate of `runs_active_by_tenant`).

-- Inserts: one delta per tenant and statement (a batch of 1,000 runs writes one row).
CREATE FUNCTION runs_active_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_active_deltas (tenant_id, delta)
    SELECT tenant_id, count(*) FROM inserted_runs
    WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')
    GROUP BY tenant_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_active_inserted AFTER INSERT ON runs
    REFERENCING NEW TABLE AS inserted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runs_active_inserted();

-- Updates and deletes: per row, but `WHEN` is evaluated by the executor before anything is
-- queued, so only a run that starts or stops being active (an end, a promotion from
-- `waiting_for_thread`, a deletion of an active run) calls the function; claims, turn commits
-- and lease renewals do not.
CREATE FUNCTION runs_active_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO tenant_active_deltas (tenant_id, delta) VALUES (OLD.tenant_id, -1);
    ELSIF NEW.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation') THEN
        INSERT INTO tenant_active_deltas (tenant_id, delta) VALUES (NEW.tenant_id, 1);
    ELSE
        INSERT INTO tenant_active_deltas (tenant_id, delta) VALUES (NEW.tenant_id, -1);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_active_updated AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN ((OLD.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation'))
          IS DISTINCT FROM
          (NEW.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')))
    EXECUTE FUNCTION runs_active_changed();
CREATE TRIGGER runs_active_deleted AFTER DELETE ON runs
    FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation'))
    EXECUTE FUNCTION runs_active_changed();

-- Each of `tenants`' active runs with the items of its batches not yet created (each will be a
-- run), as of the statement: the sum of its deltas and the pending items
-- (`batches_creating_by_tenant`). `store::active_runs::count` reads it without a lock.
CREATE FUNCTION count_active(tenants uuid[])
RETURNS TABLE (tenant_id uuid, active bigint)
LANGUAGE sql STABLE
AS $$
    SELECT t.id,
           COALESCE((SELECT sum(d.delta) FROM tenant_active_deltas d WHERE d.tenant_id = t.id), 0)::int8
           + (SELECT count(*) FROM batches b
              JOIN batch_items i ON i.batch_id = b.id AND i.run_id IS NULL AND i.error IS NULL
              WHERE b.tenant_id = t.id AND b.status = 'creating')
    FROM (SELECT DISTINCT u AS id FROM unnest(tenants) AS u) t
$$;

-- The creation locks of `tenants` (transaction-scoped two-key advisory locks in the namespace
-- 1634099570, "afar"; the second key is the last 32 bits of the tenant's id), taken in key order
-- so two callers never deadlock, then `count_active` in a statement of its own (a new snapshot:
-- it sees every create that committed before a lock was granted). Called by the insert of
-- grouped creates (`store::create_many`), so a limited tenant's creates are locked, counted and
-- written by one statement, and by `store::active_runs::reserve`.
CREATE FUNCTION lock_and_count_active(tenants uuid[])
RETURNS TABLE (tenant_id uuid, active bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1634099570, k.key)
    FROM (SELECT DISTINCT ('x' || right(replace(t::text, '-', ''), 8))::bit(32)::int4 AS key
          FROM unnest(tenants) AS t) k
    ORDER BY k.key;
    RETURN QUERY SELECT c.tenant_id, c.active FROM count_active(tenants) c;
END
$$;

-- The runs already there, counted while no run can be written (the triggers count every later
-- change).
LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO tenant_active_deltas (tenant_id, delta)
SELECT tenant_id, count(*) FROM runs
WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')
GROUP BY tenant_id;
