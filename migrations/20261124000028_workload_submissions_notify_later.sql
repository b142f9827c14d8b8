-- A workload submission sets the transaction-local berth.notify to 'later': it sends no
-- notification itself, and Berth notifies for it from a separate transaction right after
-- it commits, one notification for many submissions. A NOTIFY inside each submission's
-- transaction holds Postgres' notify lock until that transaction's commit is flushed,
-- which lets only one submission commit at a time. The setting is cleared once honoured,
-- so a later statement of the same transaction notifies as before.
CREATE OR REPLACE FUNCTION notify_workload_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    phases text := current_setting('berth.status_phases', true);
BEGIN
    IF current_setting('berth.notify', true) = 'later' THEN
        PERFORM set_config('berth.notify', '', true);
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND coalesce(phases, '') <> '' THEN
        PERFORM set_config('berth.status_phases', '', true);
        PERFORM pg_notify('berth_changes', 'workloads status:' || phases);
    ELSE
        PERFORM pg_notify('berth_changes', 'workloads');
    END IF;
    RETURN NULL;
END
$$;
