//! Status sync: what the backends say about Berth's jobs becomes the workloads' phases
//! (`Dispatched` → `Running` → `Succeeded` / `Failed`), and drift is settled: a job that
//! vanished while its workload ran is requeued (resumable) or failed, and one the backend
//! could not start as placed (`Unplaceable`) is requeued.
//!
//! Workloads are read before the backends' job lists, so a job dispatched meanwhile can
//! never look vanished. Where each workload on a backend stands is kept between passes and
//! brought up to date from the change feed ([`Followed`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_adapters::{JobKey, JobState, JobStatus};
use berth_core::Error;
use berth_core::workload::{Phase, Workload, WorkloadStatus};
use berth_store::workload::BackendWork;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{Context, Transition, finished, requeued, requeued_or_failed};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatusSyncStatus {
    pub clusters: usize,
    pub watched: usize,
    pub started: usize,
    pub finished: usize,
    /// Jobs that vanished from their backend while their workload ran.
    pub lost: usize,
    pub unreachable_clusters: usize,
}

impl crate::runner::Report for StatusSyncStatus {
    fn changes(&self) -> usize {
        self.started + self.finished + self.lost
    }

    /// With no work on a backend there is nothing to ask the backends about until a
    /// dispatch (or an adoption, or work marked `Unknown`) is written, which wakes it: an
    /// idle site reads its clusters at the resync instead of every `sync_interval`.
    fn waits_on_time(&self) -> bool {
        self.watched > 0
    }
}

/// The phases status sync follows (preempted and deleted work belongs to their own
/// controllers).
pub const FOLLOWED: [Phase; 3] = [Phase::Dispatched, Phase::Running, Phase::Unknown];

/// How often [`Followed`] reads every workload on a backend again instead of the changes:
/// the safety net, and well within the hour tombstones are kept.
const FULL_READ_EVERY: Duration = Duration::from_secs(60);

/// Where each workload on a backend stood at the last pass, brought up to date from the
/// change feed each pass: reading them all twice a second took 144–184 ms of Postgres a
/// pass at 100,000 running. Kept in the [`Context`]; a new lease term starts without.
#[derive(Clone, Default)]
pub struct Followed(Arc<tokio::sync::Mutex<Option<Kept>>>);

struct Kept {
    /// The change cursor of the last read, and when the last full read was.
    cursor: berth_store::workload::FeedCursor,
    full_at: Instant,
    work: HashMap<Uuid, BackendWork>,
}

impl Followed {
    /// The light view of every followed workload (no specs) by uid, as the store holds it
    /// now; held until the guard is dropped.
    ///
    /// # Errors
    /// Store errors.
    pub async fn load(&self, db: &berth_store::PgPool) -> Result<FollowedWork<'_>, Error> {
        let mut kept = self.0.lock().await;
        let mut tx = berth_store::begin_snapshot(db).await?;
        let cursor = berth_store::workload::change_cursor(&mut *tx).await?;
        match kept.as_mut() {
            Some(k) if k.full_at.elapsed() < FULL_READ_EVERY => {
                let written =
                    berth_store::workload::workload_backend_work_written_since(&mut *tx, &FOLLOWED, &k.cursor).await?;
                let deleted = berth_store::workload::workload_deleted_since(&mut *tx, &k.cursor).await?;
                for (uid, work) in written {
                    match work {
                        Some(w) => k.work.insert(uid, w),
                        None => k.work.remove(&uid),
                    };
                }
                for uid in deleted {
                    k.work.remove(&uid);
                }
                k.cursor = cursor;
            }
            _ => {
                let all = berth_store::workload::workload_list_backend_work(&mut *tx, &FOLLOWED).await?;
                let work = all.into_iter().map(|w| (w.uid, w)).collect();
                *kept = Some(Kept { cursor, full_at: Instant::now(), work });
            }
        }
        berth_store::commit(tx).await?;
        Ok(FollowedWork(kept))
    }
}

/// What [`Followed::load`] read, borrowed from what is kept.
pub struct FollowedWork<'a>(tokio::sync::MutexGuard<'a, Option<Kept>>);

