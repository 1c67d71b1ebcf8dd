-- Tenancy: per-tenant overrides of the `[limits]` defaults in config, and suspension.
--
-- `limits` holds only what an operator set for this tenant (e.g. {"max_running_runs": 4});
-- anything absent falls back to the configured default, so changing a default reaches every
-- tenant that never had its own value. A suspended tenant keeps its data and queued runs
-- (held, see 0007); its keys may still read and cancel, but nothing new of it starts.
ALTER TABLE tenants
    ADD COLUMN limits jsonb NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT tenants_limits_object CHECK (jsonb_typeof(limits) = 'object'),
    ADD COLUMN suspended_at timestamptz;
