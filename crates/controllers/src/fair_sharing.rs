//! Fairness over time: each team's recent GPU-hours, decayed by its tree's
//! `spec.fair_sharing.usage_half_life_seconds`, from the ledger and the work running now,
//! written to `status.recent_usage`. The scheduler reads it there and weighs what each
//! team borrows by it (`berth_sched::fair_share`), once the top-level team's was added up
//! with the tree's half-life. Teams of trees without the setting have none (a stale one is
//! cleared).
//!
//! A team's own use is that of the attempts of its workloads, and of the teams below it
//! that were deleted since (an attempt counts for the first team of its chain, as recorded,
//! that still exists); its subtree's is added up over the teams below it now. So deleting a
//! team that used much does not give its parent a clean slate, and moving one takes its
//! use along.

use std::collections::{BTreeMap, HashMap};

use berth_core::team::{FlavorRecentUsage, RecentUsage, Team};
use berth_core::{Error, TeamId};
use serde::Serialize;
use uuid::Uuid;

use crate::Context;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FairSharingStatus {
    /// Teams in trees that share fairly over time.
    pub teams: usize,
    /// Teams whose `status.recent_usage` this pass rewrote.
    pub updated: usize,
}

impl crate::runner::Report for FairSharingStatus {
    fn changes(&self) -> usize {
        self.updated
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<FairSharingStatus, Error> {
    let now = ctx.clock.now();
    let teams = berth_store::team::team_list_all(&ctx.db).await?;
    let index: HashMap<&str, usize> = teams.iter().enumerate().map(|(i, t)| (t.metadata.name.as_str(), i)).collect();
    let tops: Vec<usize> = (0..teams.len()).map(|t| chain(&teams, &index, t).last().unwrap_or(t)).collect();
    let half_life = |t: usize| teams[tops[t]].spec.fair_sharing.map(|f| f.usage_half_life_seconds);
    let mut by_half_life: BTreeMap<u32, Vec<Uuid>> = BTreeMap::new();
    for (t, team) in teams.iter().enumerate() {
        if let Some(h) = half_life(t) {
            by_half_life.entry(h).or_default().push(team.metadata.uid);
        }
    }
    let mut own: HashMap<Uuid, BTreeMap<String, f64>> = HashMap::new();
    for (h, uids) in &by_half_life {
        for (team, flavor, gpu_hours) in berth_store::ledger::ledger_decayed_use(&ctx.db, now, *h, uids).await? {
            own.entry(team).or_default().insert(flavor, gpu_hours);
        }
    }
    // Each team's own use, added to itself and every team above it now.
    let mut subtree: Vec<BTreeMap<&str, f64>> = vec![BTreeMap::new(); teams.len()];
    for (t, team) in teams.iter().enumerate() {
        for (flavor, h) in own.get(&team.metadata.uid).into_iter().flatten() {
            for a in chain(&teams, &index, t) {
                *subtree[a].entry(flavor.as_str()).or_default() += h;
            }
        }
    }
    let mut status = FairSharingStatus::default();
    let mut writes = Vec::new();
    for (t, team) in teams.iter().enumerate() {
        let next = half_life(t).map(|usage_half_life_seconds| {
            status.teams += 1;
            let mine = own.get(&team.metadata.uid);
            RecentUsage {
                usage_half_life_seconds,
                // Microseconds, as Postgres keeps the other times.
                updated_at: chrono::SubsecRound::trunc_subsecs(now, 6),
                flavors: (subtree[t].iter())
                    .map(|(&flavor, &subtree_gpu_hours)| FlavorRecentUsage {
                        flavor: flavor.to_owned(),
                        gpu_hours: mine.and_then(|m| m.get(flavor)).copied().unwrap_or_default(),
                        subtree_gpu_hours,
                    })
                    .collect(),
            }
        });
        if changed(team.status.recent_usage.as_ref(), next.as_ref()) {
            writes.push((TeamId(team.metadata.uid), next));
        }
    }
    if writes.is_empty() {
        return Ok(status);
    }
    let mut tx = ctx.begin().await?;
    berth_store::team::team_write_recent_usage(&mut tx, &writes).await?;
    berth_store::commit(tx).await?;
    status.updated = writes.len();
    Ok(status)
}

/// The team and the teams above it, nearest first (a parent not found ends the chain).
fn chain<'a>(teams: &'a [Team], index: &'a HashMap<&str, usize>, t: usize) -> impl Iterator<Item = usize> + 'a {
    std::iter::successors(Some(t), |&t| teams[t].spec.parent.as_deref().and_then(|p| index.get(p).copied()))
        .take(teams.len())
}

/// Whether `next` is worth a write: set or cleared, another half-life or set of flavors,
/// or a value moved by 1 % (and at least a thousandth of a GPU-hour). Running work moves
/// the numbers all the time: they are not written every pass (each write wakes the
/// controllers).
fn changed(before: Option<&RecentUsage>, next: Option<&RecentUsage>) -> bool {
    let moved = |a: f64, b: f64| (a - b).abs() >= (0.01 * b.abs()).max(1e-3);
    match (before, next) {
        (None, None) => false,
        (Some(a), Some(b)) => {
            a.usage_half_life_seconds != b.usage_half_life_seconds
                || a.flavors.len() != b.flavors.len()
                || a.flavors.iter().zip(&b.flavors).any(|(x, y)| {
                    x.flavor != y.flavor
                        || moved(x.gpu_hours, y.gpu_hours)
                        || moved(x.subtree_gpu_hours, y.subtree_gpu_hours)
                })
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(half_life: u32, flavor: &str, h: f64) -> RecentUsage {
        RecentUsage {
            usage_half_life_seconds: half_life,
            updated_at: chrono::DateTime::UNIX_EPOCH,
            flavors: vec![FlavorRecentUsage { flavor: flavor.into(), gpu_hours: h, subtree_gpu_hours: h }],
        }
    }

    #[test]
    fn recent_usage_is_rewritten_when_it_moved_by_1_percent_or_what_it_covers_changed() {
        let before = usage(3600, "h100", 100.0);
        let changed = |next: Option<RecentUsage>| changed(Some(&before), next.as_ref());
        assert!(!changed(Some(usage(3600, "h100", 100.5))), "moved under 1 %");
        assert!(changed(Some(usage(3600, "h100", 110.0))));
        assert!(changed(Some(usage(3600, "a100", 100.0))), "another flavor");
        assert!(changed(Some(usage(7200, "h100", 100.0))), "another half-life");
        assert!(changed(None), "cleared");
        assert!(super::changed(None, Some(&before)), "set");
        assert!(!super::changed(None, None));
    }
}
