-- A tool call's arguments, result and error compressed with lz4 instead of pglz, Postgres's default: an agent with a few
-- realistic tools is ~5 KB of JSON that every run's insert compresses and stores out of line,
-- and the model's and the tools' text is as large. With pglz the API's grouped create took
-- 3.2 ms a call, with lz4 1.3-1.5 ms (docs/benchmarks.md, "Realistic agents"). Only new values
-- are affected: old ones stay readable as they are. A server built without lz4 keeps pglz.
-- One table per migration, so each takes (briefly: nothing is rewritten) one table's lock in a
-- transaction of its own, never two in an order the application's transactions could cross.
DO $$
BEGIN
    IF (SELECT 'lz4' = ANY (enumvals) FROM pg_settings
         WHERE name = 'default_toast_compression') THEN
        ALTER TABLE tool_calls
            ALTER COLUMN raw_arguments SET COMPRESSION lz4,
            ALTER COLUMN arguments SET COMPRESSION lz4,
            ALTER COLUMN result SET COMPRESSION lz4,
            ALTER COLUMN error SET COMPRESSION lz4;
    ELSE
        RAISE NOTICE 'this server has no lz4: tool_calls stays compressed with pglz';
    END IF;
END
$$;
