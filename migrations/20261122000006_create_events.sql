-- What happened to an object, in order. No foreign key: events outlive their object.
CREATE TABLE events (
    id          bigserial   PRIMARY KEY,
    object_kind text        NOT NULL,
    object_uid  uuid        NOT NULL,
    type        text        NOT NULL CHECK (type IN ('Normal', 'Warning')),
    reason      text        NOT NULL,
    message     text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX events_object ON events (object_uid, id);
