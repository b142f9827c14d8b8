-- Keeps the API's cache of who may do what (users' role bindings and the team tree) true:
-- a change to either notifies channel berth_access, on which every replica listens. The
-- scheduler's frequent writes of team status do not, nor do spec edits that keep a team's
-- name and parent.
CREATE FUNCTION notify_access_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('berth_access', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER role_bindings_access AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON role_bindings
    FOR EACH STATEMENT EXECUTE FUNCTION notify_access_change();
CREATE TRIGGER teams_access_changed AFTER INSERT OR DELETE OR TRUNCATE ON teams
    FOR EACH STATEMENT EXECUTE FUNCTION notify_access_change();
CREATE TRIGGER teams_access_moved AFTER UPDATE ON teams
    FOR EACH ROW WHEN (OLD.parent_uid IS DISTINCT FROM NEW.parent_uid OR OLD.name IS DISTINCT FROM NEW.name)
    EXECUTE FUNCTION notify_access_change();
