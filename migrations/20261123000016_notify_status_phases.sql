-- The controllers' status writes name the phases they write in the transaction-local
-- setting berth.status_phases (set by the UPDATE itself); the trigger then notifies
-- 'workloads status:' and those phases, e.g. 'workloads status:Dispatched', and clears the
-- setting, so that a controller can sleep through changes it has no part in (the scheduler
-- through a burst of dispatches). Every other statement still notifies 'workloads'.
CREATE FUNCTION notify_workload_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    phases text := current_setting('berth.status_phases', true);
BEGIN
    IF TG_OP = 'UPDATE' AND coalesce(phases, '') <> '' THEN
        PERFORM set_config('berth.status_phases', '', true);
        PERFORM pg_notify('berth_changes', 'workloads status:' || phases);
    ELSE
        PERFORM pg_notify('berth_changes', 'workloads');
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER workloads_notify ON workloads;
CREATE TRIGGER workloads_notify AFTER INSERT OR UPDATE OR DELETE ON workloads
    FOR EACH STATEMENT EXECUTE FUNCTION notify_workload_change();
