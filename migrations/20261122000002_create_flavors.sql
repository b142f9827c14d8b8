-- GPU flavors. spec/status are JSON documents validated by berth-core; the columns beside
-- them exist for lookups and constraints.
CREATE TABLE flavors (
    uid              uuid        PRIMARY KEY,
    name             text        NOT NULL UNIQUE,
    labels           jsonb       NOT NULL DEFAULT '{}',
    spec             jsonb       NOT NULL,
    status           jsonb       NOT NULL DEFAULT '{}',
    generation       bigint      NOT NULL DEFAULT 1,
    resource_version bigint      NOT NULL DEFAULT nextval('resource_version_seq'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
