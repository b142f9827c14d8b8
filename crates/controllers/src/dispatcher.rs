//! The dispatcher: each `Admitted` workload becomes one backend job, then `Dispatched`.
//!
//! It claims workloads with `FOR UPDATE SKIP LOCKED` and holds the claim while it talks to
//! the backend, so no two dispatchers (even two replicas that both think they lead) work on
//! one workload; and it looks the job up by key before submitting, so a dispatcher killed
//! after the backend accepted the job, but before the database recorded it, finds that
//! job on the next pass instead of making a second one.

use berth_adapters::{BackendError, JobRequest, JobState, JobStatus};
use berth_core::Error;
use berth_core::workload::{BackendRef, Phase, Workload, WorkloadStatus};
use serde::Serialize;

use crate::snapshot::hundredths;
use crate::{Context, Transition, job_key};

/// Workloads claimed per transaction.
const BATCH: i64 = 200;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DispatcherStatus {
    pub dispatched: usize,
    /// Found already on the backend (a retry after a crash).
    pub adopted: usize,
    /// Left `Admitted` because the cluster did not answer.
    pub deferred: usize,
    /// Failed because the backend refused the job.
    pub rejected: usize,
}

impl crate::runner::Report for DispatcherStatus {
    fn changes(&self) -> usize {
        self.dispatched + self.adopted + self.rejected
    }
}

/// Dispatches every admitted workload it can claim.
///
/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<DispatcherStatus, Error> {
    let mut status = DispatcherStatus::default();
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let mut skip = Vec::new();
    loop {
        let mut tx = berth_store::begin(&ctx.db).await?;
        let claimed = berth_store::workload::workload_claim(&mut tx, Phase::Admitted, &skip, BATCH).await?;
        if claimed.is_empty() {
            return Ok(status);
        }
        let mut transitions = Vec::new();
        for w in &claimed {
            let Some(a) = &w.status.admission else { continue };
            let cluster = clusters.iter().find(|c| c.metadata.name == a.cluster);
            let Some(backend) = cluster.and_then(|c| crate::reachable_backend(ctx, c)) else {
                status.deferred += 1;
                skip.push(w.metadata.uid);
                continue;
            };
            let found = match backend.job(job_key(w)).await {
                Ok(found) => found,
                Err(_) => {
                    status.deferred += 1;
                    skip.push(w.metadata.uid);
                    continue;
                }
            };
            let outcome = match found {
                Some(job) => {
                    status.adopted += 1;
                    Ok(job)
                }
                None => backend.submit(&request(w)).await.inspect(|_| status.dispatched += 1),
            };
            let next = match outcome {
                Ok(job) => dispatched(w, &a.cluster, &job),
                Err(BackendError::Rejected(why) | BackendError::Unsupported(why)) => {
                    status.rejected += 1;
                    crate::finished(w, Phase::Failed, "BackendRejected", why, None, chrono::Utc::now())
                }
                Err(BackendError::Unreachable(_)) => {
                    status.deferred += 1;
                    skip.push(w.metadata.uid);
                    continue;
                }
            };
            transitions.push(Transition { workload: w, status: next });
        }
        crate::write(&mut tx, &transitions).await?;
        berth_store::commit(tx).await?;
    }
}

fn dispatched(w: &Workload, cluster: &str, job: &JobStatus) -> WorkloadStatus {
    let running = job.state == JobState::Running;
    WorkloadStatus {
        phase: if running { Phase::Running } else { Phase::Dispatched },
        backend_ref: Some(BackendRef { cluster: cluster.to_owned(), job_id: job.job_id.clone() }),
        started_at: job.started_at,
        message: Some(format!("dispatched to {cluster} as job {}", job.job_id)),
        ..w.status.clone()
    }
}

/// The backend request for the workload's current attempt.
pub fn request(w: &Workload) -> JobRequest {
    let a = w.status.admission.as_ref().expect("dispatched workloads are admitted");
    let r = &w.spec.tasks.resources;
    JobRequest {
        key: job_key(w),
        team: w.metadata.team.clone().unwrap_or_default(),
        workload: w.metadata.name.clone(),
        kind: w.spec.kind,
        flavor: a.flavor.clone(),
        tasks: w.spec.tasks.count,
        gpus_per_task: hundredths(r.gpus),
        cpus_per_task: r.cpus,
        memory_mib_per_task: r.memory_mib,
        nodes: a.placement.iter().map(|p| p.node.clone()).collect(),
        run: w.spec.run.clone(),
        max_runtime_seconds: w.spec.max_runtime_seconds,
        sim_duration_seconds: w.spec.sim.as_ref().map(|s| s.duration_seconds),
    }
}
