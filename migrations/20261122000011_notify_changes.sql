-- Wakes the controllers: every statement that changes a workload, team, cluster or flavor
-- sends the table's name on channel berth_changes. Postgres folds identical notifications
-- of one transaction into one, and listeners coalesce further.
CREATE FUNCTION notify_berth_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('berth_changes', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER workloads_notify AFTER INSERT OR UPDATE OR DELETE ON workloads
    FOR EACH STATEMENT EXECUTE FUNCTION notify_berth_change();
CREATE TRIGGER teams_notify AFTER INSERT OR UPDATE OR DELETE ON teams
    FOR EACH STATEMENT EXECUTE FUNCTION notify_berth_change();
CREATE TRIGGER clusters_notify AFTER INSERT OR UPDATE OR DELETE ON clusters
    FOR EACH STATEMENT EXECUTE FUNCTION notify_berth_change();
CREATE TRIGGER flavors_notify AFTER INSERT OR UPDATE OR DELETE ON flavors
    FOR EACH STATEMENT EXECUTE FUNCTION notify_berth_change();
