//! SQL for the accounting ledger: one record per workload attempt that held GPUs.

use berth_core::Error;
use berth_core::usage::Interval;
use berth_core::workload::Workload;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::db_error;

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
    /// Stopped for other work and requeued.
    Preempted,
    /// Its job was lost (or its cluster unreachable) and it was requeued.
    Requeued,
    /// Its workload was deleted while it ran.
    Deleted,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Preempted => "preempted",
            Self::Requeued => "requeued",
            Self::Deleted => "deleted",
        }
    }
}

/// One attempt's facts. Its team's ancestors and its cluster's backend kind are looked up
/// when it is recorded.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub workload_uid: Uuid,
    pub attempt: u32,
    pub team: String,
    pub workload: String,
    pub owner: Option<String>,
    pub flavor: String,
    pub cluster: String,
    pub kind: String,
    pub gpus: f64,
    pub borrowed: bool,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: DateTime<Utc>,
    pub outcome: Outcome,
}

impl Attempt {
    /// The record of `w`'s current attempt, ended as `outcome`; `None` when it was never
    /// admitted (it held nothing).
    pub fn of(
        w: &Workload,
        outcome: Outcome,
        started_at: Option<DateTime<Utc>>,
        ended_at: DateTime<Utc>,
    ) -> Option<Self> {
        let a = w.status.admission.as_ref()?;
        let tasks = &w.spec.tasks;
        Some(Self {
            workload_uid: w.metadata.uid,
            attempt: w.status.attempt,
            team: w.metadata.team.clone().unwrap_or_default(),
            workload: w.metadata.name.clone(),
            owner: w.metadata.owner.as_ref().map(|o| o.subject.clone()),
            flavor: a.flavor.clone(),
            cluster: a.cluster.clone(),
            kind: w.spec.kind.as_str().to_owned(),
            gpus: f64::from(tasks.count) * tasks.resources.gpus,
            borrowed: a.borrowed,
            started_at,
            ended_at,
            outcome,
        })
    }
}

/// Records ended attempts; an attempt already recorded is left as it is. Returns how many
/// were new.
///
/// # Errors
/// As [`db_error`].
pub async fn ledger_record(tx: &mut PgConnection, attempts: &[Attempt]) -> Result<u64, Error> {
    if attempts.is_empty() {
        return Ok(0);
    }
    let col = |f: fn(&Attempt) -> String| attempts.iter().map(f).collect::<Vec<String>>();
    let uids: Vec<Uuid> = attempts.iter().map(|a| a.workload_uid).collect();
    let numbers: Vec<i32> = attempts.iter().map(|a| i32::try_from(a.attempt).unwrap_or(i32::MAX)).collect();
    let owners: Vec<Option<String>> = attempts.iter().map(|a| a.owner.clone()).collect();
    let gpus: Vec<f64> = attempts.iter().map(|a| a.gpus).collect();
    let borrowed: Vec<bool> = attempts.iter().map(|a| a.borrowed).collect();
    let started: Vec<Option<DateTime<Utc>>> = attempts.iter().map(|a| a.started_at).collect();
    let ended: Vec<DateTime<Utc>> = attempts.iter().map(|a| a.ended_at).collect();
    let done = sqlx::query!(
        r#"WITH op AS (
               -- The open part of an attempt cut at a team's move, done with once recorded.
               DELETE FROM ledger_open_parts op USING unnest($1::uuid[], $2::int[]) AS k (uid, attempt)
               WHERE op.workload_uid = k.uid AND op.attempt = k.attempt
               RETURNING op.workload_uid, op.attempt, op.part, op.since)
           INSERT INTO usage_ledger (workload_uid, attempt, part, team, teams, team_uids, workload, owner, flavor,
                                     cluster, backend, kind, gpus, borrowed, started_at, ended_at, outcome, price)
           SELECT i.uid, i.attempt, coalesce(op.part, 0), i.team, c.names, c.uids,
                  i.workload, i.owner, i.flavor, i.cluster,
                  coalesce((SELECT c.kind FROM clusters c WHERE c.name = i.cluster), 'unknown'),
                  i.kind, i.gpus, i.borrowed,
                  -- An attempt cut at a team's move: its last part, from the move (a job
                  -- seen to end only after a move it had ended before is no part after it).
                  CASE WHEN op.since IS NULL THEN i.started_at ELSE op.since END,
                  CASE WHEN op.since IS NULL THEN i.ended_at ELSE greatest(i.ended_at, op.since) END,
                  i.outcome,
                  (SELECT coalesce((f.spec->'price'->'clusters'->>i.cluster)::float8, (f.spec->'price'->>'per_gpu_hour')::float8)
                   FROM flavors f WHERE f.name = i.flavor)
           FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                       $9::float8[], $10::bool[], $11::timestamptz[], $12::timestamptz[], $13::text[])
                AS i (uid, attempt, team, workload, owner, flavor, cluster, kind, gpus, borrowed, started_at, ended_at, outcome)
           LEFT JOIN op ON op.workload_uid = i.uid AND op.attempt = i.attempt
           -- The team and its ancestors now, nearest first.
           CROSS JOIN LATERAL (
               WITH RECURSIVE up (uid, name, parent_uid, depth) AS (
                   SELECT t.uid, t.name, t.parent_uid, 0 FROM teams t WHERE t.name = i.team
                   UNION ALL
                   SELECT p.uid, p.name, p.parent_uid, up.depth + 1 FROM teams p JOIN up ON p.uid = up.parent_uid)
               SELECT ARRAY(SELECT name FROM up ORDER BY depth) AS names, ARRAY(SELECT uid FROM up ORDER BY depth) AS uids
           ) c
           ON CONFLICT (workload_uid, attempt, part) DO NOTHING"#,
        &uids,
        &numbers,
        &col(|a| a.team.clone()),
        &col(|a| a.workload.clone()),
        &owners as &[Option<String>],
        &col(|a| a.flavor.clone()),
        &col(|a| a.cluster.clone()),
        &col(|a| a.kind.clone()),
        &gpus,
        &borrowed,
        &started as &[Option<DateTime<Utc>>],
        &ended,
        &col(|a| a.outcome.as_str().to_owned()),
    )
    .execute(tx)
    .await
    .map_err(db_error)?;
    Ok(done.rows_affected())
}

