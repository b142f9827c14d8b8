-- The change feed the scheduler reads instead of every unfinished workload each cycle:
-- each row records the transaction that last wrote it, and a deleted workload leaves a
-- tombstone. A reader whose snapshot had xmin X asks next for what transactions with an
-- id of at least X wrote: every transaction that snapshot did not see has one.
ALTER TABLE workloads ADD COLUMN written_by xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX workloads_written_by ON workloads (written_by);

CREATE FUNCTION workloads_mark_writer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.written_by := pg_current_xact_id();
    RETURN NEW;
END
$$;
CREATE TRIGGER workloads_writer BEFORE UPDATE ON workloads
    FOR EACH ROW EXECUTE FUNCTION workloads_mark_writer();

-- Kept an hour after the delete (the retention controller removes older ones); a reader
-- further behind reads everything again.
CREATE TABLE workload_tombstones (
    uid        uuid        NOT NULL,
    written_by xid8        NOT NULL DEFAULT pg_current_xact_id(),
    deleted_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX workload_tombstones_written_by ON workload_tombstones (written_by);
CREATE INDEX workload_tombstones_deleted_at ON workload_tombstones (deleted_at);

CREATE FUNCTION workloads_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workload_tombstones (uid) SELECT uid FROM gone;
    RETURN NULL;
END
$$;
CREATE TRIGGER workloads_tombstones AFTER DELETE ON workloads
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION workloads_tombstone();
