//! Hierarchical fair share of one flavor (DESIGN.md §3.1).
//!
//! At every level of the team tree, the share of the level's parent (at the top: the
//! flavor's capacity) is divided among the claimants below it:
//!
//! 1. each claimant first gets `min(guaranteed, demand)`;
//! 2. what is left is water-filled in proportion to `weight` among claimants still
//!    wanting more, never above their demand (which is already capped by `limit`).
//!
//! If the guarantees alone exceed what there is (capacity shrank below the sum of
//! guarantees), step 1 is scaled down in proportion to the guarantees and step 2 gives
//! nothing. A team's demand is its own workloads' demand plus its children's, capped by its
//! limit. A team that runs workloads itself and also has children divides its share
//! between each child and its *own* workloads; the own part is a claimant with the
//! guarantee the children leave over (`guaranteed − Σ children's guaranteed`) and weight 1.
//!
//! # Guarantees
//! Shares never exceed demand or limit; siblings' shares never add up to more than their
//! parent's; the division is work-conserving (capacity stays unshared only when every
//! claimant with positive weight has all it demands); the result depends only on the input.
//!
//! # Fairness over time
//! Where every claimant of a division that wants GPUs has a recent use (its tree sets
//! `spec.fair_sharing`), step 2 weighs each claimant by `weight × 2^(−U/S)` instead
//! (Slurm's fair-share factor): `U` is the claimant's part of the claimants' recent use,
//! `S` its part of their weights. A claimant that used nothing lately keeps its weight; one
//! that used its part of the weights keeps half; one that used everything is left
//! `2^(−1/S)`. Step 1 is untouched, so guarantees hold whatever was used. The factor never
//! falls below [`FACTOR_MIN`], so the division stays work-conserving.

/// Numbers closer than this are equal (shares are GPUs, possibly fractional).
pub const EPSILON: f64 = 1e-9;

/// The least a claimant's weight is multiplied by for its recent use (2^−30).
pub const FACTOR_MIN: f64 = 1.0 / 1_073_741_824.0;

/// One team, for one flavor.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamInput {
    /// Index of the parent in the input slice; `None` for a top-level team. Parents need not
    /// come before their children, but the relation must be a forest (no cycles).
    pub parent: Option<usize>,
    pub guaranteed: f64,
    /// Most the team may hold, borrowed capacity included; `None`: no limit.
    pub limit: Option<f64>,
    /// Share of idle capacity relative to siblings; 0 means none beyond the guarantee.
    pub weight: f64,
    /// GPUs the team's own workloads want (running and pending), children excluded.
    pub own_demand: f64,
    /// GPU-hours the team's own workloads used lately, decayed; `None` where its tree does
    /// not share fairly over time.
    pub recent: Option<f64>,
}

/// A team's fair share, for one flavor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FairShare {
    /// The team's demand, children included, capped by its limit.
    pub demand: f64,
    /// What the team's subtree should hold.
    pub subtree: f64,
    /// The part of `subtree` for the team's own workloads (the rest goes to its children).
    pub own: f64,
}

/// Computes every team's fair share of `capacity` GPUs of one flavor.
///
/// # Panics
/// When a parent index is out of range or the parents form a cycle.
pub fn fair_shares(teams: &[TeamInput], capacity: f64) -> Vec<FairShare> {
    let children = children_of(teams);
    let order = post_order(teams, &children);
    let mut shares = vec![FairShare::default(); teams.len()];
    // The subtree's recent use, where the team has one.
    let mut recent: Vec<Option<f64>> = vec![None; teams.len()];
    for &i in &order {
        let below: f64 = children[i].iter().map(|&c| shares[c].demand).sum();
        shares[i].demand = cap(teams[i].own_demand.max(0.0) + below, teams[i].limit);
        recent[i] =
            teams[i].recent.map(|own| own.max(0.0) + children[i].iter().filter_map(|&c| recent[c]).sum::<f64>());
    }
    let demand: Vec<f64> = shares.iter().map(|s| s.demand).collect();
    let claim_of = |i: usize| Claim {
        guaranteed: teams[i].guaranteed.max(0.0),
        weight: teams[i].weight.max(0.0),
        demand: demand[i],
        recent: recent[i],
    };
    let roots: Vec<usize> = (0..teams.len()).filter(|&i| teams[i].parent.is_none()).collect();
    let claims: Vec<Claim> = roots.iter().map(|&r| claim_of(r)).collect();
    for (&r, amount) in roots.iter().zip(divide(&claims, capacity.max(0.0))) {
        shares[r].subtree = amount;
    }
    // Parents before children: the reverse of post-order.
    for &i in order.iter().rev() {
        let kids = &children[i];
        let child_guarantees: f64 = kids.iter().map(|&c| teams[c].guaranteed.max(0.0)).sum();
        let mut claims: Vec<Claim> = kids.iter().map(|&c| claim_of(c)).collect();
        claims.push(Claim {
            guaranteed: (teams[i].guaranteed - child_guarantees).max(0.0),
            weight: 1.0,
            demand: cap(teams[i].own_demand.max(0.0), teams[i].limit),
            recent: teams[i].recent.map(|own| own.max(0.0)),
        });
        let amounts = divide(&claims, shares[i].subtree);
        for (&c, &amount) in kids.iter().zip(&amounts) {
            shares[c].subtree = amount;
        }
        shares[i].own = amounts[kids.len()];
    }
    shares
}

