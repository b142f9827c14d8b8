-- No planner statistics of the spec and status documents. No query filters on either
-- column as a whole (the filters read fields of them, which these statistics do not
-- describe, or go through workloads_stopping's predicate), yet autovacuum's ANALYZE
-- sampled 30,000 workloads and sorted both documents of each to build their histograms:
-- during bench/api-load's creates, when the table's growth brings an ANALYZE every few
-- seconds, that sort (compareJsonbContainers) was 7 % of the machine's CPU, one process
-- of Postgres's 57 % (perf -a, 10 s; issue 31). The other columns keep theirs.
ALTER TABLE workloads ALTER COLUMN spec SET STATISTICS 0, ALTER COLUMN status SET STATISTICS 0;
