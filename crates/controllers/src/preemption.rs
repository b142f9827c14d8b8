//! The preemption executor: a workload the scheduler marked `Preempting` has its job
//! cancelled with a grace period (to checkpoint); once the job is gone it is requeued
//! (resumable, or it never started) with attempt + 1 and its original submit time, or
//! else failed (`Preempted`).

use std::collections::HashMap;

use berth_adapters::{JobKey, JobStatus};
use berth_core::Error;
use berth_core::workload::{Phase, Workload};
use chrono::Utc;
use serde::Serialize;

use crate::{Context, Transition, finished, job_key, requeued};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreemptionStatus {
    pub preempting: usize,
    pub cancels_sent: usize,
    pub requeued: usize,
    pub failed: usize,
}

impl crate::runner::Report for PreemptionStatus {
    fn changes(&self) -> usize {
        self.cancels_sent + self.requeued + self.failed
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<PreemptionStatus, Error> {
    let mut status = PreemptionStatus::default();
    let workloads = berth_store::workload::workload_list_in_phases(&ctx.db, &[Phase::Preempting], false).await?;
    let preempting: Vec<&Workload> = workloads.iter().collect();
    status.preempting = preempting.len();
    if preempting.is_empty() {
        return Ok(status);
    }
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let mut jobs_of: HashMap<&str, Option<HashMap<JobKey, JobStatus>>> = HashMap::new();
    let mut transitions = Vec::new();
    for w in preempting {
        let Some(a) = &w.status.admission else { continue };
        let Some(cluster) = clusters.iter().find(|c| c.metadata.name == a.cluster) else { continue };
        let Some(backend) = crate::reachable_backend(ctx, cluster) else { continue };
        if !jobs_of.contains_key(a.cluster.as_str()) {
            let jobs = backend.jobs_recent().await.ok().map(|j| j.into_iter().map(|j| (j.key, j)).collect());
            jobs_of.insert(&a.cluster, jobs);
        }
        let Some(jobs) = &jobs_of[a.cluster.as_str()] else { continue };
        let message = w.status.message.clone().unwrap_or_else(|| "preempted".into());
        match jobs.get(&job_key(w)) {
            Some(job) if !job.state.is_final() => {
                if let Some(t) = crate::request_cancel(ctx, backend.as_ref(), w, job.key).await {
                    status.cancels_sent += 1;
                    transitions.push(t);
                }
            }
            Some(job) if job.started_at.is_some() && !w.spec.resumable => {
                status.failed += 1;
                let at = job.finished_at.unwrap_or_else(Utc::now);
                transitions.push(Transition {
                    workload: w,
                    status: finished(w, Phase::Failed, "Preempted", format!("{message}; not resumable"), None, at),
                });
            }
            _ => {
                status.requeued += 1;
                transitions
                    .push(Transition { workload: w, status: requeued(w, "Preempted", format!("{message}; requeued")) });
            }
        }
    }
    crate::commit(ctx, &transitions).await?;
    Ok(status)
}
