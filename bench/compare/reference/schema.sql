-- The reference implementation's schema: the least a production agent-run service keeps.
-- uuid keys for what clients name (threads, runs, tool calls); message order is a bigint
-- identity, as a uuid cannot order a thread.

CREATE TABLE threads (
    id          uuid PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE runs (
    id                 uuid PRIMARY KEY,
    thread_id          uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    status             text NOT NULL
                       CHECK (status IN ('queued', 'running', 'waiting_for_input',
                                         'waiting_for_confirmation', 'completed', 'failed')),
    agent              jsonb NOT NULL,
    iteration          integer NOT NULL DEFAULT 0,
    max_iterations     integer NOT NULL CHECK (max_iterations >= 1),
    -- Fencing token: every claim increments it; every write of a worker is conditioned on it.
    attempt            integer NOT NULL DEFAULT 0,
    -- The attempt a resume found: claims since then are the tries of this holding (the first
    -- one starts it, later ones recover it; MAX_ATTEMPTS counts them).
    resumed_attempt    integer NOT NULL DEFAULT 0,
    -- While paused: what the run waits for ({kind: input, tool_call_id, question} or
    -- {kind: confirmation, tool_calls}).
    pending            jsonb,
    -- The id of the newest event a writer other than a holder numbered (the pausing event,
    -- run_resumed): the next holder numbers after it.
    last_event_id      integer NOT NULL DEFAULT 0,
    lease_owner        text,
    lease_expires_at   timestamptz,
    prompt_tokens      bigint NOT NULL DEFAULT 0,
    completion_tokens  bigint NOT NULL DEFAULT 0,
    error              jsonb,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    finished_at        timestamptz
);
CREATE INDEX runs_thread ON runs (thread_id);
-- The paused runs, for whoever answers them.
CREATE INDEX runs_waiting ON runs (updated_at)
    WHERE status IN ('waiting_for_input', 'waiting_for_confirmation');

-- The conversation as the model sees it: each body is an OpenAI chat message object.
CREATE TABLE messages (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    thread_id   uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    run_id      uuid REFERENCES runs (id) ON DELETE CASCADE,
    role        text NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    body        jsonb NOT NULL,
    iteration   integer,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- The history of a thread, in order: read before every model call.
CREATE INDEX messages_thread ON messages (thread_id, id);

-- One row per tool call the model made: recorded with the assistant message, marked running
-- before the HTTP call, settled with its result. A call to a `risk: high` tool waits
-- (awaiting_confirmation) until approved; the built-in `ask` waits (awaiting_input) for the
-- user's answer, which becomes its result.
CREATE TABLE tool_calls (
    id              uuid PRIMARY KEY,
    run_id          uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tool_call_id    text NOT NULL,
    iteration       integer NOT NULL,
    position        integer NOT NULL,
    name            text NOT NULL,
    raw_arguments   text NOT NULL,
    status          text NOT NULL
                    CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'skipped',
                                      'awaiting_input', 'awaiting_confirmation', 'approved')),
    result          jsonb,
    dispatch_count  integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    -- Also the index the worker's updates (run_id, tool_call_id) use.
    CONSTRAINT tool_calls_unique_id UNIQUE (run_id, tool_call_id)
);
