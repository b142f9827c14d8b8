-- Registered backend clusters. kind is a column (not only inside spec) because it never
-- changes and the controllers select by it.
CREATE TABLE clusters (
    uid              uuid        PRIMARY KEY,
    name             text        NOT NULL UNIQUE,
    kind             text        NOT NULL CHECK (kind IN ('slurm', 'kubernetes', 'sim')),
    labels           jsonb       NOT NULL DEFAULT '{}',
    spec             jsonb       NOT NULL,
    status           jsonb       NOT NULL DEFAULT '{}',
    generation       bigint      NOT NULL DEFAULT 1,
    resource_version bigint      NOT NULL DEFAULT nextval('resource_version_seq'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
