-- A plan's task is a run like any other and its webhooks fire like any run's (0009); its body
-- now also names its planner and its place in the plan, so a receiver can tell a task's
-- `run.completed` from its planner's: `data.parent_run_id` and `data.task` (`round`,
-- `task_index`, `title`), on tasks only.
CREATE OR REPLACE FUNCTION webhooks_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
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
                    ELSE jsonb_build_object('error', NEW.error) END
            || CASE WHEN NEW.parent_run_id IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object(
                        'parent_run_id', NEW.parent_run_id,
                        'task', jsonb_build_object('round', NEW.plan_round,
                                                   'task_index', NEW.task_index,
                                                   'title', NEW.task_title)) END);
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
