-- The ledger keeps the uids of the team and its ancestors beside their names: a deleted
-- team's name may be taken again, and who may read a record is decided on the teams it
-- belonged to (a uid never comes back). Records from before this know only names.
ALTER TABLE usage_ledger ADD COLUMN team_uids uuid[] NOT NULL DEFAULT '{}';
UPDATE usage_ledger l
SET team_uids = ARRAY(SELECT t.uid FROM unnest(l.teams) WITH ORDINALITY AS n (name, i)
                      JOIN teams t ON t.name = n.name ORDER BY n.i)
WHERE (SELECT count(*) FROM teams t WHERE t.name = ANY(l.teams)) = cardinality(l.teams);

-- The attempts running now, as the ledger will record them when they end: the team and
-- its ancestors now (names and uids, nearest first), owner, flavor, cluster, backend kind,
-- workload kind, GPUs, borrowed, the job's start, and the flavor's price (on its cluster)
-- now. Readers end them at their own "now". Attempts admitted but not started used
-- nothing yet.
CREATE VIEW running_attempts AS
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
