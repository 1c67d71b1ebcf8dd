-- Plan-and-solve (`agent.mode = plan_and_solve`; docs/architecture.md "Plan and solve").
--
-- A planner run fans a round of tasks out as child runs. The `plan` call's turn commit creates
-- the children and moves the parent to `waiting_for_tasks` (no lease, no worker slot); tasks
-- beyond the plan's `max_parallel` wait as `waiting_for_slot` (never published, never claimed,
-- never dispatched). When a task ends, the trigger below, in the transaction of that end,
-- releases the round's next waiting task and, once none of the round is left, makes the parent
-- `queued` again, so the fan-in can neither be skipped nor happen twice.
ALTER TABLE runs
    -- A task: the planner run that created it, its round and its place in the round.
    ADD COLUMN parent_run_id uuid,
    -- A task: its round. A planner: the rounds created so far (the last one's number).
    ADD COLUMN plan_round integer NOT NULL DEFAULT 0,
    ADD COLUMN task_index integer,
    ADD COLUMN task_title text,
    -- A planner: prompt + completion tokens of its ended tasks (their own figures stay theirs).
    ADD COLUMN task_tokens bigint NOT NULL DEFAULT 0;

-- The one CHECK of `runs` (0003 explains why one), with the new statuses and the task columns.
ALTER TABLE runs
    DROP CONSTRAINT runs_valid,
    ADD CONSTRAINT runs_valid CHECK (
        status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                   'completed', 'failed', 'cancelled', 'waiting_for_thread',
                   'waiting_for_tasks', 'waiting_for_slot')
        AND jsonb_typeof(metadata) = 'object'
        AND length(idempotency_key) BETWEEN 1 AND 255
        AND max_iterations BETWEEN 1 AND 10000
        AND iteration BETWEEN 0 AND max_iterations
        AND (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
        AND (status IN ('waiting_for_input', 'waiting_for_confirmation')) = (pending IS NOT NULL)
        AND (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)
        AND (status <> 'failed' OR error IS NOT NULL)
        AND (status = 'waiting_for_thread') = (queued_input IS NOT NULL)
        AND (parent_run_id IS NULL) = (task_index IS NULL)
        AND (status <> 'waiting_for_slot' OR parent_run_id IS NOT NULL)
        AND plan_round >= 0 AND task_tokens >= 0);

-- A plan's tasks, by round and place: a round's tasks are created once (a replayed turn
-- commit cannot make them twice), and the fan-in counts a round's unfinished tasks here.
-- Only tasks have an entry.
CREATE UNIQUE INDEX runs_tasks ON runs (parent_run_id, plan_round, task_index)
    WHERE parent_run_id IS NOT NULL;

-- One active run per thread, a waiting planner and a waiting task included.
CREATE UNIQUE INDEX runs_one_active_per_thread_0034 ON runs (thread_id)
    WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                     'waiting_for_tasks', 'waiting_for_slot');
DROP INDEX runs_one_active_per_thread;
ALTER INDEX runs_one_active_per_thread_0034 RENAME TO runs_one_active_per_thread;

-- A batch's runs not yet ended (0008), a planner waiting for its tasks included: the batch
-- is not finished while it waits. (Tasks belong to no batch.)
CREATE INDEX runs_batch_active_0034 ON runs (batch_id)
    WHERE batch_id IS NOT NULL
      AND status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                     'waiting_for_tasks');
DROP INDEX runs_batch_active;
ALTER INDEX runs_batch_active_0034 RENAME TO runs_batch_active;

-- The promotion of double-texting (0010) also when a waiting planner ends (a cancel).
DROP TRIGGER runs_promote_waiting ON runs;
CREATE TRIGGER runs_promote_waiting AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                         'waiting_for_tasks', 'waiting_for_slot')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_promote_waiting();

-- The fan-in, in the transaction that ends a task, whoever ends it (a turn commit, `end_many`,
-- `fail`, a cancel). The parent's row is locked first: two tasks of a round ending at once
-- count one after the other, and the second count (a new statement, a new snapshot) sees the
-- first end, so exactly one of them makes the parent runnable. The task's tokens join the
-- parent's `task_tokens` (the parent's budget counts them). The ender publishes what became
-- runnable after its commit; the sweeper re-publishes or dispatches it if that is lost.
CREATE FUNCTION runs_task_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_status text;
    parent_round integer;
BEGIN
    SELECT status, plan_round INTO parent_status, parent_round FROM runs
     WHERE id = NEW.parent_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE runs SET task_tokens = task_tokens + NEW.prompt_tokens + NEW.completion_tokens
                                  + NEW.task_tokens
     WHERE id = NEW.parent_run_id;
    IF parent_status <> 'waiting_for_tasks' OR parent_round <> NEW.plan_round THEN
        RETURN NULL;
    END IF;
    -- A waiting task another transaction has locked is passed over: only a cancel of the
    -- planner locks them (before the planner's row, so waiting for it here could deadlock),
    -- and it cancels them.
    UPDATE runs SET status = 'queued', held = fair, enqueued_at = now(), updated_at = now()
     WHERE id = (SELECT id FROM runs
                  WHERE parent_run_id = NEW.parent_run_id AND plan_round = NEW.plan_round
                    AND status = 'waiting_for_slot'
                  ORDER BY task_index LIMIT 1 FOR UPDATE SKIP LOCKED);
    IF NOT EXISTS (SELECT 1 FROM runs
                    WHERE parent_run_id = NEW.parent_run_id AND plan_round = NEW.plan_round
                      AND status NOT IN ('completed', 'failed', 'cancelled')) THEN
        UPDATE runs SET status = 'queued', held = fair, enqueued_at = now(), updated_at = now()
         WHERE id = NEW.parent_run_id;
    END IF;
    RETURN NULL;
END $$;

-- Evaluated without calling the function: a run that is no task never calls it.
CREATE TRIGGER runs_task_ended AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND OLD.status IN ('queued', 'running', 'waiting_for_input',
                             'waiting_for_confirmation', 'waiting_for_slot')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_task_ended();
