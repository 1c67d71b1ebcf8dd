-- Webhooks (shared/src/store/webhooks.rs, api/src/webhooks/). A tenant registers endpoints;
-- every state change it subscribed to writes one row per endpoint into the outbox
-- `webhook_deliveries` IN THE SAME TRANSACTION as the change, so a delivery exists exactly
-- when the change committed. The API's deliverer sends due rows, signed, and records each
-- attempt on the row.

-- `secret` is kept as issued (`whsec_<base64>`): signing needs it, so it cannot be hashed
-- like an API key. It is shown once, at creation; the API never returns it again.
CREATE TABLE webhook_endpoints (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url         text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    events      text[] NOT NULL CHECK (cardinality(events) BETWEEN 1 AND 32),
    secret      text NOT NULL CHECK (secret LIKE 'whsec\_%'),
    description text NOT NULL DEFAULT '' CHECK (length(description) <= 1000),
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- The trigger below probes this index once per qualifying run transition: for a tenant
-- without endpoints, that probe finds nothing and is all webhooks cost it.
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant_id, created_at);

-- The outbox. `id` is the delivery's stable id (`webhook-id`), the same on every attempt.
-- `body` is the exact JSON sent, fixed when the change committed. A pending row is due at
-- `next_attempt_at`; a claim pushes `next_attempt_at` one lease ahead, so a replica that dies
-- between its claim and the send leaves the row due again when the lease ends.
-- Deleting an endpoint deletes its deliveries: pending ones are never sent.
CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY,
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    tenant_id        uuid NOT NULL,
    event            text NOT NULL,
    body             jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz,
    last_status_code integer,
    last_error       text CHECK (length(last_error) <= 1000),
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT webhook_deliveries_finished CHECK ((status <> 'pending') = (finished_at IS NOT NULL))
);
-- Due deliveries, oldest due first: the deliverer's claim.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
-- Finished deliveries by age: their removal after `webhooks.keep_finished_ms`.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (finished_at) WHERE status <> 'pending';
-- An endpoint's deliveries, newest first: `GET /v1/webhooks/{id}/deliveries`.
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at DESC, id DESC);

-- The run events: `run.<new status>`, for the statuses below, with the run as it is after
-- the change. Called by the trigger on `runs`, so every path that changes a status (the
-- worker's fenced writes, the API's cancel, the sweeper's failures, and any added later)
-- writes its outbox rows in its own transaction.
CREATE FUNCTION webhooks_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event text;
    body  jsonb;
    n     integer;
BEGIN
    -- The cheap exit first: most tenants have no endpoint.
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant_id = NEW.tenant_id) THEN
        RETURN NULL;
    END IF;
    event := 'run.' || NEW.status;
    body := jsonb_build_object(
        'type', event,
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'run_id', NEW.id,
            'thread_id', NEW.thread_id,
            'status', NEW.status,
            'previous_status', OLD.status,
            'metadata', NEW.metadata,
            'iteration', NEW.iteration)
            || CASE WHEN NEW.pending IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('pending', NEW.pending) END
            || CASE WHEN NEW.error IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('error', NEW.error) END);
    INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event, body)
    SELECT gen_random_uuid(), e.id, e.tenant_id, event, body
      FROM webhook_endpoints e
     WHERE e.tenant_id = NEW.tenant_id AND event = ANY (e.events);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        -- Wakes the deliverers at commit (nothing is sent for a change that rolls back).
        PERFORM pg_notify('agentfleet_webhooks', '');
    END IF;
    RETURN NULL;
END
$$;

-- `WHEN` is evaluated by the executor for each updated row, before anything is queued: an
-- update that does not move a run into one of these statuses (turn commits, lease renewals,
-- claims) never calls the function.
CREATE TRIGGER runs_webhooks AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN (
        'waiting_for_input', 'waiting_for_confirmation', 'completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION webhooks_run_event();
