//! The preemption executor: a workload the scheduler marked `Preempting` has its job
//! cancelled with a grace period (to checkpoint); once the job is gone it is requeued
//! (resumable, or it never started) with attempt + 1 and its original submit time, or
//! else failed (`Preempted`). Until then it holds its GPUs (the scheduler counts them).
//!
//! While its cluster does not answer, the workload stays `Preempting` (its job may still
//! run, so its GPUs stay held) with `unknown_since` set; when the cluster answers again
//! the preemption goes on, and if it stays unreachable for `unknown_timeout` the
//! preemption ends as if the job had stopped. Either way it ends in the preemption's
//! outcome, never as a job cancelled outside Berth.

use std::collections::HashMap;

use berth_adapters::{JobKey, JobStatus};
use berth_core::Error;
use berth_core::workload::{Phase, Workload, WorkloadStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{Context, Transition, finished, job_key, requeued};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreemptionStatus {
    pub preempting: usize,
    pub cancels_sent: usize,
    pub requeued: usize,
    pub failed: usize,
    /// On a cluster that does not answer.
    pub unreachable: usize,
    /// Cancels a backend refused in this pass (each is asked again on the next)...
    pub cancel_errors: usize,
    /// ... and the last one's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl crate::runner::Report for PreemptionStatus {
    fn changes(&self) -> usize {
        self.cancels_sent + self.requeued + self.failed
    }

    fn waits_on_time(&self) -> bool {
        self.preempting > 0
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
        let message = w.status.message.clone().unwrap_or_else(|| "preempted".into());
        let jobs = match crate::reachable_backend(ctx, cluster) {
            Some(backend) => {
                if !jobs_of.contains_key(a.cluster.as_str()) {
                    let jobs = backend.jobs_recent().await.ok().map(|j| j.into_iter().map(|j| (j.key, j)).collect());
                    jobs_of.insert(&a.cluster, jobs);
                }
                jobs_of[a.cluster.as_str()].as_ref().map(|jobs| (backend, jobs))
            }
            None => None,
        };
        let Some((backend, jobs)) = jobs else {
            status.unreachable += 1;
            let now = ctx.clock.now();
            let since = w.status.unknown_since.unwrap_or(now);
            if w.status.unknown_since.is_none() {
                let status = WorkloadStatus { unknown_since: Some(now), ..w.status.clone() };
                transitions.push(Transition::new(w, status));
            } else if (now - since).to_std().unwrap_or_default() >= ctx.config.unknown_timeout {
                let why = format!("{message}; cluster {} stayed unreachable", a.cluster);
                transitions.push(outcome(w, w.status.started_at.is_some(), why, now, &mut status));
            }
            continue;
        };
        match jobs.get(&job_key(w)) {
            Some(job) if !job.state.is_final() => {
                let cancel = crate::request_cancel(ctx, backend.as_ref(), cluster, w, job.key).await;
                if let Some(e) = cancel.error {
                    status.cancel_errors += 1;
                    status.error = Some(e);
                }
                let asked = cancel.transition;
                status.cancels_sent += usize::from(asked.is_some());
                // The cluster answers: an outage, if there was one, is over.
                let next =
                    asked.or_else(|| w.status.unknown_since.is_some().then(|| Transition::new(w, w.status.clone())));
                if let Some(mut next) = next {
                    next.status.unknown_since = None;
                    transitions.push(next);
                }
            }
            Some(job) => {
                let at = job.finished_at.unwrap_or_else(|| ctx.clock.now());
                transitions.push(outcome(w, job.started_at.is_some(), message, at, &mut status));
            }
            None => transitions.push(outcome(w, false, message, ctx.clock.now(), &mut status)),
        }
    }
    crate::commit(ctx, &transitions).await?;
    Ok(status)
}

/// How a preemption ends once the job is gone (or given up on at `at`): failed if the job
/// had started and the workload cannot resume, requeued otherwise.
fn outcome<'a>(
    w: &'a Workload,
    started: bool,
    message: String,
    at: DateTime<Utc>,
    status: &mut PreemptionStatus,
) -> Transition<'a> {
    let next = if started && !w.spec.resumable {
        status.failed += 1;
        finished(w, Phase::Failed, "Preempted", format!("{message}; not resumable"), None, at)
    } else {
        status.requeued += 1;
        requeued(w, "Preempted", format!("{message}; requeued"))
    };
    Transition { ended_at: Some(at), ..Transition::new(w, next) }
}
