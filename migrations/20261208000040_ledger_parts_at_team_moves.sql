-- A team that moves in the tree takes its running work with it, but not the hours that
-- work used before the move: those stay with the ancestors the team had then. The ledger
-- record of an attempt running at a move is cut there into parts: the part before ends
-- with outcome 'moved' and the ancestors of then; the attempt goes on in its next part,
-- from the move, recorded (with the ancestors of its end) when the attempt ends. Without
-- this, a report of a month before the move changed once the work ended, and a
-- department's subtree stopped adding up to its own work plus its teams'.
ALTER TABLE usage_ledger ADD COLUMN part integer NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger DROP CONSTRAINT usage_ledger_pkey, ADD PRIMARY KEY (workload_uid, attempt, part);
ALTER TABLE usage_ledger DROP CONSTRAINT usage_ledger_outcome_check,
    ADD CONSTRAINT usage_ledger_outcome_check
        CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'preempted', 'requeued', 'deleted', 'moved'));

-- The part a running attempt is in, when it is not its first, and since when. Removed
-- once the attempt is recorded.
CREATE TABLE ledger_open_parts (
    workload_uid uuid        NOT NULL,
    attempt      integer     NOT NULL,
    part         integer     NOT NULL,
    since        timestamptz NOT NULL,
    PRIMARY KEY (workload_uid, attempt)
);

-- As before, with each attempt's open part: it starts at its part's start, and says which
-- workload, attempt and part it is.
CREATE OR REPLACE VIEW running_attempts AS
WITH RECURSIVE up (team, parent_uid, names, uids) AS (
    SELECT t.name, t.parent_uid, ARRAY[t.name], ARRAY[t.uid] FROM teams t
    UNION ALL
    SELECT up.team, p.parent_uid, up.names || p.name, up.uids || p.uid FROM teams p JOIN up ON p.uid = up.parent_uid
), chains AS (SELECT team, names, uids FROM up WHERE parent_uid IS NULL)
SELECT w.team_name AS team,
       c.names AS teams,
       c.uids AS team_uids,
       w.owner->>'subject' AS owner,
       w.status->'admission'->>'flavor' AS flavor,
       w.status->'admission'->>'cluster' AS cluster,
       coalesce(cl.kind, 'unknown') AS backend,
       w.kind,
       (w.spec->'tasks'->>'count')::float8 * (w.spec->'tasks'->'resources'->>'gpus')::float8 AS gpus,
       coalesce((w.status->'admission'->>'borrowed')::bool, false) AS borrowed,
       greatest((w.status->>'started_at')::timestamptz, op.since) AS started_at,
       coalesce((f.spec->'price'->'clusters'->>(w.status->'admission'->>'cluster'))::float8,
                (f.spec->'price'->>'per_gpu_hour')::float8) AS price,
       w.uid AS workload_uid,
       coalesce((w.status->>'attempt')::integer, 0) AS attempt,
       w.name AS workload,
       coalesce(op.part, 0) AS part
FROM workloads w
JOIN chains c ON c.team = w.team_name
LEFT JOIN clusters cl ON cl.name = w.status->'admission'->>'cluster'
LEFT JOIN flavors f ON f.name = w.status->'admission'->>'flavor'
LEFT JOIN ledger_open_parts op ON op.workload_uid = w.uid AND op.attempt = coalesce((w.status->>'attempt')::integer, 0)
WHERE w.phase IN ('Admitted', 'Dispatched', 'Running', 'Preempting', 'Unknown')
  AND w.status->'admission' IS NOT NULL
  AND w.status->>'started_at' IS NOT NULL;
