-- Hand-backs after a failure (a database error while the run was held): each one is counted,
-- so a run that keeps failing is failed with a named reason instead of re-published forever.
-- Hand-backs of a draining worker are not failures and are not counted.
ALTER TABLE runs ADD COLUMN handbacks integer NOT NULL DEFAULT 0 CHECK (handbacks >= 0);
