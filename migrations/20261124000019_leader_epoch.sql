-- The controller lease's epoch: a fencing token. Each new leader increments it (after
-- waiting for every transaction that checked the old one), and every controller write
-- checks, in its own transaction, that the epoch it was started under is still current,
-- so the writes of a replica that lost the lease fail instead of landing.
ALTER TABLE controller_leader ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
