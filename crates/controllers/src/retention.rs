//! Retention: a workload that has ended (`Succeeded`, `Failed`, `Cancelled`) stays, with
//! its events and times, for the retention period after it finished (`Config::retention`,
//! `BERTH_RETENTION_DAYS`), and is then removed, a batch at a time; each removal is
//! recorded as an event. The usage history is not touched. Idempotency keys are forgotten
//! once their lifetime is over, deleted workloads' tombstones (the change feed's) after
//! [`crate::world::TOMBSTONES_KEPT`], and what was explained of workloads no longer
//! pending ([`berth_store::workload::workload_explanations_purge`]).

use berth_core::Error;
use serde::Serialize;

use crate::Context;

/// The most workloads one pass removes (the loop runs again at once while there are more).
const BATCH: i64 = 1000;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RetentionStatus {
    pub removed: usize,
}

impl crate::runner::Report for RetentionStatus {
    fn changes(&self) -> usize {
        self.removed
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<RetentionStatus, Error> {
    let before = ctx.clock.now() - ctx.config.retention;
    let mut tx = ctx.begin().await?;
    let removed = berth_store::workload::workload_remove_ended_before(&mut tx, before, BATCH).await?;
    let lifetime = berth_store::idempotency::KEY_LIFETIME;
    berth_store::idempotency::idempotency_prune(&mut *tx, ctx.clock.now() - lifetime).await?;
    berth_store::workload::workload_tombstones_purge(&mut *tx, crate::world::TOMBSTONES_KEPT.as_secs_f64()).await?;
    berth_store::workload::workload_explanations_purge(&mut *tx).await?;
    berth_store::commit(tx).await?;
    Ok(RetentionStatus { removed: usize::try_from(removed).unwrap_or(usize::MAX) })
}
