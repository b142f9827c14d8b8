-- Structured facts about an event (for an admission: team, flavor, cluster, GPUs,
-- borrowed), so the history can be replayed and checked, not only read.
ALTER TABLE events ADD COLUMN details jsonb;
