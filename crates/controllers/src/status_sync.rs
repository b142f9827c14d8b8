//! Status sync: what the backends say about Berth's jobs becomes the workloads' phases
//! (`Dispatched` → `Running` → `Succeeded` / `Failed`), and drift is settled: a job that
//! vanished while its workload ran is requeued (resumable) or failed.
//!
//! Workloads are read before the backends' job lists, so a job dispatched meanwhile can
//! never look vanished.

use std::collections::HashMap;

use berth_adapters::{JobKey, JobState, JobStatus};
use berth_core::Error;
use berth_core::cluster::ClusterHealth;
use berth_core::workload::{Phase, Workload, WorkloadStatus};
use chrono::Utc;
use serde::Serialize;

use crate::{Context, Transition, finished, job_key, requeued};

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

impl StatusSyncStatus {
    pub fn changes(&self) -> usize {
        self.started + self.finished + self.lost
    }
}

/// Whether status sync follows a workload in this phase (preempted and deleted ones
/// belong to their own controllers).
fn followed(w: &Workload) -> bool {
    matches!(w.status.phase, Phase::Dispatched | Phase::Running | Phase::Unknown)
        && w.metadata.deletion_timestamp.is_none()
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<StatusSyncStatus, Error> {
    let mut status = StatusSyncStatus::default();
    let workloads = berth_store::workload::workload_list_active(&ctx.db).await?;
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let mut by_cluster: HashMap<&str, Vec<&Workload>> = HashMap::new();
    for w in workloads.iter().filter(|w| followed(w)) {
        if let Some(a) = &w.status.admission {
            by_cluster.entry(a.cluster.as_str()).or_default().push(w);
        }
    }
    let mut transitions = Vec::new();
    for cluster in &clusters {
        let Some(watched) = by_cluster.get(cluster.metadata.name.as_str()) else { continue };
        status.clusters += 1;
        status.watched += watched.len();
        let jobs = match cluster.status.health {
            ClusterHealth::Unreachable => None,
            _ => match ctx.backends.backend(cluster) {
                Ok(b) => b.jobs().await.ok(),
                Err(_) => None,
            },
        };
        let Some(jobs) = jobs else {
            status.unreachable_clusters += 1;
            continue;
        };
        let jobs: HashMap<JobKey, JobStatus> = jobs.into_iter().map(|j| (j.key, j)).collect();
        for w in watched {
            let next = next_status(w, jobs.get(&job_key(w)));
            if let Some(next) = next {
                match next.phase {
                    Phase::Running => status.started += 1,
                    Phase::Pending => status.lost += 1,
                    Phase::Failed if next.reason.as_deref() == Some("BackendJobLost") => status.lost += 1,
                    p if p.is_final() => status.finished += 1,
                    _ => {}
                }
                transitions.push(Transition { workload: w, status: next });
            }
        }
    }
    crate::commit(ctx, &transitions).await?;
    Ok(status)
}

/// The status the job's state calls for, or `None` when the workload is up to date.
fn next_status(w: &Workload, job: Option<&JobStatus>) -> Option<WorkloadStatus> {
    let Some(job) = job else {
        let cluster = w.status.admission.as_ref().map_or("", |a| a.cluster.as_str());
        let message = format!("the job vanished from cluster {cluster}");
        return Some(if w.spec.resumable {
            requeued(w, "BackendJobLost", message)
        } else {
            finished(w, Phase::Failed, "BackendJobLost", message, None, Utc::now())
        });
    };
    let at = job.finished_at.unwrap_or_else(Utc::now);
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
        JobState::Succeeded => Some(WorkloadStatus {
            started_at: job.started_at.or(w.status.started_at),
            ..finished(w, Phase::Succeeded, "Completed", "the job completed".into(), job.exit_code, at)
        }),
        JobState::Failed => Some(WorkloadStatus {
            started_at: job.started_at.or(w.status.started_at),
            ..finished(w, Phase::Failed, "JobFailed", format!("the job failed: {}", why()), job.exit_code, at)
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
