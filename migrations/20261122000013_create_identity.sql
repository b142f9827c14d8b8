-- Identity: role bindings, service accounts and their tokens.
--
-- A binding or a service account owned by a team goes with the team (ON DELETE CASCADE):
-- a team created later under the same name must not inherit old grants.
CREATE TABLE role_bindings (
    id         uuid        PRIMARY KEY,
    subject    text        NOT NULL,
    role       text        NOT NULL CHECK (role IN ('platform-admin', 'team-admin', 'member', 'viewer')),
    team       text        REFERENCES teams (name) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text        NOT NULL,
    CHECK ((role = 'platform-admin') = (team IS NULL) OR role = 'viewer')
);

-- One binding per (subject, role, scope); NULLS NOT DISTINCT makes global ones unique too.
CREATE UNIQUE INDEX role_bindings_grant ON role_bindings (subject, role, team) NULLS NOT DISTINCT;
CREATE INDEX role_bindings_team ON role_bindings (team);

CREATE TABLE service_accounts (
    name        text        PRIMARY KEY,
    team        text        REFERENCES teams (name) ON DELETE CASCADE,
    description text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL
);

-- Tokens are stored only as SHA-256 hashes; the token itself is shown once, at creation.
CREATE TABLE service_account_tokens (
    id              uuid        PRIMARY KEY,
    service_account text        NOT NULL REFERENCES service_accounts (name) ON DELETE CASCADE,
    token_sha256    bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    last_used_at    timestamptz,
    revoked_at      timestamptz
);

CREATE INDEX service_account_tokens_account ON service_account_tokens (service_account, created_at);
