-- How many chunks of a batch in creation failed in a row (api/src/batch_driver.rs). A chunk
-- that fails the same way every time (a stored body the database refuses, say) was retried by
-- every sweep for ever; after `api.batch_max_chunk_failures` failures in a row, the items
-- still without a run get an error instead and the batch moves on. A constant default:
-- adding the column rewrites nothing.
ALTER TABLE batches ADD COLUMN chunk_failures integer NOT NULL DEFAULT 0;
