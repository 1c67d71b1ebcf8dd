-- The status a cancelled run was cancelled from. `run_cancelled` carries it
-- (`previous_status`), and the event the API restores from Postgres when Redis lost the live
-- one (or its append failed) must carry it too; before this column it carried `{}`.
-- NULL for runs that were not cancelled and for runs cancelled before this migration.
-- A nullable column without a default rewrites nothing and is checked by nothing: the table's
-- lock is held only for the catalog change, and no statement pays for it.
ALTER TABLE runs ADD COLUMN cancelled_from text;
