-- Role bindings refer to the identity they grant to, never to a reusable name.
--
-- Before, a binding named its subject as text: `serviceaccount:NAME` or a user's `sub`.
-- Deleting a team deleted its service accounts but not their bindings on other teams (or
-- global ones), and service-account names are global, so creating an account with the
-- same name again inherited every old binding; and an OIDC user whose `sub` was
-- `serviceaccount:NAME` held that account's rights.
--
-- Now a service account's binding refers to the account's uid (and goes with it), and a
-- user's binding names the issuer as well as the subject. `subject` stays, as written when
-- the binding was made, for people to read.
ALTER TABLE service_accounts ADD COLUMN uid uuid NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE service_accounts ADD CONSTRAINT service_accounts_uid UNIQUE (uid);

ALTER TABLE role_bindings
    ADD COLUMN issuer text,
    ADD COLUMN service_account_uid uuid REFERENCES service_accounts (uid) ON DELETE CASCADE;

UPDATE role_bindings b SET service_account_uid = a.uid
FROM service_accounts a WHERE b.subject = 'serviceaccount:' || a.name;
-- Bindings left behind by deleted accounts: exactly what a new account of the name inherited.
DELETE FROM role_bindings WHERE subject LIKE 'serviceaccount:%' AND service_account_uid IS NULL;
-- Users' bindings made so far were for Berth's own tokens; a site with an OIDC issuer binds
-- its users again, naming the issuer (failing closed rather than guessing).
UPDATE role_bindings SET issuer = 'berth' WHERE service_account_uid IS NULL;

ALTER TABLE role_bindings ADD CONSTRAINT role_bindings_identity
    CHECK ((issuer IS NULL) <> (service_account_uid IS NULL));

DROP INDEX role_bindings_grant;
CREATE UNIQUE INDEX role_bindings_grant
    ON role_bindings (service_account_uid, issuer, subject, role, team) NULLS NOT DISTINCT;
CREATE INDEX role_bindings_user ON role_bindings (issuer, subject) WHERE issuer IS NOT NULL;
CREATE INDEX role_bindings_service_account ON role_bindings (service_account_uid)
    WHERE service_account_uid IS NOT NULL;
