-- A run's large values are compressed with lz4 instead of pglz, Postgres's default. An agent
-- with a few realistic tools is ~5 KB of JSON, compressed and stored out of line by every run's
-- insert: with pglz, the API's grouped insert took 3.2 ms a call and with lz4 1.3–1.5 ms
-- (docs/benchmarks.md, "Realistic agents"). Messages and tool calls hold the model's and the
-- tools' text, as large. Only new values are affected: old ones stay readable as they are.
-- A server built without lz4 keeps pglz (the statements below need no rewrite of anything).
DO $$
BEGIN
    ALTER TABLE runs
        ALTER COLUMN agent SET COMPRESSION lz4,
        ALTER COLUMN metadata SET COMPRESSION lz4,
        ALTER COLUMN pending SET COMPRESSION lz4,
        ALTER COLUMN error SET COMPRESSION lz4,
        ALTER COLUMN queued_input SET COMPRESSION lz4;
    ALTER TABLE messages ALTER COLUMN body SET COMPRESSION lz4;
    ALTER TABLE tool_calls
        ALTER COLUMN raw_arguments SET COMPRESSION lz4,
        ALTER COLUMN arguments SET COMPRESSION lz4,
        ALTER COLUMN result SET COMPRESSION lz4,
        ALTER COLUMN error SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this server has no lz4: large values stay compressed with pglz';
END
$$;
