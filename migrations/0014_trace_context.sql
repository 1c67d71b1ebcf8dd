-- One trace per run (docs/operations.md, "Tracing"). The W3C `traceparent` of the API request
-- that created the run, when trace export is on: every attempt of the run (after a pause of
-- days, a take-over, a re-publish by the sweeper, on any worker) starts its span as a child of
-- it, so the run stays one trace whatever carried its message. NULL when export is off or
-- the run was created before this column. Nullable without a default: adding it rewrites no
-- row.
ALTER TABLE runs
    ADD COLUMN traceparent text
        CONSTRAINT runs_traceparent_bounded CHECK (length(traceparent) <= 128);

-- The submitting request's context of a `/v1/batches` batch, whose runs are made later by the
-- driver (on any API replica): each run it makes stores it, so they join that request's trace.
ALTER TABLE batches
    ADD COLUMN traceparent text
        CONSTRAINT batches_traceparent_bounded CHECK (length(traceparent) <= 128);
