//! Fairness over time: each team's recent GPU-hours, decayed by its tree's
//! `spec.fair_sharing.usage_half_life_seconds`, from the ledger and the work running now,
//! written to `status.recent_usage`. The scheduler reads it there and weighs what each
//! team borrows by it (`berth_sched::fair_share`). Teams of trees without the setting have
//! none (a stale one is cleared).

use std::collections::HashMap;

use berth_core::team::{RecentUsage, Team};
use berth_core::{Error, TeamId};
use chrono::{DateTime, Utc};
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
    let half_lives = half_lives(&teams);
    let mut status = FairSharingStatus { teams: half_lives.iter().flatten().count(), updated: 0 };
    let mut by_half_life: HashMap<u32, Vec<Uuid>> = HashMap::new();
    for (t, h) in teams.iter().zip(&half_lives) {
        if let Some(h) = h {
            by_half_life.entry(*h).or_default().push(t.metadata.uid);
        }
    }
    let mut used: HashMap<Uuid, Vec<RecentUsage>> = HashMap::new();
    for (half_life, uids) in by_half_life {
        for (team, flavor, own, subtree) in
            berth_store::ledger::ledger_decayed_use(&ctx.db, now, half_life, &uids).await?
        {
            used.entry(team).or_default().push(RecentUsage {
                flavor,
                gpu_hours: own,
                subtree_gpu_hours: subtree,
                updated_at: now,
            });
        }
    }
    let mut writes = Vec::new();
    for t in &teams {
        let mut next = used.remove(&t.metadata.uid).unwrap_or_default();
        next.sort_by(|a, b| a.flavor.cmp(&b.flavor));
        if changed(&t.status.recent_usage, &next, now) {
            writes.push((TeamId(t.metadata.uid), next));
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

/// Each team's tree's half-life (its top-level team's setting).
fn half_lives(teams: &[Team]) -> Vec<Option<u32>> {
    let by_name: HashMap<&str, &Team> = teams.iter().map(|t| (t.metadata.name.as_str(), t)).collect();
    teams
        .iter()
        .map(|t| {
            let top =
                std::iter::successors(Some(t), |t| t.spec.parent.as_deref().and_then(|p| by_name.get(p).copied()))
                    .take(teams.len())
                    .last()
                    .unwrap_or(t);
            top.spec.fair_sharing.map(|f| f.usage_half_life_seconds)
        })
        .collect()
}

/// Whether `next` is worth a write: another set of flavors, or a value moved by 1 % (and
/// at least a thousandth of a GPU-hour) with the status a minute old. Running work moves
/// the numbers all the time: they are not written every pass (each write wakes the
/// controllers).
fn changed(before: &[RecentUsage], next: &[RecentUsage], now: DateTime<Utc>) -> bool {
    let moved = |a: f64, b: f64| (a - b).abs() >= (0.01 * b.abs()).max(1e-3);
    before.len() != next.len()
        || before.iter().zip(next).any(|(a, b)| {
            a.flavor != b.flavor
                || ((moved(a.gpu_hours, b.gpu_hours) || moved(a.subtree_gpu_hours, b.subtree_gpu_hours))
                    && now - a.updated_at >= chrono::TimeDelta::minutes(1))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(flavor: &str, h: f64, at: DateTime<Utc>) -> RecentUsage {
        RecentUsage { flavor: flavor.into(), gpu_hours: h, subtree_gpu_hours: h, updated_at: at }
    }

    #[test]
    fn recent_usage_is_rewritten_when_it_moved_and_is_a_minute_old_or_its_flavors_changed() {
        let t0 = DateTime::<Utc>::UNIX_EPOCH;
        let later = t0 + chrono::TimeDelta::seconds(61);
        let before = [usage("h100", 100.0, t0)];
        assert!(!changed(&before, &[usage("h100", 100.5, later)], later), "moved under 1 %");
        let soon = t0 + chrono::TimeDelta::seconds(30);
        assert!(!changed(&before, &[usage("h100", 110.0, soon)], soon), "written under a minute ago");
        assert!(changed(&before, &[usage("h100", 110.0, later)], later));
        assert!(changed(&before, &[usage("a100", 100.0, t0)], t0), "another flavor");
        assert!(changed(&before, &[], t0), "cleared");
        assert!(!changed(&[], &[], later));
    }
}
