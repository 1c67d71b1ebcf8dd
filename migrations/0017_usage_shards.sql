-- Usage per tenant and UTC day, in shards.
--
-- The turn commit (store::turns::record_many) upserted one `usage_daily` row per tenant and
-- day, and held that row's lock until its commit: every turn group of every worker serving a
-- tenant waited for the previous group's commit, WAL flush included. Turn commits now add to
-- a shard of the day chosen by their connection (`pg_backend_pid() % 32`), so concurrent
-- groups lock different rows, and readers sum the day's rows (`usage_days`).
--
-- `usage_daily` stays: it holds the days before this migration, and what a worker of the
-- previous release writes there during a rolling upgrade is counted as well.
CREATE TABLE usage_shards (
    tenant_id         uuid     NOT NULL,
    day               date     NOT NULL,
    shard             smallint NOT NULL,
    prompt_tokens     bigint   NOT NULL DEFAULT 0,
    completion_tokens bigint   NOT NULL DEFAULT 0,
    estimated_tokens  bigint   NOT NULL DEFAULT 0,
    tool_calls        bigint   NOT NULL DEFAULT 0,
    runs              bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day, shard)
) WITH (fillfactor = 80);

-- A tenant's figures for a day, whichever table holds them. A condition on `tenant_id` and
-- `day` reaches both tables' primary keys (grouping columns: Postgres pushes it down).
CREATE VIEW usage_days AS
SELECT tenant_id, day,
       sum(prompt_tokens)::bigint     AS prompt_tokens,
       sum(completion_tokens)::bigint AS completion_tokens,
       sum(estimated_tokens)::bigint  AS estimated_tokens,
       sum(tool_calls)::bigint        AS tool_calls,
       sum(runs)::bigint              AS runs
FROM (
    SELECT tenant_id, day, prompt_tokens, completion_tokens, estimated_tokens, tool_calls, runs
    FROM usage_daily
    UNION ALL
    SELECT tenant_id, day, prompt_tokens, completion_tokens, estimated_tokens, tool_calls, runs
    FROM usage_shards
) u
GROUP BY tenant_id, day;
