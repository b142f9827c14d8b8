//! The dispatcher: each `Admitted` workload becomes one backend job, then `Dispatched`.
//!
//! It claims workloads with `FOR UPDATE SKIP LOCKED` and holds the claim while it talks to
//! the backend, so no two dispatchers (even two replicas that both think they lead) work on
//! one workload. Before submitting it commits a *dispatch intent* per job; a claimed
//! workload that already has one may have its job on the backend (the dispatcher died
//! after the backend accepted it, or the answer was lost), so its cluster's jobs are
//! listed and the job is adopted instead of made twice. Workloads without an intent need
//! no lookup, which keeps a burst to one backend call per job, a few of them in flight.

use std::collections::HashMap;
use std::sync::Arc;

use berth_adapters::{BackendError, ClusterBackend, JobKey, JobRequest, JobState, JobStatus};
use berth_core::Error;
use berth_core::workload::{Admission, BackendRef, Phase, Workload, WorkloadStatus};
use futures_util::StreamExt;
use serde::Serialize;
use uuid::Uuid;

use crate::snapshot::hundredths;
use crate::{Context, Transition, job_key};

/// Workloads claimed per transaction.
const BATCH: i64 = 200;

/// Submissions in flight at once. slurmrestd takes a burst fastest from a few connections
/// (measured on the dev cluster: ~700 jobs/s one at a time, ~950 from 2–8 at once).
const SUBMITS_IN_FLIGHT: usize = 4;

/// The log message for a job found already on the backend.
pub const ADOPTED: &str = "adopted a job an earlier dispatch submitted";

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
        let keys: Vec<(Uuid, u32)> = claimed.iter().map(|w| (w.metadata.uid, w.status.attempt)).collect();
        let intents = berth_store::dispatch::dispatch_intents_of(&mut *tx, &keys).await?;
        // Each cluster's jobs, listed once per batch and only if a claimed workload there
        // has an intent; `None` when the listing failed.
        let mut listed: HashMap<&str, Option<HashMap<JobKey, JobStatus>>> = HashMap::new();
        let mut to_submit = Vec::new();
        let mut transitions = Vec::new();
        for w in &claimed {
            let Some(a) = &w.status.admission else { continue };
            let cluster = clusters.iter().find(|c| c.metadata.name == a.cluster);
            let Some(backend) = cluster.and_then(|c| crate::reachable_backend(ctx, c)) else {
                status.deferred += 1;
                skip.push(w.metadata.uid);
                continue;
            };
            if intents.contains(&(w.metadata.uid, w.status.attempt)) {
                if !listed.contains_key(a.cluster.as_str()) {
                    let jobs = backend.jobs().await.ok().map(|j| j.into_iter().map(|j| (j.key, j)).collect());
                    listed.insert(&a.cluster, jobs);
                }
                match &listed[a.cluster.as_str()] {
                    None => {
                        status.deferred += 1;
                        skip.push(w.metadata.uid);
                        continue;
                    }
                    Some(jobs) => {
                        if let Some(job) = jobs.get(&job_key(w)) {
                            tracing::info!(workload = %w.metadata.uid, cluster = %a.cluster, job = %job.job_id, "{ADOPTED}");
                            status.adopted += 1;
                            transitions.push(Transition { workload: w, status: dispatched(w, &a.cluster, job) });
                            continue;
                        }
                    }
                }
            }
            to_submit.push((w, a, backend));
        }
        let announced: Vec<(Uuid, u32)> = to_submit.iter().map(|(w, ..)| (w.metadata.uid, w.status.attempt)).collect();
        berth_store::dispatch::dispatch_intents_record(&ctx.db, &announced).await?;
        // Boxed so the stream's type names no closure (which trips the `Send` check of the
        // controller loop's future).
        let submits: Vec<Submit<'_>> =
            to_submit.into_iter().map(|(w, a, backend)| Box::pin(submit(w, a, backend)) as _).collect();
        let answers: Vec<_> = futures_util::stream::iter(submits).buffered(SUBMITS_IN_FLIGHT).collect().await;
        for (w, a, answer) in answers {
            let next = match answer {
                Ok(job) => {
                    status.dispatched += 1;
                    dispatched(w, &a.cluster, &job)
                }
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
        let settled: Vec<(Uuid, u32)> =
            transitions.iter().map(|t| (t.workload.metadata.uid, t.workload.status.attempt)).collect();
        berth_store::dispatch::dispatch_intents_clear(&mut *tx, &settled).await?;
        berth_store::commit(tx).await?;
    }
}

type Submit<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = (&'a Workload, &'a Admission, Result<JobStatus, BackendError>)> + Send + 'a>,
>;

async fn submit<'a>(
    w: &'a Workload,
    a: &'a Admission,
    backend: Arc<dyn ClusterBackend>,
) -> (&'a Workload, &'a Admission, Result<JobStatus, BackendError>) {
    (w, a, backend.submit(&request(w)).await)
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
