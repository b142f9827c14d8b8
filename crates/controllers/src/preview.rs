//! Quota preview: what the scheduler would do if one team's quotas were replaced, worked
//! out by `berth_sched::what_if` on the snapshot the scheduler loop reads. Nothing is
//! written; the answer names every workload until its reader's redactor
//! (`berth_core::redact`) leaves out what the reader may not see.

use std::collections::HashMap;

use berth_core::Error;
use berth_core::team::{FairShareChange, PreviewWorkload, Quota, QuotaPreview};
use berth_core::workload::Workload;
use berth_sched::what_if::{Change, what_if};

use crate::Config;
use crate::snapshot;

/// The scheduler's next plan with `team`'s quotas replaced by `quotas` (a flavor without an
/// entry: nothing guaranteed, no limit, weight 1), against its next plan as things are.
///
/// # Errors
/// Store errors; `Internal` when the team is not in the snapshot.
pub async fn quota_preview(
    db: &berth_store::PgPool,
    config: &Config,
    team: &str,
    quotas: &[Quota],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<QuotaPreview, Error> {
    let world = crate::world::read_full(db, now).await?;
    let built = snapshot::build(&world, config.starvation_after.as_secs() as i64);
    let changes: Vec<Change> = world
        .flavors
        .iter()
        .map(|f| Change::SetQuota {
            team: team.to_owned(),
            flavor: f.clone(),
            quota: quotas.iter().find(|q| &q.flavor == f).map(berth_sched::snapshot::Quota::from).unwrap_or_default(),
        })
        .collect();
    let result = what_if(&built.snapshot, &changes).map_err(|e| Error::Internal(e.to_string()))?;
    let by_id: HashMap<String, &Workload> =
        world.workloads.iter().map(|w| (w.metadata.uid.to_string(), &**w)).collect();
    let named = |ids: &[String]| -> Vec<PreviewWorkload> {
        ids.iter()
            .filter_map(|id| by_id.get(id))
            .map(|w| PreviewWorkload {
                team: w.metadata.team.clone(),
                name: Some(w.metadata.name.clone()),
                gpus: f64::from(w.spec.tasks.count) * w.spec.tasks.resources.gpus,
            })
            .collect()
    };
    let d = &result.diff;
    let mut preview = QuotaPreview {
        summary: Vec::new(),
        admitted: named(&d.admitted),
        no_longer_admitted: named(&d.no_longer_admitted),
        preempted: named(&d.preempted),
        no_longer_preempted: named(&d.no_longer_preempted),
        fair_shares: d
            .shares
            .iter()
            .map(|(team, flavor, before, after)| FairShareChange {
                team: team.clone(),
                flavor: flavor.clone(),
                before: *before,
                after: *after,
            })
            .collect(),
    };
    preview.summary = preview.summarize();
    Ok(preview)
}
