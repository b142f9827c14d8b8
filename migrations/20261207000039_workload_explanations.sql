-- What the controllers explain about a pending workload: why it waits and where it stands
-- in the queue (the scheduler), when it should start (the estimates). This is derived
-- data, rewritten as the queue moves, and kept out of the workload's row: rewriting that
-- row (1.1 KB with its spec, and an entry in six indexes) cost 60-85 µs a workload, and
-- the scheduler rewrote every new workload's row to give it its first reason (a third of
-- Postgres's statement time during bench/api-load's creates); a row here costs 6 µs.
-- Writing here changes neither the workload's resource_version nor its written_by: a
-- client's conditional write (If-Match) is not refused because the queue moved.
--
-- A row explains one attempt; the stores' reads merge it into `status` while the workload
-- is Pending at that attempt (a requeued workload does not show the reasons of its last
-- wait). A workload that leaves Pending loses its row with the status write that moves it
-- (workload_write_statuses); what a race leaves behind (a workload deleted as its reason
-- was written) is removed by the retention pass. `written_by` is the change feed's, as
-- the workloads': GET's cache reads what was explained since its cursor.
CREATE TABLE workload_explanations (
    uid             uuid   PRIMARY KEY,
    attempt         bigint NOT NULL,
    pending_reason  jsonb,
    queue_position  jsonb,
    estimated_start jsonb,
    written_by      xid8   NOT NULL DEFAULT pg_current_xact_id()
) WITH (fillfactor = 70);
CREATE INDEX workload_explanations_written_by ON workload_explanations (written_by);

-- What is explained today moves here, out of the rows.
INSERT INTO workload_explanations (uid, attempt, pending_reason, queue_position, estimated_start)
SELECT uid, coalesce((status ->> 'attempt')::bigint, 0),
       status -> 'pending_reason', status -> 'queue_position', status -> 'estimated_start'
FROM workloads
WHERE phase = 'Pending' AND (status ?| ARRAY['pending_reason', 'queue_position', 'estimated_start']);

UPDATE workloads SET status = status - 'pending_reason' - 'queue_position' - 'estimated_start'
WHERE status ?| ARRAY['pending_reason', 'queue_position', 'estimated_start'];
