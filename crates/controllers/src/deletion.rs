//! The deletion finalizer: a workload whose deletion was requested after it reached a
//! backend has its job cancelled (with the grace period); once the job is gone the
//! workload is removed. If its cluster stays unreachable past the unknown timeout the
//! workload is removed anyway, and the orphan collector cancels the job when the cluster
//! answers again.

use berth_core::event::EventType;
use berth_core::workload::{Phase, Workload};
use berth_core::{Error, WorkloadId};
use chrono::Utc;
use serde::Serialize;

use crate::{Context, EVENT_KIND, job_key, version};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeletionStatus {
    pub deleting: usize,
    pub cancels_sent: usize,
    pub removed: usize,
}

impl crate::runner::Report for DeletionStatus {
    fn changes(&self) -> usize {
        self.cancels_sent + self.removed
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<DeletionStatus, Error> {
    let mut status = DeletionStatus::default();
    let unfinished: Vec<Phase> = Phase::ALL.into_iter().filter(|p| !p.is_final()).collect();
    let workloads = berth_store::workload::workload_list_in_phases(&ctx.db, &unfinished, true).await?;
    let deleting: Vec<&Workload> = workloads.iter().collect();
    status.deleting = deleting.len();
    if deleting.is_empty() {
        return Ok(status);
    }
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let now = Utc::now();
    let mut remove = Vec::new();
    let mut transitions = Vec::new();
    for w in deleting {
        let cluster = w.status.admission.as_ref().and_then(|a| clusters.iter().find(|c| c.metadata.name == a.cluster));
        let Some(cluster) = cluster else {
            remove.push((w, "deleted; it had no backend job"));
            continue;
        };
        let requested = w.metadata.deletion_timestamp.unwrap_or(now);
        let timed_out = (now - requested).to_std().unwrap_or_default() > ctx.config.unknown_timeout;
        let job = match crate::reachable_backend(ctx, cluster) {
            Some(b) => b.job(job_key(w)).await.ok().map(|job| (b, job)),
            None => None,
        };
        match job {
            None if timed_out => {
                remove.push((w, "deleted; its cluster did not answer, so its job is left to the orphan collector"))
            }
            None => {}
            Some((_, None)) => remove.push((w, "deleted; its job is gone")),
            Some((_, Some(job))) if job.state.is_final() => remove.push((w, "deleted; its job was cancelled")),
            Some((backend, Some(job))) => {
                if let Some(t) = crate::request_cancel(ctx, backend.as_ref(), w, job.key).await {
                    status.cancels_sent += 1;
                    transitions.push(t);
                }
            }
        }
    }
    crate::commit(ctx, &transitions).await?;
    let mut tx = ctx.begin().await?;
    for (w, message) in remove {
        let uid = WorkloadId(w.metadata.uid);
        if berth_store::workload::workload_delete_at_version(&mut tx, uid, version(w)?).await? {
            berth_store::event::event_record(&mut *tx, EVENT_KIND, uid.0, EventType::Normal, "Deleted", message)
                .await?;
            status.removed += 1;
        }
    }
    berth_store::commit(tx).await?;
    Ok(status)
}
