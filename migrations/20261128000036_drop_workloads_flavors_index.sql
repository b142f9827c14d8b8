-- The GIN index on workloads.flavors served one query: whether a flavor about to be deleted
-- is still wanted by unfinished work (store::flavor::flavor_users, LIMIT 3), a rare admin
-- action that may as well scan. Every workload insert and every change of its flavors paid
-- for it: without it, durable creates went from 4,320 and 4,512/s to 4,593 and 4,981/s
-- (wrk, 32 connections, controllers off, on 2 cores; issue 31).
DROP INDEX workloads_flavors;
