-- POST /api/v1/teams/{team}/workloads with an Idempotency-Key: the first answer, kept for a
-- day, is the answer to every retry with that key (by the same caller, to the same team,
-- with the same body).
CREATE TABLE idempotency_keys (
    subject      text        NOT NULL,
    issuer       text        NOT NULL,
    team_name    text        NOT NULL,
    key          text        NOT NULL,
    request_hash bytea       NOT NULL,
    response     jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, issuer, team_name, key)
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
