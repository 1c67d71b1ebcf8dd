-- Per-tenant `max_active_runs`: a create counts the tenant's runs not yet ended.
--
-- Without this, the count walks either all of the tenant's runs ever (`runs_tenant_created`)
-- or all active runs of the fleet (`runs_one_active_per_thread`). This partial index holds
-- only runs not yet ended, keyed by tenant alone (the smallest key that serves the count), so
-- the count is an index-only scan of the tenant's active runs (capped at the limit).
--
-- Its cost on the hot path: one entry per created run, and one per update of an active run
-- that is not HOT. Those updates (claim, lease renewal, pause, resume) already change
-- `status` or `lease_expires_at`, which other indexes cover, so they were never HOT; a run
-- that ends adds no entry (it leaves the predicate). Same size and upkeep as
-- `runs_one_active_per_thread`.
CREATE INDEX runs_active_by_tenant ON runs (tenant_id)
    WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation');