impl std::ops::Deref for FollowedWork<'_> {
    type Target = HashMap<Uuid, BackendWork>;
    fn deref(&self) -> &Self::Target {
        &self.0.as_ref().expect("loaded").work
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<StatusSyncStatus, Error> {
    let mut status = StatusSyncStatus::default();
    // A light view first (no specs): most work is as the backend says, and only the rest
    // is read in full.
    let work = ctx.followed.load(&ctx.db).await?;
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let mut by_cluster: HashMap<&str, Vec<&BackendWork>> = HashMap::new();
    for w in work.values() {
        by_cluster.entry(w.cluster.as_str()).or_default().push(w);
    }
    let mut candidates: HashMap<Uuid, Option<JobStatus>> = HashMap::new();
    for cluster in &clusters {
        let Some(watched) = by_cluster.get(cluster.metadata.name.as_str()) else { continue };
        status.clusters += 1;
        status.watched += watched.len();
        let jobs = match crate::reachable_backend(ctx, cluster) {
            Some(b) => b.jobs_recent().await.ok(),
            None => None,
        };
        let Some(jobs) = jobs else {
            status.unreachable_clusters += 1;
            continue;
        };
        let mut jobs: HashMap<JobKey, JobStatus> = jobs.into_iter().map(|j| (j.key, j)).collect();
        for w in watched {
            let job = jobs.remove(&JobKey { workload: w.uid, attempt: w.attempt });
            let current = match job.as_ref().map(|j| j.state) {
                Some(JobState::Queued) => w.phase != Phase::Unknown,
                Some(JobState::Running) => w.phase == Phase::Running,
                _ => false,
            };
            if !current {
                candidates.insert(w.uid, job);
            }
        }
    }
    let uids: Vec<Uuid> = candidates.keys().copied().collect();
    let workloads = berth_store::workload::workload_fetch_many(&ctx.db, &uids).await?;
    let mut transitions = Vec::new();
    for w in &workloads {
        let job = &candidates[&w.metadata.uid];
        // The workload moved on since the light read (another attempt, another phase):
        // leave it for the next pass.
        let same =
            work.get(&w.metadata.uid).is_some_and(|b| b.attempt == w.status.attempt && b.phase == w.status.phase);
        if !same || w.stopping() {
            continue;
        }
        if let Some(next) = next_status(w, job.as_ref(), ctx.clock.now()) {
            match next.phase {
                Phase::Running => status.started += 1,
                Phase::Pending => status.lost += 1,
                Phase::Failed if next.reason.as_deref() == Some("BackendJobLost") => status.lost += 1,
                p if p.is_final() => status.finished += 1,
                _ => {}
            }
            transitions.push(Transition::new(w, next));
        }
    }
    crate::commit(ctx, &transitions).await?;
    Ok(status)
}

/// The status the job's state calls for, or `None` when the workload is up to date.
fn next_status(w: &Workload, job: Option<&JobStatus>, now: DateTime<Utc>) -> Option<WorkloadStatus> {
    let Some(job) = job else {
        let cluster = w.status.admission.as_ref().map_or("", |a| a.cluster.as_str());
        return Some(requeued_or_failed(w, "BackendJobLost", format!("the job vanished from cluster {cluster}"), now));
    };
    let at = job.finished_at.unwrap_or(now);
    let why = || job.reason.clone().unwrap_or_default();
    match job.state {
        JobState::Queued if w.status.phase == Phase::Unknown => Some(WorkloadStatus {
            phase: Phase::Dispatched,
            unknown_since: None,
            message: Some("the cluster answers again; the job is queued".into()),
            ..w.status.clone()
        }),
        JobState::Queued => None,
        JobState::Running if w.status.phase == Phase::Running => None,
        JobState::Running => Some(WorkloadStatus {
            phase: Phase::Running,
            started_at: job.started_at.or(w.status.started_at),
            unknown_since: None,
            message: Some(format!("running as job {}", job.job_id)),
            ..w.status.clone()
        }),
        JobState::Unplaceable => Some(requeued(
            w,
            "Unplaceable",
            format!("the cluster did not start the job as placed; requeued: {}", why()),
        )),
        JobState::Succeeded => Some(WorkloadStatus {
            started_at: job.started_at.or(w.status.started_at),
            ..finished(w, Phase::Succeeded, "Completed", "the job completed".into(), job.exit_code, at)
        }),
        JobState::Failed => Some(WorkloadStatus {
            started_at: job.started_at.or(w.status.started_at),
            ..finished(w, Phase::Failed, "JobFailed", format!("the job failed: {}", why()), job.exit_code, at)
        }),
        JobState::TimedOut => Some(WorkloadStatus {
            started_at: job.started_at.or(w.status.started_at),
            ..finished(
                w,
                Phase::Failed,
                "TimeLimitReached",
                format!("the job reached its time limit: {}", why()),
                job.exit_code,
                at,
            )
        }),
        JobState::Cancelled => Some(finished(
            w,
            Phase::Failed,
            "CancelledOnBackend",
            format!("the job was cancelled outside Berth: {}", why()),
            job.exit_code,
            at,
        )),
    }
}
