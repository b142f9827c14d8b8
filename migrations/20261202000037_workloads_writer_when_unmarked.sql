-- Every write of a workload in the store marks the change feed's `written_by` itself
-- (`written_by = pg_current_xact_id()`), so the row trigger that marked it runs only for a
-- write that did not: a PL/pgSQL call per row written cost the scheduler's status writes
-- about a third of their time (10,000 rows of a 62,000-row copy of the benchmark's table:
-- 686–906 ms with it on every row, 502–582 ms without). The trigger stays as the net
-- under any other UPDATE (psql, a migration, a test).
DROP TRIGGER workloads_writer ON workloads;
CREATE TRIGGER workloads_writer BEFORE UPDATE ON workloads
    FOR EACH ROW WHEN (NEW.written_by = OLD.written_by) EXECUTE FUNCTION workloads_mark_writer();
