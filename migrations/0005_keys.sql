-- Key lifecycle: a key has a name (the old free-form `label`, renamed), the time it was last
-- used (written by each API replica at most once per `api.key_last_used_flush_ms`, never per
-- request) and an optional expiry. A key is valid while it is neither revoked nor expired.
ALTER TABLE api_keys RENAME COLUMN label TO name;
-- Labels were optional (''); names are 1..=200 characters like tenant names.
UPDATE api_keys SET name = 'default' WHERE name = '';
UPDATE api_keys SET name = left(name, 200) WHERE length(name) > 200;
ALTER TABLE api_keys
    ALTER COLUMN name DROP DEFAULT,
    ADD CONSTRAINT api_keys_name_length CHECK (length(name) BETWEEN 1 AND 200),
    ADD COLUMN last_used_at timestamptz,
    ADD COLUMN expires_at timestamptz;
-- `keys list --tenant` reads a tenant's keys newest first; the old index served only the
-- foreign key.
DROP INDEX api_keys_tenant;
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at DESC);
