-- A planner waiting for its tasks and a task waiting for a slot of its round have not ended:
-- they count towards `limits.max_active_runs` like any run not yet ended (0033 counted only
-- `queued`, `running`, `waiting_for_input` and `waiting_for_confirmation`). The triggers of
-- 0033 get the wider predicate; the runs already in the two statuses are added to the deltas
-- while no run can be written (the triggers count every later change).

CREATE OR REPLACE FUNCTION runs_active_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_active_deltas (tenant_id, delta)
    SELECT tenant_id, count(*) FROM inserted_runs
    WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                     'waiting_for_tasks', 'waiting_for_slot')
    GROUP BY tenant_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION runs_active_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO tenant_active_deltas (tenant_id, delta) VALUES (OLD.tenant_id, -1);
    ELSIF NEW.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                         'waiting_for_tasks', 'waiting_for_slot') THEN
        INSERT INTO tenant_active_deltas (tenant_id, delta) VALUES (NEW.tenant_id, 1);
    ELSE
        INSERT INTO tenant_active_deltas (tenant_id, delta) VALUES (NEW.tenant_id, -1);
    END IF;
    RETURN NULL;
END
$$;

LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE;

DROP TRIGGER runs_active_updated ON runs;
CREATE TRIGGER runs_active_updated AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN ((OLD.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                          'waiting_for_tasks', 'waiting_for_slot'))
          IS DISTINCT FROM
          (NEW.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                          'waiting_for_tasks', 'waiting_for_slot')))
    EXECUTE FUNCTION runs_active_changed();
DROP TRIGGER runs_active_deleted ON runs;
CREATE TRIGGER runs_active_deleted AFTER DELETE ON runs
    FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                         'waiting_for_tasks', 'waiting_for_slot'))
    EXECUTE FUNCTION runs_active_changed();

INSERT INTO tenant_active_deltas (tenant_id, delta)
SELECT tenant_id, count(*) FROM runs
WHERE status IN ('waiting_for_tasks', 'waiting_for_slot')
GROUP BY tenant_id;
