//! SQL for the accounting ledger: one record per workload attempt that held GPUs.

use berth_core::Error;
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
        r#"INSERT INTO usage_ledger (workload_uid, attempt, team, teams, workload, owner, flavor, cluster, backend,
                                     kind, gpus, borrowed, started_at, ended_at, outcome)
           SELECT i.uid, i.attempt, i.team,
                  ARRAY(WITH RECURSIVE up (uid, name, parent_uid, depth) AS (
                            SELECT t.uid, t.name, t.parent_uid, 0 FROM teams t WHERE t.name = i.team
                            UNION ALL
                            SELECT p.uid, p.name, p.parent_uid, up.depth + 1 FROM teams p JOIN up ON p.uid = up.parent_uid)
                        SELECT name FROM up ORDER BY depth),
                  i.workload, i.owner, i.flavor, i.cluster,
                  coalesce((SELECT c.kind FROM clusters c WHERE c.name = i.cluster), 'unknown'),
                  i.kind, i.gpus, i.borrowed, i.started_at, i.ended_at, i.outcome
           FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                       $9::float8[], $10::bool[], $11::timestamptz[], $12::timestamptz[], $13::text[])
                AS i (uid, attempt, team, workload, owner, flavor, cluster, kind, gpus, borrowed, started_at, ended_at, outcome)
           ON CONFLICT (workload_uid, attempt) DO NOTHING"#,
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
