-- Cost: each attempt keeps the price per GPU-hour of its flavor (on its cluster) when it
-- ended; null when the flavor had no price.
ALTER TABLE usage_ledger ADD COLUMN price double precision;
-- Reports read by period: attempts that started before a period's end and ended after
-- its start.
CREATE INDEX usage_ledger_started_at ON usage_ledger (started_at);
