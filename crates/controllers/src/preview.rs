//! Quota preview: what the scheduler would do if one team's quotas were replaced, worked
//! out by `berth_sched::what_if` on the snapshot the scheduler loop reads. Nothing is
//! written; the answer names every workload until [`redact`]ed for its reader.

use std::collections::HashMap;

use berth_core::Error;
use berth_core::team::{FairShareChange, PreviewWorkload, Quota, QuotaPreview};
use berth_core::workload::Workload;
use berth_sched::snapshot::ONE_GPU;
use berth_sched::what_if::{Change, what_if};

use crate::Config;
use crate::scheduler::load_world;
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
) -> Result<QuotaPreview, Error> {
    let world = load_world(db).await?;
    let built = snapshot::build(&world, config.starvation_after.as_secs() as i64);
    let changes: Vec<Change> = world
        .flavors
        .iter()
        .map(|f| Change::SetQuota {
            team: team.to_owned(),
            flavor: f.clone(),
            quota: quotas.iter().find(|q| &q.flavor == f).map(snapshot::quota).unwrap_or_default(),
        })
        .collect();
    let result = what_if(&built.snapshot, &changes).map_err(|e| Error::Internal(e.to_string()))?;
    let by_id: HashMap<String, &Workload> = world.workloads.iter().map(|w| (w.metadata.uid.to_string(), w)).collect();
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
    preview.summary = summary(&preview);
    Ok(preview)
}

/// Leaves out what a reader may not see: the team and name of workloads of teams
/// `can_read` refuses, and those teams' fair shares.
pub fn redact(mut p: QuotaPreview, can_read: impl Fn(&str) -> bool) -> QuotaPreview {
    for listed in [&mut p.admitted, &mut p.no_longer_admitted, &mut p.preempted, &mut p.no_longer_preempted] {
        for w in listed.iter_mut().filter(|w| !w.team.as_deref().is_some_and(&can_read)) {
            w.team = None;
            w.name = None;
        }
    }
    p.fair_shares.retain(|c| can_read(&c.team));
    p.summary = summary(&p);
    p
}

/// The preview in plain words.
fn summary(p: &QuotaPreview) -> Vec<String> {
    let mut lines = Vec::new();
    let mut say = |what: &[PreviewWorkload], words: &str| {
        if what.is_empty() {
            return;
        }
        let gpus: f64 = what.iter().map(|w| w.gpus).sum();
        let (n, s) = (what.len(), if what.len() == 1 { "" } else { "s" });
        let mut teams: Vec<&str> = what.iter().map(|w| w.team.as_deref().unwrap_or("another team")).collect();
        teams.sort_unstable();
        teams.dedup();
        lines.push(format!("{n} workload{s} {words} ({} GPUs: {})", round(gpus), teams.join(", ")));
    };
    say(&p.preempted, "would be preempted");
    say(&p.admitted, "would be admitted");
    say(&p.no_longer_admitted, "would no longer be admitted");
    say(&p.no_longer_preempted, "would no longer be preempted");
    for c in &p.fair_shares {
        lines.push(format!("fair share of {} on {}: {} → {} GPUs", c.team, c.flavor, round(c.before), round(c.after)));
    }
    lines
}

/// GPUs to at most two decimals, as the scheduler counts them.
fn round(gpus: f64) -> f64 {
    let hundredths = f64::from(ONE_GPU);
    (gpus * hundredths).round() / hundredths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(team: &str, name: &str, gpus: f64) -> PreviewWorkload {
        PreviewWorkload { team: Some(team.into()), name: Some(name.into()), gpus }
    }

    #[test]
    fn a_reader_sees_the_effect_on_other_teams_but_not_their_names() {
        let share = |team: &str| FairShareChange { team: team.into(), flavor: "h100".into(), before: 4.0, after: 8.0 };
        let full = QuotaPreview {
            summary: Vec::new(),
            admitted: vec![workload("a", "a1", 8.0)],
            no_longer_admitted: Vec::new(),
            preempted: vec![workload("b", "b1", 4.0), workload("b", "b2", 4.5)],
            no_longer_preempted: Vec::new(),
            fair_shares: vec![share("a"), share("b")],
        };
        let seen = redact(full.clone(), |team| team == "a");
        assert_eq!(seen.admitted, full.admitted);
        assert_eq!(
            seen.preempted,
            vec![
                PreviewWorkload { team: None, name: None, gpus: 4.0 },
                PreviewWorkload { team: None, name: None, gpus: 4.5 }
            ]
        );
        assert_eq!(seen.fair_shares, vec![share("a")]);
        assert_eq!(
            seen.summary,
            [
                "2 workloads would be preempted (8.5 GPUs: another team)",
                "1 workload would be admitted (8 GPUs: a)",
                "fair share of a on h100: 4 → 8 GPUs",
            ]
        );
        let admin = redact(full, |_| true);
        assert_eq!(admin.summary[0], "2 workloads would be preempted (8.5 GPUs: b)");
    }
}
