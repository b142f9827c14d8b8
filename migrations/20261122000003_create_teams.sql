-- The team tree. parent_uid is a real foreign key so a parent cannot vanish under its
-- children (ON DELETE RESTRICT); cycles and guarantee nesting are checked by the
-- application under the team-tree advisory lock, since they span rows.
CREATE TABLE teams (
    uid              uuid        PRIMARY KEY,
    name             text        NOT NULL UNIQUE,
    parent_uid       uuid        REFERENCES teams (uid) ON DELETE RESTRICT,
    labels           jsonb       NOT NULL DEFAULT '{}',
    spec             jsonb       NOT NULL,
    status           jsonb       NOT NULL DEFAULT '{}',
    generation       bigint      NOT NULL DEFAULT 1,
    resource_version bigint      NOT NULL DEFAULT nextval('resource_version_seq'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX teams_parent_uid ON teams (parent_uid);
-- Finds teams whose quotas name a flavor, to refuse deleting a flavor in use.
CREATE INDEX teams_spec_quotas ON teams USING gin ((spec -> 'quotas') jsonb_path_ops);
