-- agentfleet schema. Postgres is the truth: every decision a worker makes is committed here
-- before it is announced. Constraints make impossible states unrepresentable where Postgres can.

CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Only a SHA-256 of each key is stored; the key itself is shown once at creation.
CREATE TABLE api_keys (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    label       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE threads (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX threads_tenant ON threads (tenant_id, created_at DESC);

CREATE TABLE runs (
    id                  uuid PRIMARY KEY,
    tenant_id           uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    thread_id           uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    status              text NOT NULL CHECK (status IN (
                            'queued', 'running', 'waiting_for_input',
                            'waiting_for_confirmation', 'completed', 'failed', 'cancelled')),
    agent               jsonb NOT NULL,
    metadata            jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(metadata) = 'object'),
    idempotency_key     text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_hash        bytea,
    iteration           integer NOT NULL DEFAULT 0 CHECK (iteration >= 0),
    max_iterations      integer NOT NULL CHECK (max_iterations BETWEEN 1 AND 10000),
    -- Fencing token: incremented by every claim, never decremented. Every write of a worker
    -- is conditioned on it, so a worker that lost its lease cannot overwrite the run.
    attempt             integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    -- Claims that took the run over from a worker presumed dead; poison-run detection.
    recoveries          integer NOT NULL DEFAULT 0 CHECK (recoveries >= 0),
    -- Set when a draining worker handed the run back in the middle of an iteration.
    interrupted         boolean NOT NULL DEFAULT false,
    lease_owner         text,
    lease_expires_at    timestamptz,
    pending             jsonb,
    prompt_tokens       bigint NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens   bigint NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
    error               jsonb,
    cancel_requested_at timestamptz,
    last_event_id       bigint NOT NULL DEFAULT 0 CHECK (last_event_id >= 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    -- A lease exists exactly while the run is running.
    CONSTRAINT runs_lease_iff_running CHECK (
        (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    -- A pending item (question or calls to confirm) exists exactly while the run waits.
    CONSTRAINT runs_pending_iff_waiting CHECK (
        (status IN ('waiting_for_input', 'waiting_for_confirmation')) = (pending IS NOT NULL)),
    CONSTRAINT runs_finished_iff_final CHECK (
        (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT runs_failed_has_error CHECK (status <> 'failed' OR error IS NOT NULL),
    CONSTRAINT runs_iteration_bounded CHECK (iteration <= max_iterations),
    CONSTRAINT runs_idempotency UNIQUE (tenant_id, idempotency_key)
);
-- One active run per thread.
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('queued', 'running', 'waiting_for_input', 'waiting_for_confirmation');
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at DESC, id DESC);
CREATE INDEX runs_thread_created ON runs (thread_id, created_at);
CREATE INDEX runs_expired_leases ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_queued_since ON runs (updated_at) WHERE status = 'queued';

-- Messages of a thread in order. LLM-visible messages (user, assistant, tool) build the history
-- the model sees, stored as the OpenAI chat message object in `body`; status messages only
-- inform clients and are never sent to the model.
CREATE TABLE messages (
    id              bigserial PRIMARY KEY,
    thread_id       uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    run_id          uuid REFERENCES runs (id) ON DELETE CASCADE,
    role            text NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'status')),
    is_llm_message  boolean NOT NULL,
    body            jsonb NOT NULL CHECK (jsonb_typeof(body) = 'object'),
    iteration       integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT messages_status_not_llm CHECK ((role = 'status') = (NOT is_llm_message))
);
CREATE INDEX messages_thread ON messages (thread_id, id);

-- One row per tool call the model made, recorded before it is dispatched and after it ends.
CREATE TABLE tool_calls (
    id                  uuid PRIMARY KEY,
    run_id              uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tool_call_id        text NOT NULL CHECK (length(tool_call_id) BETWEEN 1 AND 200),
    iteration           integer NOT NULL CHECK (iteration >= 1),
    position            integer NOT NULL CHECK (position >= 0),
    name                text NOT NULL,
    raw_arguments       text NOT NULL,
    arguments           jsonb,
    risk                text NOT NULL DEFAULT 'low' CHECK (risk IN ('low', 'high')),
    status              text NOT NULL CHECK (status IN (
                            'pending', 'awaiting_confirmation', 'approved', 'rejected',
                            'awaiting_input', 'running', 'succeeded', 'failed', 'skipped')),
    result              jsonb,
    error               text,
    dispatch_count      integer NOT NULL DEFAULT 0 CHECK (dispatch_count >= 0),
    decided_by          uuid REFERENCES api_keys (id),
    decided_at          timestamptz,
    decision_reason     text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    CONSTRAINT tool_calls_unique_id UNIQUE (run_id, tool_call_id),
    CONSTRAINT tool_calls_unique_position UNIQUE (run_id, iteration, position),
    CONSTRAINT tool_calls_decision_complete CHECK (
        (status IN ('approved', 'rejected')) <= (decided_at IS NOT NULL)),
    CONSTRAINT tool_calls_finished CHECK (
        (status IN ('succeeded', 'failed', 'skipped', 'rejected')) = (finished_at IS NOT NULL))
);
CREATE INDEX tool_calls_run ON tool_calls (run_id, iteration, position);

-- Per-iteration timings, so framework overhead can be measured apart from model and tools.
CREATE TABLE iterations (
    run_id          uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    iteration       integer NOT NULL,
    attempt         integer NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    model_us        bigint NOT NULL CHECK (model_us >= 0),
    tools_us        bigint NOT NULL CHECK (tools_us >= 0),
    total_us        bigint NOT NULL CHECK (total_us >= 0),
    PRIMARY KEY (run_id, iteration, attempt)
);
