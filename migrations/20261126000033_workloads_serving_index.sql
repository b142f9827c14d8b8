-- The autoscaler and the idle reaper look at unfinished inference services, their replica
-- workloads and running notebooks every few seconds: a partial index of those keeps the
-- pass from scanning every workload (100,000 running training jobs are not serving).
CREATE INDEX workloads_serving ON workloads (uid)
    WHERE kind IN ('inference', 'notebook') AND phase NOT IN ('Succeeded', 'Failed', 'Cancelled');
