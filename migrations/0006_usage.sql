-- Usage and budgets: what each run and each tenant spent on models and tools.
--
-- Written only by the turn commit (`store::turns::record_many`), inside the statement it
-- already runs: no round trip of its own. The new `runs` columns are not indexed, so turn
-- commits stay HOT updates (see 0003).
--
-- `estimated_tokens` is the part of prompt + completion that the worker estimated with a
-- tokenizer because the provider reported no usage for that model call; it is included in
-- `prompt_tokens`/`completion_tokens`, and reported apart so nobody mistakes it for a bill.
ALTER TABLE runs
    ADD COLUMN estimated_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN tool_calls integer NOT NULL DEFAULT 0;

-- Per tenant and UTC day. `tool_calls` counts the calls the model made (as recorded with its
-- turn, whatever became of them); `runs` counts the runs whose first model turn was that day.
CREATE TABLE usage_daily (
    tenant_id         uuid   NOT NULL,
    day               date   NOT NULL,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    estimated_tokens  bigint NOT NULL DEFAULT 0,
    tool_calls        bigint NOT NULL DEFAULT 0,
    runs              bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
) WITH (fillfactor = 80);
