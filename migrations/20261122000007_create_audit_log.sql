-- Who changed what. Append-only; names are copied (no foreign keys) so the record
-- survives the object.
CREATE TABLE audit_log (
    id                bigserial   PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT now(),
    actor             text        NOT NULL,
    verb              text        NOT NULL CHECK (verb IN ('create', 'update', 'delete')),
    kind              text        NOT NULL,
    team              text,
    name              text        NOT NULL,
    uid               uuid        NOT NULL,
    generation_before bigint,
    generation_after  bigint,
    request_id        text
);

CREATE INDEX audit_log_object ON audit_log (kind, name, id);
