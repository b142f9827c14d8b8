-- The attempts running now, as the ledger will record them when they end: the team and
-- its ancestors now (nearest first), owner, flavor, cluster, backend kind, workload kind,
-- GPUs, borrowed, the job's start, and the flavor's price (on its cluster) now. Readers
-- end them at their own "now". Attempts admitted but not started used nothing yet.
CREATE VIEW running_attempts AS
WITH RECURSIVE up (team, parent_uid, names) AS (
    SELECT t.name, t.parent_uid, ARRAY[t.name] FROM teams t
    UNION ALL
    SELECT up.team, p.parent_uid, up.names || p.name FROM teams p JOIN up ON p.uid = up.parent_uid
), chains AS (SELECT team, names FROM up WHERE parent_uid IS NULL)
SELECT w.team_name AS team,
       c.names AS teams,
       w.owner->>'subject' AS owner,
       w.status->'admission'->>'flavor' AS flavor,
       w.status->'admission'->>'cluster' AS cluster,
       coalesce(cl.kind, 'unknown') AS backend,
       w.kind,
       (w.spec->'tasks'->>'count')::float8 * (w.spec->'tasks'->'resources'->>'gpus')::float8 AS gpus,
       coalesce((w.status->'admission'->>'borrowed')::bool, false) AS borrowed,
       (w.status->>'started_at')::timestamptz AS started_at,
       coalesce((f.spec->'price'->'clusters'->>(w.status->'admission'->>'cluster'))::float8,
                (f.spec->'price'->>'per_gpu_hour')::float8) AS price
FROM workloads w
JOIN chains c ON c.team = w.team_name
LEFT JOIN clusters cl ON cl.name = w.status->'admission'->>'cluster'
LEFT JOIN flavors f ON f.name = w.status->'admission'->>'flavor'
WHERE w.phase IN ('Admitted', 'Dispatched', 'Running', 'Preempting', 'Unknown')
  AND w.status->'admission' IS NOT NULL
  AND w.status->>'started_at' IS NOT NULL;
