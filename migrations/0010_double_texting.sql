-- Double-texting (`if_busy` on `POST /v1/runs`, docs/architecture.md "Double-texting").
--
-- A run submitted with `if_busy = enqueue | interrupt` to a thread that has an active run is
-- created `waiting_for_thread`: outside `runs_one_active_per_thread`, never published, never
-- claimed, never dispatched. Its user message stays on the row (`queued_input`) until it is
-- promoted, so the active run never sees it and the thread reads user1, answer1, user2, ...
ALTER TABLE runs
    ADD COLUMN queued_input jsonb,
    -- Set by `if_busy = interrupt` on a running run: its worker ends it `cancelled` (code
    -- `interrupted`) at its next safe point, between iterations.
    ADD COLUMN interrupt_requested_at timestamptz;

-- The one CHECK of `runs` (0003 explains why one), with the new status and its input.
ALTER TABLE runs
    DROP CONSTRAINT runs_valid,
    ADD CONSTRAINT runs_valid CHECK (
        status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                   'completed', 'failed', 'cancelled', 'waiting_for_thread')
        AND jsonb_typeof(metadata) = 'object'
        AND length(idempotency_key) BETWEEN 1 AND 255
        AND max_iterations BETWEEN 1 AND 10000
        AND iteration BETWEEN 0 AND max_iterations
        AND (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
        AND (status IN ('waiting_for_input', 'waiting_for_confirmation')) = (pending IS NOT NULL)
        AND (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)
        AND (status <> 'failed' OR error IS NOT NULL)
        -- A waiting run's user message is on its row exactly until it is promoted.
        AND (status = 'waiting_for_thread') = (queued_input IS NOT NULL));

-- A thread's waiting runs in submission order. Empty unless someone double-texts, so the
-- probe every run end makes (the trigger below, `end_many`) costs one lookup in an empty index.
CREATE INDEX runs_waiting_for_thread ON runs (thread_id, enqueued_at, id)
    WHERE status = 'waiting_for_thread';

-- Promotion: when a thread's active run ends, its oldest waiting run becomes `queued` (held,
-- if its tenant has a running limit, for fair dispatch to release) and its user message joins
-- the thread, in the transaction of the end, whoever ends it (worker, cancel, sweeper). The
-- ender publishes the promoted run after commit; the sweeper re-publishes it if that is lost.
-- The WHEN clause is evaluated without calling the function: other updates cost nothing.
CREATE FUNCTION runs_promote_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_id uuid;
    next_input jsonb;
BEGIN
    SELECT id, queued_input INTO next_id, next_input FROM runs
     WHERE thread_id = NEW.thread_id AND status = 'waiting_for_thread'
     ORDER BY enqueued_at, id LIMIT 1 FOR UPDATE;
    IF next_id IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO messages (thread_id, run_id, role, is_llm_message, body)
    VALUES (NEW.thread_id, next_id, 'user', true, next_input);
    UPDATE runs SET status = 'queued', queued_input = NULL, held = fair,
                    enqueued_at = now(), updated_at = now()
     WHERE id = next_id;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_promote_waiting AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_promote_waiting();
