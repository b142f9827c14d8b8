-- An update's audit record keeps the spec before and after the change, so that an auditor
-- reads what changed, not only that the generation moved. Creates and deletes keep none
-- (the object itself, or its history, says what it was).
ALTER TABLE audit_log ADD COLUMN spec_before jsonb, ADD COLUMN spec_after jsonb;
