-- The deletion controller looks for unfinished workloads whose deletion or cancellation was
-- requested on each pass (every change wakes it): without an index that is a scan of every
-- workload, 45 ms at 14,000 and growing with the queue. Few workloads are ever stopping, so
-- a partial index of those is small and costs other writes nothing.
CREATE INDEX workloads_stopping ON workloads (uid) WHERE deletion_timestamp IS NOT NULL OR status ? 'cancellation';
