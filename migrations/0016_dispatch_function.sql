-- Fair dispatch in one round trip (store::dispatch::next). The tenant rows are locked first,
-- then the dispatch query runs: in a VOLATILE function each statement takes a new snapshot
-- (READ COMMITTED), so the query sees every dispatch that committed before the lock was
-- granted, as the second statement of a transaction would. Called outside an explicit
-- transaction, the call also commits in the same round trip: the tenant rows stay locked for
-- one statement and its commit instead of three round trips.
CREATE FUNCTION dispatch_held(tenant_ids uuid[], default_limit bigint, max_per_tenant bigint)
RETURNS TABLE (tenant_id uuid, run_id uuid)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    -- In id order, so two dispatchers of overlapping tenants cannot deadlock.
    PERFORM 1 FROM tenants WHERE id = ANY(tenant_ids) ORDER BY id FOR UPDATE;
    RETURN QUERY
    WITH t AS (
        SELECT tn.id, COALESCE((tn.limits->>'max_running_runs')::bigint, default_limit) AS lim
        FROM tenants tn WHERE tn.id = ANY(tenant_ids) AND tn.suspended_at IS NULL),
     free AS (
        SELECT t.id,
               CASE WHEN t.lim <= 0 THEN max_per_tenant
                    ELSE LEAST(max_per_tenant, GREATEST(0, t.lim - (
                        SELECT count(*) FROM runs r
                        WHERE r.tenant_id = t.id AND r.status IN ('queued', 'running')
                          AND NOT r.held)))
               END AS n
        FROM t),
     pick AS (
        SELECT p.id FROM free f CROSS JOIN LATERAL (
            SELECT q.id FROM runs q
            WHERE q.tenant_id = f.id AND q.status = 'queued' AND q.held
            ORDER BY q.enqueued_at, q.id LIMIT f.n) p)
    UPDATE runs r SET held = false, enqueued_at = now(), updated_at = now()
    FROM pick WHERE r.id = pick.id AND r.status = 'queued' AND r.held
    RETURNING r.tenant_id, r.id;
END
$$;
