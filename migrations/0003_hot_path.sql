-- The hot path (issue 13): let the writes of a running run be HOT updates.
--
-- The sweeper found queued runs whose message may be lost by `updated_at`, through an index on
-- it. Any indexed column blocks HOT, so every turn commit of a running run (which sets
-- `updated_at`) wrote a new entry into all seven indexes of `runs`. The sweeper now keys on
-- `enqueued_at`, set only when the run's message is (re-)published.
ALTER TABLE runs ADD COLUMN enqueued_at timestamptz NOT NULL DEFAULT now();
DROP INDEX runs_queued_since;
CREATE INDEX runs_queued_since ON runs (enqueued_at) WHERE status = 'queued';

-- Room on each page for the new version of a row: a HOT update needs it on the same page.
ALTER TABLE runs SET (fillfactor = 80);
ALTER TABLE tool_calls SET (fillfactor = 80);

-- The same key as the constraint tool_calls_unique_position, which has its own index.
DROP INDEX tool_calls_run;

-- Postgres rebuilds every CHECK constraint of a table from its stored text for each statement
-- that writes it (`ExecConstraints`: 11 % of Postgres's CPU in the e2e benchmark, with 16
-- constraints on `runs` alone). The rules stay, written as one constraint per table; the
-- `>= 0` checks of counters that the code only ever increments from 0 are dropped.
ALTER TABLE runs
    DROP CONSTRAINT runs_status_check,
    DROP CONSTRAINT runs_metadata_check,
    DROP CONSTRAINT runs_idempotency_key_check,
    DROP CONSTRAINT runs_iteration_check,
    DROP CONSTRAINT runs_max_iterations_check,
    DROP CONSTRAINT runs_attempt_check,
    DROP CONSTRAINT runs_recoveries_check,
    DROP CONSTRAINT runs_prompt_tokens_check,
    DROP CONSTRAINT runs_completion_tokens_check,
    DROP CONSTRAINT runs_last_event_id_check,
    DROP CONSTRAINT runs_handbacks_check,
    DROP CONSTRAINT runs_lease_iff_running,
    DROP CONSTRAINT runs_pending_iff_waiting,
    DROP CONSTRAINT runs_finished_iff_final,
    DROP CONSTRAINT runs_failed_has_error,
    DROP CONSTRAINT runs_iteration_bounded,
    ADD CONSTRAINT runs_valid CHECK (
        status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation',
                   'completed', 'failed', 'cancelled')
        AND jsonb_typeof(metadata) = 'object'
        AND length(idempotency_key) BETWEEN 1 AND 255
        AND max_iterations BETWEEN 1 AND 10000
        AND iteration BETWEEN 0 AND max_iterations
        -- A lease exists exactly while the run is running.
        AND (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
        -- A pending item (question or calls to confirm) exists exactly while the run waits.
        AND (status IN ('waiting_for_input', 'waiting_for_confirmation')) = (pending IS NOT NULL)
        AND (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)
        AND (status <> 'failed' OR error IS NOT NULL));

ALTER TABLE messages
    DROP CONSTRAINT messages_role_check,
    DROP CONSTRAINT messages_body_check,
    DROP CONSTRAINT messages_status_not_llm,
    ADD CONSTRAINT messages_valid CHECK (
        role IN ('user', 'assistant', 'tool', 'status')
        AND jsonb_typeof(body) = 'object'
        AND (role = 'status') = (NOT is_llm_message));

ALTER TABLE tool_calls
    DROP CONSTRAINT tool_calls_tool_call_id_check,
    DROP CONSTRAINT tool_calls_iteration_check,
    DROP CONSTRAINT tool_calls_position_check,
    DROP CONSTRAINT tool_calls_risk_check,
    DROP CONSTRAINT tool_calls_status_check,
    DROP CONSTRAINT tool_calls_dispatch_count_check,
    DROP CONSTRAINT tool_calls_decision_complete,
    DROP CONSTRAINT tool_calls_finished,
    ADD CONSTRAINT tool_calls_valid CHECK (
        length(tool_call_id) BETWEEN 1 AND 200
        AND iteration >= 1 AND position >= 0
        AND risk IN ('low', 'high')
        AND status IN ('pending', 'awaiting_confirmation', 'approved', 'rejected',
                       'awaiting_input', 'running', 'succeeded', 'failed', 'skipped')
        AND (status IN ('approved', 'rejected')) <= (decided_at IS NOT NULL)
        AND (status IN ('succeeded', 'failed', 'skipped', 'rejected')) = (finished_at IS NOT NULL));

ALTER TABLE iterations
    DROP CONSTRAINT iterations_model_us_check,
    DROP CONSTRAINT iterations_tools_us_check,
    DROP CONSTRAINT iterations_total_us_check;

-- Foreign keys whose parent every writer already proves: a foreign key check is one more
-- query per written row (`RI_FKey_check`) and a share lock on the parent. The rows below are
-- only ever inserted by statements that select the parent row itself (a fenced worker write
-- selects from the held run; run creation inserts or locks its thread in the same statement),
-- and nothing deletes runs, threads or tenants. The tenant's row was the worst: every run
-- creation of a tenant share-locked that one row, so concurrent creations turned its lock into
-- a MultiXact each time. `runs.thread_id` keeps its key: it is what ties a run to its thread.
ALTER TABLE messages DROP CONSTRAINT messages_thread_id_fkey, DROP CONSTRAINT messages_run_id_fkey;
ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_run_id_fkey;
ALTER TABLE iterations DROP CONSTRAINT iterations_run_id_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_tenant_id_fkey;
ALTER TABLE threads DROP CONSTRAINT threads_tenant_id_fkey;

-- Indexes a run pays for at creation and at every update that is not HOT (claim, end):
-- - the idempotency key is unique per tenant, but most runs have none: a partial unique index
--   holds only the runs that have one (same name, so a duplicate still reports it);
-- - nothing lists a tenant's threads.
ALTER TABLE runs DROP CONSTRAINT runs_idempotency;
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX threads_tenant;