/// Cuts the ledger records of the attempts running in team `team` or below it at `at`,
/// before the team moves in the tree: the part so far is recorded with the ancestors it had
/// (outcome `moved`), and the attempt goes on in a new part from `at`, recorded when it
/// ends with the ancestors of then. Run it in the move's transaction, before the team's
/// parent changes. Returns how many attempts were cut.
///
/// # Errors
/// As [`db_error`].
pub async fn ledger_cut_at_move(tx: &mut PgConnection, team: Uuid, at: DateTime<Utc>) -> Result<u64, Error> {
    // Their rows first: a controller ending one of them records it either before (and the
    // cut no longer sees it running) or after, reading the new part.
    let locked = sqlx::query_scalar!(
        r#"WITH RECURSIVE down (uid) AS (
               SELECT $1::uuid
               UNION ALL
               SELECT t.uid FROM teams t JOIN down ON t.parent_uid = down.uid)
           SELECT w.uid FROM workloads w
           WHERE w.team_uid IN (SELECT uid FROM down)
             AND w.phase IN ('Admitted', 'Dispatched', 'Running', 'Preempting', 'Unknown')
           FOR UPDATE OF w"#,
        team,
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(db_error)?;
    if locked.is_empty() {
        return Ok(0);
    }
    let cut = sqlx::query!(
        r#"WITH cut AS (
               SELECT * FROM running_attempts r WHERE r.workload_uid = ANY($1) AND $2 = ANY(r.team_uids)
           ), recorded AS (
               INSERT INTO usage_ledger (workload_uid, attempt, part, team, teams, team_uids, workload, owner, flavor,
                                         cluster, backend, kind, gpus, borrowed, started_at, ended_at, outcome, price)
               SELECT workload_uid, attempt, part, team, teams, team_uids, workload, owner, flavor, cluster, backend,
                      kind, gpus, borrowed, started_at, greatest(started_at, $3), 'moved', price
               FROM cut
               ON CONFLICT DO NOTHING
           )
           INSERT INTO ledger_open_parts (workload_uid, attempt, part, since)
           SELECT workload_uid, attempt, part + 1, greatest(started_at, $3) FROM cut
           ON CONFLICT (workload_uid, attempt) DO UPDATE SET part = EXCLUDED.part, since = EXCLUDED.since"#,
        &locked,
        team,
        at,
    )
    .execute(tx)
    .await
    .map_err(db_error)?;
    Ok(cut.rows_affected())
}

