//! The deletion and cancellation finalizer: a workload whose deletion or cancellation was
//! requested after it reached a backend has its job cancelled (with the grace period); once
//! the job is gone, a deleted workload is removed and a cancelled one ends `Cancelled`
//! (kept, with its events, until retention removes it). If its cluster stays unreachable
//! past the unknown timeout it is removed or ended anyway, and the orphan collector cancels
//! the job when the cluster answers again.

use berth_core::event::EventType;
use berth_core::workload::{Phase, Workload};
use berth_core::{Error, WorkloadId};
use serde::Serialize;

use berth_store::ledger::Outcome;

use crate::{Context, EVENT_KIND, Transition, finished, job_key, version};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeletionStatus {
    pub deleting: usize,
    pub cancelling: usize,
    pub cancels_sent: usize,
    pub removed: usize,
    pub cancelled: usize,
    /// Cancels a backend refused in this pass (each is asked again on the next)...
    pub cancel_errors: usize,
    /// ... and the last one's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl crate::runner::Report for DeletionStatus {
    fn changes(&self) -> usize {
        self.cancels_sent + self.removed + self.cancelled
    }

    fn waits_on_time(&self) -> bool {
        self.deleting + self.cancelling > 0
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<DeletionStatus, Error> {
    let mut status = DeletionStatus::default();
    let unfinished: Vec<Phase> = Phase::ALL.into_iter().filter(|p| !p.is_final()).collect();
    let stopping = berth_store::workload::workload_list_stopping(&ctx.db, &unfinished).await?;
    status.deleting = stopping.iter().filter(|w| w.metadata.deletion_timestamp.is_some()).count();
    status.cancelling = stopping.len() - status.deleting;
    if stopping.is_empty() {
        return Ok(status);
    }
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let now = ctx.clock.now();
    // The job is gone (or given up on): what becomes of the workload, and why.
    let mut done: Vec<(&Workload, &str)> = Vec::new();
    let mut transitions = Vec::new();
    for w in &stopping {
        let cluster = w.status.admission.as_ref().and_then(|a| clusters.iter().find(|c| c.metadata.name == a.cluster));
        let on_backend = w.status.phase.reached_backend() || w.status.phase == Phase::Admitted;
        let Some(cluster) = cluster.filter(|_| on_backend) else {
            done.push((w, "it had no backend job"));
            continue;
        };
        let requested =
            w.metadata.deletion_timestamp.or(w.status.cancellation.as_ref().map(|c| c.requested_at)).unwrap_or(now);
        let timed_out = (now - requested).to_std().unwrap_or_default() > ctx.config.unknown_timeout;
        let job = match crate::reachable_backend(ctx, cluster) {
            Some(b) => b.job(job_key(w)).await.ok().map(|job| (b, job)),
            None => None,
        };
        match job {
            None if timed_out => {
                done.push((w, "its cluster did not answer, so its job is left to the orphan collector"));
            }
            None => {}
            Some((_, None)) => done.push((w, "its job is gone")),
            Some((_, Some(job))) if job.state.is_final() => done.push((w, "its job was cancelled")),
            Some((backend, Some(job))) => {
                let cancel = crate::request_cancel(ctx, backend.as_ref(), cluster, w, job.key).await;
                if let Some(t) = cancel.transition {
                    status.cancels_sent += 1;
                    transitions.push(t);
                }
                if let Some(e) = cancel.error {
                    status.cancel_errors += 1;
                    status.error = Some(e);
                }
            }
        }
    }
    let mut tx = ctx.begin().await?;
    for (w, why) in done {
        if w.metadata.deletion_timestamp.is_some() {
            let uid = WorkloadId(w.metadata.uid);
            if berth_store::workload::workload_delete_at_version(&mut tx, uid, version(w)?).await? {
                let message = format!("deleted; {why}");
                berth_store::event::event_record(&mut *tx, EVENT_KIND, uid.0, EventType::Normal, "Deleted", &message)
                    .await?;
                // An attempt that held GPUs is accounted for (the ledger outlives the row).
                if w.status.phase != Phase::Pending
                    && let Some(record) =
                        berth_store::ledger::Attempt::of(w, Outcome::Deleted, w.status.started_at, now)
                {
                    berth_store::ledger::ledger_record(&mut tx, &[record]).await?;
                }
                status.removed += 1;
            }
        } else {
            let by = w.status.cancellation.as_ref().map_or("", |c| c.by.as_str());
            let message = format!("cancelled by {by}; {why}");
            transitions.push(Transition::new(w, finished(w, Phase::Cancelled, "Cancelled", message, None, now)));
            status.cancelled += 1;
        }
    }
    crate::write(&mut tx, &transitions, now).await?;
    berth_store::commit(tx).await?;
    Ok(status)
}
