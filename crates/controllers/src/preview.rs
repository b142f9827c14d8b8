//! Quota preview: what the scheduler would do if one team's quotas and parent (and, for a
//! top-level team, its fair sharing over time) were replaced, worked
//! out by `berth_sched::what_if` on the snapshot the scheduler loop reads. Nothing is
//! written; the answer names every workload until its reader's redactor
//! (`berth_core::redact`) leaves out what the reader may not see.

use std::collections::HashMap;

use berth_core::Error;
use berth_core::team::{FairShareChange, OverLimit, PreviewWorkload, QuotaPreview, TeamSpec};
use berth_core::workload::Workload;
use berth_sched::what_if::{Change, what_if};

use crate::Config;
use crate::snapshot;

/// The scheduler's next plan with `team`'s quotas and parent replaced by `spec`'s (a flavor
/// without an entry: nothing guaranteed, no limit, weight 1), and its tree's recent use
/// weighed as `spec.fair_sharing` says, against its next plan as things are.
///
/// # Errors
/// Store errors; `Internal` when the team is not in the snapshot.
pub async fn quota_preview(
    db: &berth_store::PgPool,
    config: &Config,
    team: &str,
    spec: &TeamSpec,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<QuotaPreview, Error> {
    let world = crate::world::read_full(db, now).await?;
    let built = snapshot::build(&world, config.starvation_after.as_secs() as i64);
    let mut changes: Vec<Change> = world
        .flavors
        .iter()
        .map(|f| Change::SetQuota {
            team: team.to_owned(),
            flavor: f.clone(),
            quota: (spec.quotas.iter().find(|q| &q.flavor == f))
                .map(berth_sched::snapshot::Quota::from)
                .unwrap_or_default(),
        })
        .collect();
    let current = world.teams.iter().find(|t| t.metadata.name == team).map(|t| &t.spec);
    if current.is_some_and(|c| c.parent != spec.parent) {
        changes.push(Change::SetParent { team: team.to_owned(), parent: spec.parent.clone() });
    }
    if spec.fair_sharing != current.and_then(|c| c.fair_sharing) {
        changes.extend(recent_usage_with(db, &world, &built.snapshot, team, spec, now).await?);
    }
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
        preempted_once_protected_ends: named(&d.preempted_once_protected_ends),
        kept_beyond_guarantee: named(&d.kept_beyond_guarantee),
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
        over_limit: over_limit(&built.snapshot, team, spec, &d.preempted),
    };
    preview.summary = preview.summarize();
    Ok(preview)
}

/// The flavors of which `team`, with `spec`, or a team above it would run more than its
/// limit: the running work of its subtree that is not stopping already or by the change
/// (`preempted`, by workload id) against `spec`'s limits for the team and the snapshot's
/// for those above (under `spec.parent`).
fn over_limit(s: &berth_sched::Snapshot, team: &str, spec: &TeamSpec, preempted: &[String]) -> Vec<OverLimit> {
    let Some(me) = s.teams.iter().position(|t| t.name == team) else { return Vec::new() };
    let index = |name: &str| s.teams.iter().position(|t| t.name == name);
    let mut line = vec![me];
    let mut up = spec.parent.as_deref().and_then(index);
    while let Some(t) = up.filter(|t| !line.contains(t)) {
        line.push(t);
        up = s.teams[t].parent;
    }
    let ancestors = berth_sched::cycle::ancestors(s);
    let mut held = vec![0u64; s.flavors.len()];
    for r in s.running.iter().filter(|r| !r.preempting && !preempted.contains(&r.id)) {
        if ancestors[r.team].contains(&me) {
            held[r.flavor] += u64::from(r.tasks.total_gpus());
        }
    }
    let mut out = Vec::new();
    for &t in &line {
        for (f, flavor) in s.flavors.iter().enumerate() {
            let limit = if t == me {
                spec.quotas.iter().find(|q| &q.flavor == flavor).and_then(|q| q.limit)
            } else {
                s.teams[t].quotas[f].limit
            };
            // Above the team, its own subtree's work counts with the rest of theirs.
            let holds = if t == me {
                held[f]
            } else {
                let moved = |r: &berth_sched::snapshot::Running| ancestors[r.team].contains(&me);
                held[f]
                    + s.running
                        .iter()
                        .filter(|r| r.flavor == f && !r.preempting && !preempted.contains(&r.id))
                        .filter(|r| !moved(r) && ancestors[r.team].contains(&t))
                        .map(|r| u64::from(r.tasks.total_gpus()))
                        .sum::<u64>()
            };
            if let Some(limit) = limit
                && holds > u64::from(limit) * u64::from(berth_sched::snapshot::ONE_GPU)
            {
                out.push(OverLimit {
                    team: s.teams[t].name.clone(),
                    flavor: flavor.clone(),
                    holds: holds as f64 / f64::from(berth_sched::snapshot::ONE_GPU),
                    limit,
                });
            }
        }
    }
    out
}

/// The recent use of every team of `top`'s tree as `spec.fair_sharing` would weigh it:
/// decayed by its half-life, or not weighed at all.
async fn recent_usage_with(
    db: &berth_store::PgPool,
    world: &snapshot::World,
    s: &berth_sched::Snapshot,
    top: &str,
    spec: &TeamSpec,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<Change>, Error> {
    // The snapshot's teams are the world's, in the same order.
    let top = s.teams.iter().position(|t| t.name == top);
    let ancestors = berth_sched::cycle::ancestors(s);
    let tree: Vec<&berth_core::team::Team> = (world.teams.iter().zip(&ancestors))
        .filter(|(_, up)| top.is_some_and(|t| up.contains(&t)))
        .map(|(t, _)| t)
        .collect();
    let Some(f) = spec.fair_sharing else {
        return Ok(tree
            .iter()
            .map(|t| Change::SetRecentUsage { team: t.metadata.name.clone(), gpu_hours: None })
            .collect());
    };
    let uids: Vec<uuid::Uuid> = tree.iter().map(|t| t.metadata.uid).collect();
    let mut used: HashMap<uuid::Uuid, std::collections::BTreeMap<String, f64>> = HashMap::new();
    for (uid, flavor, own) in berth_store::ledger::ledger_decayed_use(db, now, f.usage_half_life_seconds, &uids).await?
    {
        if world.flavors.contains(&flavor) {
            used.entry(uid).or_default().insert(flavor, own);
        }
    }
    Ok(tree
        .iter()
        .map(|t| Change::SetRecentUsage {
            team: t.metadata.name.clone(),
            gpu_hours: Some(used.remove(&t.metadata.uid).unwrap_or_default()),
        })
        .collect())
}
