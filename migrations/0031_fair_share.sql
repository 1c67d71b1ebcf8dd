-- Fair share with no configuration (shared/src/store/fair_dispatch.rs, docs/architecture.md
-- "Fair dispatch").
--
-- Every tenant gets a dispatch window: at most `window` of its runs in flight (queued and
-- published, or running) at once; the rest wait `held` and are dispatched as its runs end.
-- The window is `fair_share.window_per_slot` times the fleet's slots (at least
-- `fair_share.min_window`), so a tenant alone fills every slot and keeps as many runs again
-- queued, while a tenant that arrives later finds at most the others' windows ahead of it in
-- the queue, never their backlogs. `limits.max_running_runs` stays a hard cap below the window.

-- The fleet's slots: every worker registers its `worker.concurrency` and refreshes the row
-- each sweep tick; a row not refreshed within `fair_share.worker_ttl_ms` no longer counts
-- (a worker killed without a goodbye), and the sweeper deletes rows an hour old.
CREATE TABLE fleet_workers (
    worker_id text PRIMARY KEY,
    slots     integer NOT NULL CONSTRAINT fleet_workers_slots_positive CHECK (slots > 0),
    seen_at   timestamptz NOT NULL DEFAULT now()
);
-- The live workers' slots as an index-only scan: the grouped writers' connections refuse
-- sequential scans (store::group_commit), and a statement that needs the window is one of them.
CREATE INDEX fleet_workers_seen ON fleet_workers (seen_at) INCLUDE (slots);

-- A tenant's window: 0 when fair share is off (`per_slot` 0).
CREATE FUNCTION fair_share_window(per_slot bigint, min_window bigint, ttl_ms bigint)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN per_slot <= 0 THEN 0
           ELSE GREATEST(min_window, per_slot * COALESCE(
               (SELECT sum(slots) FROM fleet_workers
                WHERE seen_at > now() - make_interval(secs => ttl_ms / 1000.0)), 0))
           END
$$;

-- How many new runs of `tenant` may be published at once: none when the tenant already has
-- held runs (a new run does not overtake them), else what is left of its window. A create
-- publishes that many and holds the rest. Without the tenant row's lock: two creates at once
-- may both see the same free places, so the window is soft by the creates in flight
-- (`max_running_runs` is the exact cap). The count stops at the window (index-only scan of
-- `runs_active_by_tenant`).
CREATE FUNCTION fair_share_room(tenant uuid, share_window bigint)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM runs h
                     WHERE h.tenant_id = tenant AND h.status = 'queued' AND h.held) THEN 0
        ELSE GREATEST(0, share_window - (SELECT count(*) FROM (
                SELECT 1 FROM runs a
                WHERE a.tenant_id = tenant AND a.status IN ('queued', 'running') AND NOT a.held
                LIMIT share_window) inflight))
    END
$$;

-- `dispatch_held` (0016) with the fair-share window: a tenant's free places are its window
-- (or its `max_running_runs`, whichever is lower) minus its runs in flight. Only tenants with
-- held runs are locked: every run's end asks for a dispatch of its tenant, and most find
-- nothing held. A tenant held back by the fair share alone is dispatched in chunks: only once
-- an eighth of its window is free (counted before the lock; a tenant with a window of 2 × the
-- slots then still has 3/4 of the slots' worth queued), so a backlog drains with one dispatch
-- per chunk, not one per run's end. The sweeper dispatches what a race left held. The 0016
-- version stays for processes of the previous release during a rolling upgrade.
CREATE FUNCTION dispatch_held(tenant_ids uuid[], default_limit bigint, max_per_tenant bigint,
                              share_window bigint)
RETURNS TABLE (tenant_id uuid, run_id uuid)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    waiting uuid[];
BEGIN
    SELECT array_agg(tn.id ORDER BY tn.id) INTO waiting
    FROM tenants tn
    WHERE tn.id = ANY(tenant_ids)
      AND EXISTS (SELECT 1 FROM runs h
                  WHERE h.tenant_id = tn.id AND h.status = 'queued' AND h.held)
      AND (COALESCE((tn.limits->>'max_running_runs')::bigint, default_limit) > 0
           OR share_window <= 0
           OR share_window - (SELECT count(*) FROM (
                  SELECT 1 FROM runs a
                  WHERE a.tenant_id = tn.id AND a.status IN ('queued', 'running') AND NOT a.held
                  LIMIT share_window) inflight) >= GREATEST(1, share_window / 8));
    IF waiting IS NULL THEN
        RETURN;
    END IF;
    -- In id order, so two dispatchers of overlapping tenants cannot deadlock.
    PERFORM 1 FROM tenants WHERE id = ANY(waiting) ORDER BY id FOR UPDATE;
    RETURN QUERY
    WITH t AS (
        SELECT tn.id, COALESCE((tn.limits->>'max_running_runs')::bigint, default_limit) AS hard
        FROM tenants tn WHERE tn.id = ANY(waiting) AND tn.suspended_at IS NULL),
     lim AS (
        SELECT t.id,
               CASE WHEN t.hard > 0 AND share_window > 0 THEN LEAST(t.hard, share_window)
                    WHEN t.hard > 0 THEN t.hard
                    ELSE share_window
               END AS n
        FROM t),
     free AS (
        SELECT l.id,
               CASE WHEN l.n <= 0 THEN max_per_tenant
                    ELSE LEAST(max_per_tenant, GREATEST(0, l.n - (
                        SELECT count(*) FROM (
                            SELECT 1 FROM runs r
                            WHERE r.tenant_id = l.id AND r.status IN ('queued', 'running')
                              AND NOT r.held
                            LIMIT l.n) inflight)))
               END AS n
        FROM lim l),
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
