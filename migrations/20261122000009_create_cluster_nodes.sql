-- The nodes of each cluster as its backend last reported them; the scheduler's view of
-- capacity. Replaced by the cluster-health controller when the inventory changes.
CREATE TABLE cluster_nodes (
    cluster_uid      uuid    NOT NULL REFERENCES clusters (uid) ON DELETE CASCADE,
    name             text    NOT NULL,
    -- NULL for nodes with no flavor Berth knows.
    flavor           text,
    gpus             integer NOT NULL CHECK (gpus >= 0),
    -- GPUs held by work Berth did not start.
    unavailable_gpus integer NOT NULL CHECK (unavailable_gpus >= 0),
    cpus             integer NOT NULL,
    memory_mib       bigint  NOT NULL,
    block            text,
    schedulable      boolean NOT NULL,
    PRIMARY KEY (cluster_uid, name)
);
