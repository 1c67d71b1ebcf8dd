-- MCP tool servers a tenant registers (shared/src/store/mcp_servers.rs, docs/tools.md). An
-- agent's `mcp` tool names one by `name`. Header values (auth tokens) are sealed with
-- ChaCha20-Poly1305 under `mcp.encryption_key` (`headers_sealed`: nonce || ciphertext of the
-- JSON list of [name, value] pairs, the row's id as associated data, so a sealed value cannot
-- be moved to another row); only their names are kept in clear, for display.
CREATE TABLE mcp_servers (
    id             uuid PRIMARY KEY,
    tenant_id      uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    url            text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    description    text NOT NULL DEFAULT '' CHECK (length(description) <= 1000),
    header_names   text[] NOT NULL DEFAULT '{}',
    headers_sealed bytea,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