#[derive(Debug, Clone, Copy)]
struct Claim {
    guaranteed: f64,
    weight: f64,
    demand: f64,
    recent: Option<f64>,
}

fn cap(value: f64, limit: Option<f64>) -> f64 {
    limit.map_or(value, |l| value.min(l.max(0.0)))
}

/// Divides `total` among claims: guarantees first, then the rest by weight.
fn divide(claims: &[Claim], total: f64) -> Vec<f64> {
    let base: Vec<f64> = claims.iter().map(|c| c.guaranteed.min(c.demand)).collect();
    let base_sum: f64 = base.iter().sum();
    if base_sum >= total {
        let weights: Vec<f64> = claims.iter().map(|c| c.guaranteed).collect();
        return water_fill(total, &weights, &base);
    }
    let weights = weights_over_time(claims);
    let room: Vec<f64> = claims.iter().zip(&base).map(|(c, b)| c.demand - b).collect();
    let extra = water_fill(total - base_sum, &weights, &room);
    base.iter().zip(extra).map(|(b, e)| b + e).collect()
}

/// The weights idle capacity is divided by: each claim's, times `2^(−U/S)` when every claim
/// that wants GPUs has a recent use (see the module's doc; one that wants none gets
/// nothing here anyway, so a new empty top-level team does not turn it off for the
/// others). `U` and `S` are parts of what the claims that want GPUs or used some lately
/// add up to (a parent's own part that neither wants nor used any does not dilute its
/// children's).
fn weights_over_time(claims: &[Claim]) -> Vec<f64> {
    let plain: Vec<f64> = claims.iter().map(|c| c.weight).collect();
    if claims.iter().all(|c| c.recent.is_none()) || claims.iter().any(|c| c.recent.is_none() && c.demand > EPSILON) {
        return plain;
    }
    let recent: Vec<f64> = claims.iter().map(|c| c.recent.unwrap_or(0.0)).collect();
    let active = |(c, &r): (&Claim, &f64)| c.demand > EPSILON || r > EPSILON;
    let used: f64 = claims.iter().zip(&recent).filter(|x| active(*x)).map(|(_, r)| r).sum();
    let total_weight: f64 = claims.iter().zip(&recent).filter(|x| active(*x)).map(|(c, _)| c.weight).sum();
    if used <= EPSILON || total_weight <= EPSILON {
        return plain;
    }
    plain
        .iter()
        .zip(recent)
        .map(|(&w, r)| if w > 0.0 { w * 2f64.powf(-(r / used) / (w / total_weight)).max(FACTOR_MIN) } else { 0.0 })
        .collect()
}

/// Progressive filling: pours `amount` into slots in proportion to `weights`, each up to
/// its `caps`; a slot that fills up drops out and the rest keep rising together.
fn water_fill(mut amount: f64, weights: &[f64], caps: &[f64]) -> Vec<f64> {
    let mut filled = vec![0.0; caps.len()];
    let mut active: Vec<usize> = (0..caps.len()).filter(|&i| weights[i] > 0.0 && caps[i] > EPSILON).collect();
    while amount > EPSILON && !active.is_empty() {
        let total_weight: f64 = active.iter().map(|&i| weights[i]).sum();
        let level = amount / total_weight;
        let lowest = active.iter().map(|&i| (caps[i] - filled[i]) / weights[i]).fold(f64::INFINITY, f64::min);
        if level <= lowest {
            for &i in &active {
                filled[i] += weights[i] * level;
            }
            break;
        }
        for &i in &active {
            filled[i] += weights[i] * lowest;
        }
        amount -= total_weight * lowest;
        active.retain(|&i| caps[i] - filled[i] > EPSILON);
    }
    filled
}

