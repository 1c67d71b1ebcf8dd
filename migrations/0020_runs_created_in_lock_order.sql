-- A run's `created_at` is the time of its insert, not its transaction's start. A run on an
-- existing thread is inserted under the thread's lock, so the insert time orders a thread's
-- runs as the lock admitted them; `now()` (the transaction's start) let a creation that began
-- first but took the lock second sort before the run it came after, and a thread's event
-- stream, which follows the runs in this order, never reached it. Changing a default rewrites
-- nothing.
ALTER TABLE runs ALTER COLUMN created_at SET DEFAULT clock_timestamp();
