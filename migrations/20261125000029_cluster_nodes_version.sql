-- A version of the node inventories, moved on by every statement that writes cluster_nodes
-- (cascades from a cluster's delete included): readers that keep the nodes (the scheduler's
-- world, cluster health) read this one row instead of every node, and read the nodes again
-- only when it moved. At 40,000 nodes, reading them took a third of a scheduling cycle.
CREATE TABLE cluster_nodes_version (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    version bigint NOT NULL
);
INSERT INTO cluster_nodes_version VALUES (true, 0);

CREATE FUNCTION cluster_nodes_version_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cluster_nodes_version SET version = version + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER cluster_nodes_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON cluster_nodes
    FOR EACH STATEMENT EXECUTE FUNCTION cluster_nodes_version_bump();