/// Whose records a reader sees, by team uid (a deleted team's name may be taken again; its
/// uid never comes back): those of `teams`, and those whose team was then below (or is)
/// one of `covering` (so a department's admin keeps seeing the work of a team since
/// deleted).
#[derive(Debug, Clone, Default)]
pub struct LedgerScope {
    pub teams: Vec<Uuid>,
    pub covering: Vec<Uuid>,
}

/// GPU use touching `[from, to)`: ended attempts from the ledger and, up to `now`, the
/// attempts running now, of everything (`scope` `None`) or of what `scope` allows.
/// Attempts that never started are left out (they used nothing).
///
/// # Errors
/// As [`db_error`].
pub async fn ledger_intervals(
    db: impl sqlx::PgExecutor<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
    scope: Option<&LedgerScope>,
) -> Result<Vec<Interval>, Error> {
    let (teams, covering) = match scope {
        Some(s) => (Some(s.teams.clone()), s.covering.clone()),
        None => (None, Vec::new()),
    };
    let rows = sqlx::query!(
        r#"SELECT team AS "team!", teams AS "teams!", team_uids AS "team_uids!", owner, flavor AS "flavor!",
                  cluster AS "cluster!", backend AS "backend!", kind AS "kind!", gpus AS "gpus!", borrowed AS "borrowed!",
                  started_at AS "started_at!", ended_at AS "ended_at!", price
           FROM (
               SELECT l.team, l.teams, l.team_uids, l.owner, l.flavor, l.cluster, l.backend, l.kind, l.gpus, l.borrowed,
                      l.started_at, l.ended_at, l.price
               FROM usage_ledger l
               WHERE l.started_at IS NOT NULL AND l.started_at < $2 AND l.ended_at > $1
                 AND ($4::uuid[] IS NULL OR l.team_uids[1] = ANY($4) OR l.team_uids && $5::uuid[])
               UNION ALL
               SELECT r.team, r.teams, r.team_uids, r.owner, r.flavor, r.cluster, r.backend, r.kind, r.gpus, r.borrowed,
                      r.started_at, $3::timestamptz, r.price
               FROM running_attempts r
               WHERE r.started_at < $2 AND $3 > $1
                 AND ($4::uuid[] IS NULL OR r.team_uids[1] = ANY($4) OR r.team_uids && $5::uuid[])
           ) i"#,
        from,
        to,
        now,
        teams.as_deref() as Option<&[Uuid]>,
        &covering,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows
        .into_iter()
        .map(|r| Interval {
            team: r.team,
            teams: r.teams,
            team_uids: r.team_uids,
            owner: r.owner,
            flavor: r.flavor,
            cluster: r.cluster,
            backend: r.backend,
            kind: r.kind,
            gpus: r.gpus,
            flagged: r.borrowed,
            borrowed: if r.borrowed { 1.0 } else { 0.0 },
            start: r.started_at,
            end: r.ended_at,
            price: r.price,
        })
        .collect())
}

/// Those of `teams` under which some work touching `[from, to)` ran: of a team below them
/// (deleted since, when they have none now).
///
/// # Errors
/// As [`db_error`].
pub async fn ledger_teams_with_work_below(
    db: impl sqlx::PgExecutor<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    teams: &[Uuid],
) -> Result<Vec<Uuid>, Error> {
    sqlx::query_scalar!(
        r#"SELECT DISTINCT u AS "team!"
           FROM (
               SELECT l.team_uids FROM usage_ledger l
               WHERE l.started_at IS NOT NULL AND l.started_at < $2 AND l.ended_at > $1 AND l.team_uids[2:] && $3
               UNION ALL
               SELECT r.team_uids FROM running_attempts r WHERE r.started_at < $2 AND r.team_uids[2:] && $3
           ) i, unnest(i.team_uids[2:]) u
           WHERE u = ANY($3)"#,
        from,
        to,
        teams,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)
}

