//! Properties of hierarchical fair share over random team trees.

use berth_sched::fair_share::{EPSILON, FairShare, TeamInput, fair_shares};
use proptest::prelude::*;

const TOLERANCE: f64 = 1e-6;

fn forest() -> impl Strategy<Value = (Vec<TeamInput>, f64)> {
    (1usize..12).prop_flat_map(|n| {
        let team = (0u32..17, proptest::option::of(0u32..25), 0u32..5, 0u32..41, any::<u32>(), 0u32..500);
        // Recent use: none, every team's (the whole forest shares over time), or mixed.
        (proptest::collection::vec(team, n), 0u32..120, 0u8..3).prop_map(|(raw, capacity, over_time)| {
            let teams = raw
                .iter()
                .enumerate()
                .map(|(i, &(g, extra, w, d, p, used))| TeamInput {
                    // A parent is always an earlier team (or none), so there is no cycle.
                    parent: if i == 0 || p % 3 == 0 { None } else { Some(p as usize % i) },
                    guaranteed: f64::from(g),
                    limit: extra.map(|e| f64::from(g + e)),
                    weight: f64::from(w),
                    own_demand: f64::from(d),
                    recent: match over_time {
                        0 => None,
                        1 => Some(f64::from(used)),
                        _ => (used % 2 == 0).then_some(f64::from(used)),
                    },
                })
                .collect();
            (teams, f64::from(capacity))
        })
    })
}

fn children(teams: &[TeamInput], parent: Option<usize>) -> Vec<usize> {
    (0..teams.len()).filter(|&i| teams[i].parent == parent).collect()
}

/// Checks one level: `members` divide `share`, each with demand `demands`.
fn check_level(teams: &[TeamInput], shares: &[FairShare], members: &[usize], share: f64) {
    let given: f64 = members.iter().map(|&m| shares[m].subtree).sum();
    assert!(given <= share + TOLERANCE, "siblings get {given}, more than their parent's {share}");
    for &m in members {
        let s = shares[m];
        assert!(s.subtree >= -TOLERANCE, "negative share");
        assert!(s.subtree <= s.demand + TOLERANCE, "team {m} gets {} above its demand {}", s.subtree, s.demand);
        if let Some(limit) = teams[m].limit {
            assert!(s.subtree <= limit + TOLERANCE, "team {m} above its limit");
        }
    }
    let guaranteed_wanted: f64 = members.iter().map(|&m| teams[m].guaranteed.min(shares[m].demand)).sum();
    if guaranteed_wanted <= share + EPSILON {
        for &m in members {
            let floor = teams[m].guaranteed.min(shares[m].demand);
            assert!(
                shares[m].subtree + TOLERANCE >= floor,
                "team {m} gets {} below its guarantee {floor}",
                shares[m].subtree
            );
        }
        // Work-conserving: capacity is left only when nobody with weight wants more.
        let hungry = members.iter().any(|&m| teams[m].weight > 0.0 && shares[m].subtree + TOLERANCE < shares[m].demand);
        if hungry {
            assert!((given - share).abs() <= TOLERANCE, "{given} of {share} shared while a team still wants more");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fair_share_respects_demand_limits_guarantees_and_capacity((teams, capacity) in forest()) {
        let shares = fair_shares(&teams, capacity);
        check_level(&teams, &shares, &children(&teams, None), capacity);
        for i in 0..teams.len() {
            let kids = children(&teams, Some(i));
            if !kids.is_empty() {
                let given: f64 = kids.iter().map(|&k| shares[k].subtree).sum::<f64>() + shares[i].own;
                prop_assert!((given - shares[i].subtree).abs() <= TOLERANCE || given < shares[i].subtree,
                    "team {i}'s children and own part get {given} of {}", shares[i].subtree);
                prop_assert!(given <= shares[i].subtree + TOLERANCE);
                // Children get their guarantees whenever the parent's share covers them.
                let floors: Vec<f64> = kids.iter().map(|&k| teams[k].guaranteed.min(shares[k].demand)).collect();
                let kid_guarantees: f64 = kids.iter().map(|&k| teams[k].guaranteed).sum();
                let own = teams[i].limit.map_or(teams[i].own_demand, |l| teams[i].own_demand.min(l));
                let own_floor = (teams[i].guaranteed - kid_guarantees).max(0.0).min(own);
                if floors.iter().sum::<f64>() + own_floor <= shares[i].subtree + EPSILON {
                    for (&k, floor) in kids.iter().zip(floors) {
                        prop_assert!(shares[k].subtree + TOLERANCE >= floor, "child {k} below its guarantee");
                    }
                }
            }
        }
        // Whoever divides enough for all its claimants satisfies them all (weight 0 opts a
        // team out of idle capacity, so this holds when every weight is positive).
        if teams.iter().all(|t| t.weight > 0.0) {
            let roots = children(&teams, None);
            let root_demand: f64 = roots.iter().map(|&r| shares[r].demand).sum();
            let mut satisfied: Vec<usize> = if root_demand <= capacity { roots } else { Vec::new() };
            for i in 0..teams.len() {
                let kids = children(&teams, Some(i));
                let own = teams[i].limit.map_or(teams[i].own_demand, |l| teams[i].own_demand.min(l));
                let need: f64 = kids.iter().map(|&k| shares[k].demand).sum::<f64>() + own;
                if shares[i].subtree + TOLERANCE >= need {
                    satisfied.extend(kids);
                }
            }
            for i in satisfied {
                prop_assert!((shares[i].subtree - shares[i].demand).abs() <= TOLERANCE,
                    "team {i} gets {} of its {}", shares[i].subtree, shares[i].demand);
            }
        }
    }

    /// Using more lately never gets a top-level team more of what is idle, when every team
    /// shares over time.
    #[test]
    fn more_recent_use_never_raises_a_share((teams, capacity) in forest(), more in 1u32..1000) {
        let mut teams: Vec<TeamInput> = teams;
        for t in &mut teams {
            t.recent.get_or_insert(0.0);
        }
        let before = fair_shares(&teams, capacity)[0].subtree;
        teams[0].recent = teams[0].recent.map(|r| r + f64::from(more));
        let after = fair_shares(&teams, capacity)[0].subtree;
        prop_assert!(after <= before + TOLERANCE, "team 0's share rose from {before} to {after}");
    }

    #[test]
    fn fair_share_is_deterministic((teams, capacity) in forest()) {
        prop_assert_eq!(fair_shares(&teams, capacity), fair_shares(&teams, capacity));
    }
}