fn children_of(teams: &[TeamInput]) -> Vec<Vec<usize>> {
    let mut children = vec![Vec::new(); teams.len()];
    for (i, t) in teams.iter().enumerate() {
        if let Some(p) = t.parent {
            assert!(p < teams.len(), "team {i} has parent {p}, out of range");
            children[p].push(i);
        }
    }
    children
}

/// Children before parents; panics on a cycle (a cycle has no root to start from, so its
/// members are never reached).
fn post_order(teams: &[TeamInput], children: &[Vec<usize>]) -> Vec<usize> {
    let mut order = Vec::with_capacity(teams.len());
    let mut stack: Vec<(usize, bool)> =
        (0..teams.len()).rev().filter(|&i| teams[i].parent.is_none()).map(|i| (i, false)).collect();
    while let Some((i, expanded)) = stack.pop() {
        if expanded {
            order.push(i);
        } else {
            stack.push((i, true));
            stack.extend(children[i].iter().rev().map(|&c| (c, false)));
        }
    }
    assert_eq!(order.len(), teams.len(), "the team parents form a cycle");
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team(parent: Option<usize>, guaranteed: f64, weight: f64, own_demand: f64) -> TeamInput {
        TeamInput { parent, guaranteed, limit: None, weight, own_demand, recent: None }
    }

    fn subtree(shares: &[FairShare]) -> Vec<f64> {
        shares.iter().map(|s| (s.subtree * 1e6).round() / 1e6).collect()
    }

    #[test]
    fn an_idle_owners_guarantee_is_lent_to_the_team_that_wants_it() {
        // Two teams guaranteed 8 and 8 on 16 GPUs; a is idle, b wants 16: b's fair share is
        // all 16 (8 guaranteed + 8 borrowed).
        let teams = [team(None, 8.0, 1.0, 0.0), team(None, 8.0, 1.0, 16.0)];
        assert_eq!(subtree(&fair_shares(&teams, 16.0)), [0.0, 16.0]);
        // When a wants its 8 back, the shares return to the guarantees.
        let teams = [team(None, 8.0, 1.0, 8.0), team(None, 8.0, 1.0, 16.0)];
        assert_eq!(subtree(&fair_shares(&teams, 16.0)), [8.0, 8.0]);
    }

    #[test]
    fn idle_capacity_is_divided_by_weight_up_to_demand_and_limit() {
        // 30 GPUs, no guarantees. Weights 1 and 2, both want 30: 10 and 20.
        let teams = [team(None, 0.0, 1.0, 30.0), team(None, 0.0, 2.0, 30.0)];
        assert_eq!(subtree(&fair_shares(&teams, 30.0)), [10.0, 20.0]);
        // The heavier team wants only 5: the lighter one gets the remaining 25.
        let teams = [team(None, 0.0, 1.0, 30.0), team(None, 0.0, 2.0, 5.0)];
        assert_eq!(subtree(&fair_shares(&teams, 30.0)), [25.0, 5.0]);
        // A limit of 12 on the lighter one leaves 13 unshared: nobody else wants it.
        let mut teams = teams;
        teams[0].limit = Some(12.0);
        assert_eq!(subtree(&fair_shares(&teams, 30.0)), [12.0, 5.0]);
    }

    #[test]
    fn guarantees_come_before_weights() {
        // 20 GPUs. a: guaranteed 12, weight 1, wants 20. b: guaranteed 0, weight 9, wants 20.
        // a gets 12 first; the 8 left go 1:9, so a = 12.8 and b = 7.2.
        let teams = [team(None, 12.0, 1.0, 20.0), team(None, 0.0, 9.0, 20.0)];
        assert_eq!(subtree(&fair_shares(&teams, 20.0)), [12.8, 7.2]);
    }

    #[test]
    fn children_divide_their_parents_share_the_same_way() {
        // Root departments r1 (guaranteed 16) and r2 (guaranteed 16) on 32 GPUs; r2 is idle.
        // r1's children c1 (guaranteed 8, weight 1) and c2 (guaranteed 8, weight 3) each want
        // 32: r1 gets all 32, c1 and c2 first get 8 each, the other 16 split 1:3 → 12 and 20.
        let teams = [
            team(None, 16.0, 1.0, 0.0),
            team(None, 16.0, 1.0, 0.0),
            team(Some(0), 8.0, 1.0, 32.0),
            team(Some(0), 8.0, 3.0, 32.0),
        ];
        let shares = fair_shares(&teams, 32.0);
        assert_eq!(subtree(&shares), [32.0, 0.0, 12.0, 20.0]);
        assert_eq!(shares[0].demand, 64.0);
        assert_eq!(shares[0].own, 0.0);
    }

    #[test]
    fn a_parents_own_workloads_share_with_its_children() {
        // p (guaranteed 10) runs work itself (wants 10) and has a child c (guaranteed 6,
        // wants 10); 20 GPUs, so p's subtree gets all 20. Inside p, c is guaranteed 6 and
        // p's own part the 4 left over; the other 10 split 1:1 would give c 11, above its
        // demand, so c gets 10 and p's own part the remaining 10.
        let teams = [team(None, 10.0, 1.0, 10.0), team(Some(0), 6.0, 1.0, 10.0)];
        let shares = fair_shares(&teams, 20.0);
        assert_eq!(subtree(&shares), [20.0, 10.0]);
        assert!((shares[0].own - 10.0).abs() < 1e-9);
    }

    #[test]
    fn oversubscribed_guarantees_shrink_in_proportion() {
        // Capacity fell to 12 while guarantees are 8 and 16, all wanted: 4 and 8.
        let teams = [team(None, 8.0, 1.0, 8.0), team(None, 16.0, 1.0, 16.0)];
        assert_eq!(subtree(&fair_shares(&teams, 12.0)), [4.0, 8.0]);
    }

    #[test]
    fn recent_use_weighs_down_what_a_team_borrows_never_its_guarantee() {
        // 40 GPUs, a and b guaranteed 10 each, weight 1, both want 40. a used 300 GPU-hours
        // lately, b 100: U = 0.75 and 0.25, S = 0.5, so the 20 idle GPUs split
        // 2^−1.5 : 2^−0.5 = 1 : 2 → a = 10 + 6.67, b = 10 + 13.33.
        let mut teams = [team(None, 10.0, 1.0, 40.0), team(None, 10.0, 1.0, 40.0)];
        teams[0].recent = Some(300.0);
        teams[1].recent = Some(100.0);
        assert_eq!(subtree(&fair_shares(&teams, 40.0)), [16.666667, 23.333333]);
        // Only 20 GPUs: the guarantees, whatever was used.
        assert_eq!(subtree(&fair_shares(&teams, 20.0)), [10.0, 10.0]);
        // Equal use relative to weight changes nothing: weights 1 and 3 used 100 and 300.
        teams[1].weight = 3.0;
        teams[1].recent = Some(300.0);
        teams[0].recent = Some(100.0);
        assert_eq!(subtree(&fair_shares(&teams, 40.0)), [15.0, 25.0]);
        // A sibling that does not share over time and wants GPUs turns the factor off for
        // the division; one that wants none does not.
        let mut teams = [teams[0].clone(), teams[1].clone(), team(None, 0.0, 1.0, 0.0)];
        teams[1].weight = 1.0;
        teams[0].recent = Some(300.0);
        teams[1].recent = Some(100.0);
        assert_eq!(subtree(&fair_shares(&teams, 40.0)), [16.666667, 23.333333, 0.0]);
        teams[1].recent = None;
        assert_eq!(subtree(&fair_shares(&teams, 40.0)), [20.0, 20.0, 0.0]);
    }

    #[test]
    fn inside_a_tree_children_are_weighed_by_their_subtrees_recent_use() {
        // Root r (one tree, 30 GPUs) has children c1 and c2 (no guarantees, both want 30);
        // c1's own child g used 200 GPU-hours and c1 itself nothing, c2 used 0: c1's
        // subtree counts g's use, so c1 is left 2^−2 of its weight: 30 split 1:4.
        let mut teams = [
            team(None, 0.0, 1.0, 0.0),
            team(Some(0), 0.0, 1.0, 0.0),
            team(Some(0), 0.0, 1.0, 30.0),
            team(Some(1), 0.0, 1.0, 30.0),
        ];
        for (t, used) in teams.iter_mut().zip([0.0, 0.0, 0.0, 200.0]) {
            t.recent = Some(used);
        }
        assert_eq!(subtree(&fair_shares(&teams, 30.0)), [30.0, 6.0, 24.0, 6.0]);
        // The one that used everything still gets what nobody else wants.
        teams[2].own_demand = 10.0;
        assert_eq!(subtree(&fair_shares(&teams, 30.0)), [30.0, 20.0, 10.0, 20.0]);
    }

    #[test]
    #[should_panic(expected = "cycle")]
    fn a_cycle_is_refused() {
        fair_shares(&[team(Some(1), 0.0, 1.0, 0.0), team(Some(0), 0.0, 1.0, 0.0)], 8.0);
    }
}
