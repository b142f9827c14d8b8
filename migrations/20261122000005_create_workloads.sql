-- Workloads. team_name is stored beside team_uid so lists can be ordered and paged by
-- (team_name, name) without a join; team names never change (the name is the identity).
-- phase, cluster and flavors mirror parts of spec/status as columns for filters and
-- indexes; the store writes both in the same statement.
CREATE TABLE workloads (
    uid                uuid        PRIMARY KEY,
    team_uid           uuid        NOT NULL REFERENCES teams (uid) ON DELETE CASCADE,
    team_name          text        NOT NULL,
    name               text        NOT NULL,
    kind               text        NOT NULL,
    phase              text        NOT NULL DEFAULT 'Pending',
    cluster            text,
    flavors            text[]      NOT NULL,
    labels             jsonb       NOT NULL DEFAULT '{}',
    spec               jsonb       NOT NULL,
    status             jsonb       NOT NULL DEFAULT '{}',
    generation         bigint      NOT NULL DEFAULT 1,
    resource_version   bigint      NOT NULL DEFAULT nextval('resource_version_seq'),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    deletion_timestamp timestamptz,
    UNIQUE (team_name, name)
);

CREATE INDEX workloads_team_uid ON workloads (team_uid);
CREATE INDEX workloads_phase ON workloads (phase, team_name, name);
CREATE INDEX workloads_cluster ON workloads (cluster, team_name, name) WHERE cluster IS NOT NULL;
CREATE INDEX workloads_labels ON workloads USING gin (labels jsonb_path_ops);
CREATE INDEX workloads_flavors ON workloads USING gin (flavors);
