-- Webhook signing secrets sealed at rest, as MCP server headers are (migration 0011):
-- `secret_sealed` is nonce || ChaCha20-Poly1305 ciphertext of the `whsec_…` secret under
-- `webhooks.encryption_key`, the endpoint's id as associated data (a sealed secret cannot be
-- moved to another endpoint). A migration cannot seal: the key is the API's runtime setting,
-- never Postgres's. So the plain column stays, nullable, for the rows written before; every
-- API replica configured with the key seals what remains of them at start-up and clears
-- `secret` (api/src/webhooks/sealing.rs), and reads either form meanwhile. Exactly one of the
-- two is set on every row.
ALTER TABLE webhook_endpoints
    ALTER COLUMN secret DROP NOT NULL,
    ADD COLUMN secret_sealed bytea,
    ADD CONSTRAINT webhook_endpoints_one_secret CHECK (num_nonnulls(secret, secret_sealed) = 1);

-- The rows still plain: what the start-up step looks for (empty once the rollout is done).
CREATE INDEX webhook_endpoints_plain ON webhook_endpoints (id) WHERE secret IS NOT NULL;
