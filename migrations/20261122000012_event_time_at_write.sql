-- An event's time is when it was written, not when its transaction began: a controller
-- pass writes its events at the end of a transaction that may have run for a while.
ALTER TABLE events ALTER COLUMN created_at SET DEFAULT clock_timestamp();
