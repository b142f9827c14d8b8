-- A statement that changes only workloads' status (the controllers' writes: the same
-- generation and deletion mark before and after) notifies 'workloads status:' and the
-- phases it wrote, e.g. 'workloads status:Dispatched,Running', so that a controller can
-- sleep through changes it has no part in (the scheduler through a burst of dispatches).
-- Inserts, deletes and every other update still notify 'workloads'.
CREATE FUNCTION notify_workload_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    phases text;
BEGIN
    SELECT CASE WHEN bool_and(n.generation = o.generation
                              AND n.deletion_timestamp IS NOT DISTINCT FROM o.deletion_timestamp)
                THEN 'status:' || string_agg(DISTINCT n.phase, ',' ORDER BY n.phase) END
    INTO phases
    FROM new_rows n JOIN old_rows o USING (uid);
    PERFORM pg_notify('berth_changes', 'workloads' || coalesce(' ' || phases, ''));
    RETURN NULL;
END
$$;

DROP TRIGGER workloads_notify ON workloads;
CREATE TRIGGER workloads_notify AFTER INSERT OR DELETE ON workloads
    FOR EACH STATEMENT EXECUTE FUNCTION notify_berth_change();
CREATE TRIGGER workloads_notify_update AFTER UPDATE ON workloads
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION notify_workload_update();
