-- Pending deliveries by tenant, oldest due first: the deliverer's claim finds the tenants with
-- due deliveries one after another and takes each one's share (store::webhook_deliveries).
CREATE INDEX webhook_deliveries_due_by_tenant
    ON webhook_deliveries (tenant_id, next_attempt_at) WHERE status = 'pending';