/// GPU-hours used from `from` to `now` by each of `teams` (by uid: its whole subtree,
/// then), per flavor: ended attempts and those running now, added up in Postgres.
///
/// # Errors
/// As [`db_error`].
pub async fn ledger_use(
    db: impl sqlx::PgExecutor<'_>,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
    teams: &[Uuid],
) -> Result<Vec<(Uuid, String, f64)>, Error> {
    let rows = sqlx::query!(
        // Summed per team chain first (a few hundred groups), then spread over the teams of
        // each chain: one pass over the records. A job whose start the backend reports
        // after Berth saw it end counts nothing.
        r#"SELECT t AS "team!", g.flavor AS "flavor!", sum(g.gpu_hours)::float8 AS "gpu_hours!"
           FROM (
               SELECT i.team_uids, i.flavor,
                      sum(i.gpus * greatest(extract(epoch FROM least(i.ended_at, $2) - greatest(i.started_at, $1)), 0) / 3600)
                          AS gpu_hours
               FROM (
                   SELECT l.team_uids, l.flavor, l.gpus, l.started_at, l.ended_at FROM usage_ledger l
                   WHERE l.started_at IS NOT NULL AND l.started_at < $2 AND l.ended_at > $1
                   UNION ALL
                   SELECT r.team_uids, r.flavor, r.gpus, r.started_at, $2 FROM running_attempts r WHERE r.started_at < $2
               ) i
               GROUP BY 1, 2
           ) g, unnest(g.team_uids) t
           WHERE t = ANY($3)
           GROUP BY 1, 2"#,
        from,
        now,
        teams,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows.into_iter().map(|r| (r.team, r.flavor, r.gpu_hours)).collect())
}

/// Recent GPU-hours of the own workloads of each of `teams` (by uid) per flavor, each
/// hour counted `2^(−age / half_life)` (age: how long before `now` it was used). Ended
/// attempts and those running now; what ended more than 30 half-lives ago counts nothing.
/// An attempt counts for the first team of its chain (its team, then the ancestors it had)
/// that still exists: a deleted team's use stays with its parent.
///
/// # Errors
/// As [`db_error`].
pub async fn ledger_decayed_use(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
    half_life_seconds: u32,
    teams: &[Uuid],
) -> Result<Vec<(Uuid, String, f64)>, Error> {
    let half_life = f64::from(half_life_seconds);
    let rows = sqlx::query!(
        // ∫ 2^(−(now − t)/H) dt from start to end = H/ln 2 · (2^(−(now − end)/H) −
        // 2^(−(now − start)/H)); exponents stop at −300 (exp would underflow: an error).
        // Summed per team chain first, then given to the chain's first remaining team.
        r#"SELECT o.team AS "team!", g.flavor AS "flavor!", sum(g.gpu_hours)::float8 AS "gpu_hours!"
           FROM (
               SELECT i.team_uids, i.flavor,
                      sum(i.gpus * $3 / ln(2) / 3600 * greatest(
                          exp(greatest(-ln(2) * extract(epoch FROM $1 - least(i.ended_at, $1)) / $3, -300))
                          - exp(greatest(-ln(2) * extract(epoch FROM $1 - least(i.started_at, $1)) / $3, -300)),
                          0)) AS gpu_hours
               FROM (
                   SELECT l.team_uids, l.flavor, l.gpus, l.started_at, l.ended_at FROM usage_ledger l
                   WHERE l.started_at IS NOT NULL AND l.ended_at > $1::timestamptz - make_interval(secs => 30 * $3::float8)
                   UNION ALL
                   SELECT r.team_uids, r.flavor, r.gpus, r.started_at, $1 FROM running_attempts r
               ) i
               GROUP BY 1, 2
           ) g
           CROSS JOIN LATERAL (
               SELECT c.uid AS team FROM unnest(g.team_uids) WITH ORDINALITY AS c (uid, n)
               WHERE EXISTS (SELECT 1 FROM teams t WHERE t.uid = c.uid)
               ORDER BY c.n LIMIT 1
           ) o
           WHERE o.team = ANY($2)
           GROUP BY 1, 2"#,
        now,
        teams,
        half_life,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows.into_iter().map(|r| (r.team, r.flavor, r.gpu_hours)).collect())
}
