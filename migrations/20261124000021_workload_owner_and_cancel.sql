-- Who submitted each workload: the subject and issuer of the caller's token, as
-- {"subject", "issuer"}. Workloads submitted before owners were recorded have none.
ALTER TABLE workloads ADD COLUMN owner jsonb;

-- A workload's cancellation is audited as such (it is kept, not deleted).
ALTER TABLE audit_log DROP CONSTRAINT audit_log_verb_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_verb_check CHECK (verb IN ('create', 'update', 'delete', 'cancel'));
