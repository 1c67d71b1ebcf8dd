-- The active-runs quota (api/src/quota.rs, store::runs::count_active_upto) counts the items of
-- a tenant's batches still being created as the runs they will be. Without this index that
-- count walks every tenant's unfinished batches (`batches_unfinished`) or the tenant's whole
-- batch history (`batches_tenant_created`); with it, only the tenant's batches in creation.
CREATE INDEX batches_creating_by_tenant ON batches (tenant_id) WHERE status = 'creating';
