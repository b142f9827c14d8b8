//! The idle reaper: a running notebook that reported no activity (`POST .../activity`)
//! for its `spec.notebook.idle_timeout_seconds` — counted from its start when it never
//! did — is cancelled as its owner would cancel it: the deletion controller stops its job
//! and it ends `Cancelled`, its GPUs freed. An `IdleTimeout` event says why.

use berth_core::Error;
use berth_core::event::EventType;
use berth_core::workload::{Cancellation, WorkloadStatus};
use serde::Serialize;

use crate::{Context, EVENT_KIND, version};

/// Who the cancellation of an idle notebook names.
pub const IDLE_CANCELLED_BY: &str = "berth (idle timeout)";

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IdleStatus {
    /// Running notebooks with an idle timeout.
    pub notebooks: usize,
    /// Cancelled in this pass for being idle.
    pub stopped: usize,
}

impl crate::runner::Report for IdleStatus {
    fn changes(&self) -> usize {
        self.stopped
    }

    fn waits_on_time(&self) -> bool {
        self.notebooks > 0
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<IdleStatus, Error> {
    let notebooks = berth_store::workload::workload_list_idle_candidates(&ctx.db).await?;
    let mut status = IdleStatus { notebooks: notebooks.len(), stopped: 0 };
    let now = ctx.clock.now();
    let idle: Vec<_> = notebooks.iter().filter(|w| w.idle_stop_at().is_some_and(|at| at <= now)).collect();
    if idle.is_empty() {
        return Ok(status);
    }
    let mut tx = ctx.begin().await?;
    let writes: Vec<_> = idle
        .iter()
        .map(|w| {
            Ok(berth_store::workload::StatusWrite {
                uid: berth_core::WorkloadId(w.metadata.uid),
                resource_version: version(w)?,
                status: WorkloadStatus {
                    cancellation: Some(Cancellation { requested_at: now, by: IDLE_CANCELLED_BY.into() }),
                    ..w.status.clone()
                },
            })
        })
        .collect::<Result<_, Error>>()?;
    let written: Vec<_> =
        berth_store::workload::workload_write_statuses(&mut tx, &writes).await?.into_iter().map(|w| w.uid).collect();
    for w in idle.iter().filter(|w| written.contains(&w.metadata.uid)) {
        let timeout = w.spec.notebook.map_or(0, |n| n.idle_timeout_seconds);
        let since = if w.status.last_activity_at.is_some() { "its last activity" } else { "it started" };
        let message = format!("no activity for {timeout} s since {since}: stopped to free its GPUs");
        berth_store::event::event_record(
            &mut *tx,
            EVENT_KIND,
            w.metadata.uid,
            EventType::Normal,
            "IdleTimeout",
            &message,
        )
        .await?;
        status.stopped += 1;
    }
    berth_store::commit(tx).await?;
    Ok(status)
}
