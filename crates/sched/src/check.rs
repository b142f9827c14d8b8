//! The invariants every plan must hold. Property tests and the trace replay run
//! [`violations`] on every plan they get; an empty list means the plan is sound.

use std::collections::{BTreeMap, BTreeSet};

use berth_core::workload::TopologyPolicy;

use crate::cycle::{Pool, ancestors, cheapest_first, gpus, own_shares, pools};
use crate::nodes::{NodeState, node_states, place};
use crate::plan::{Miss, Plan, PreemptionCause, Reason, Waiting};
use crate::snapshot::{BudgetStop, FlavorIx, NodeIx, ONE_GPU, OwnQuota, PendingIx, RunningIx, Snapshot};

/// Everything wrong with `plan` as the plan for `s`, one line each.
///
/// # Panics
/// When `s` is not a valid snapshot.
pub fn violations(s: &Snapshot, plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    let flavors = s.flavors.len();
    let mut states = node_states(s).expect("a valid snapshot");

    // Every pending workload is admitted or waits, once; positions count from 1.
    let mut seen = vec![0u32; s.pending.len()];
    plan.admissions.iter().for_each(|a| seen[a.workload] += 1);
    plan.waiting.iter().for_each(|w| seen[w.workload] += 1);
    for (w, &n) in seen.iter().enumerate().filter(|&(_, &n)| n != 1) {
        out.push(format!("pending {w} appears {n} times in the plan (admitted + waiting)"));
    }
    let mut team_next = vec![1; s.teams.len()];
    for (i, w) in plan.waiting.iter().enumerate() {
        let t = s.pending[w.workload].team;
        if w.position != i as u32 + 1 || w.team_position != team_next[t] {
            out.push(format!("pending {} has position {}/{} in team", w.workload, w.position, w.team_position));
        }
        team_next[t] += 1;
    }

    // Preemptions: preemptible victims, once each, for a workload that waits for them.
    let preempted: BTreeSet<RunningIx> = plan.preemptions.iter().map(|p| p.victim).collect();
    if preempted.len() != plan.preemptions.len() {
        out.push("a workload is preempted twice".into());
    }
    let counted_on: BTreeMap<RunningIx, PendingIx> = plan
        .waiting
        .iter()
        .filter_map(|w| match &w.reason {
            Reason::WaitingForReclaim { victims, .. } => Some(victims.iter().map(move |&v| (v, w.workload))),
            _ => None,
        })
        .flatten()
        .collect();
    for p in &plan.preemptions {
        let v = &s.running[p.victim];
        let w = p.cause.workload();
        if v.preempting || !v.preemptible {
            out.push(format!("running {} is preempted but is stopping already or not preemptible", p.victim));
        }
        if s.now < v.protected_until {
            out.push(format!("running {} is preempted within its min runtime", p.victim));
        }
        if counted_on.get(&p.victim) != Some(&w) {
            out.push(format!("running {} is preempted for pending {w}, which does not wait for it", p.victim));
        }
        let team = s.pending[w].team;
        let fitting = match p.cause {
            PreemptionCause::Reclaim { team: by, .. } => by == team && v.team != team && v.borrowed,
            PreemptionCause::Priority { .. } => v.team == team && v.priority < s.pending[w].priority,
        };
        if !fitting {
            out.push(format!("running {} is preempted with a cause that does not hold: {:?}", p.victim, p.cause));
        }
    }
    let gone = |v: RunningIx| s.running[v].preempting || preempted.contains(&v);

    // Admissions: allowed cluster and flavor, within budgets, whole gangs on fitting nodes.
    let chains = crate::cycle::ancestors(s);
    for a in &plan.admissions {
        let p = &s.pending[a.workload];
        if let Some(b) = budget_stop(s, &chains[p.team], a.flavor, !a.borrowed) {
            out.push(format!("pending {} admitted though budget {:?} stops it", a.workload, b.budget));
        }
        let cluster = &s.clusters[a.cluster];
        if !p.flavors.contains(&a.flavor) || !p.may_run_on(cluster) || cluster.cordoned {
            out.push(format!("pending {} admitted to a cluster or flavor it may not use", a.workload));
        }
        if !p.preemptible && a.borrowed {
            out.push(format!("non-preemptible pending {} admitted on borrowed quota", a.workload));
        }
        if a.placement.len() != p.tasks.count as usize {
            out.push(format!("pending {} admitted with {} of {} tasks", a.workload, a.placement.len(), p.tasks.count));
        }
        let blocks: BTreeSet<Option<&str>> = a.placement.iter().map(|t| s.nodes[t.node].block.as_deref()).collect();
        let nodes: BTreeSet<NodeIx> = a.placement.iter().map(|t| t.node).collect();
        if p.topology == TopologyPolicy::Required && nodes.len() > 1 && (blocks.len() > 1 || blocks.contains(&None)) {
            out.push(format!("pending {} spans topology blocks though it requires one", a.workload));
        }
        for t in &a.placement {
            let node = &s.nodes[t.node];
            if node.cluster != a.cluster || node.flavor != a.flavor || node.cordoned {
                out.push(format!("pending {} has a task on node {} it may not use", a.workload, t.node));
                continue;
            }
            let state = &mut states[t.node];
            let fits = match t.device {
                Some(d) => p.tasks.is_fractional() && state.take_at(&p.tasks, d).is_ok(),
                None => {
                    !p.tasks.is_fractional() && state.fit_cost(&p.tasks).is_some() && state.take(&p.tasks).is_none()
                }
            };
            if !fits {
                out.push(format!("node {} is over-committed by pending {}", t.node, a.workload));
            }
        }
    }

    // Quota, twice: as things run right after the plan (everything running, stopping or
    // preempted still holds its GPUs, plus what is admitted), and once what is told to
    // stop is gone (what keeps running, plus admitted work and work waiting for victims).
    let ancestors = ancestors(s);
    let zeros = vec![0u64; s.teams.len() * flavors];
    let (mut subtree, mut kept_running, mut in_quota_own) = (zeros.clone(), zeros.clone(), zeros.clone());
    let (mut holding, mut in_quota_admitted) = (zeros.clone(), zeros);
    let mut admitted_into = vec![false; s.teams.len() * flavors];
    let mut admitted_now = admitted_into.clone();
    for (v, r) in s.running.iter().enumerate() {
        let amount = u64::from(r.tasks.total_gpus());
        if !gone(v) {
            kept_running[r.team * flavors + r.flavor] += amount;
        }
        for &a in &ancestors[r.team] {
            holding[a * flavors + r.flavor] += amount;
            if !gone(v) {
                subtree[a * flavors + r.flavor] += amount;
            }
        }
    }
    let kept_subtree = subtree.clone();
    let running_subtree = holding.clone();
    let own_quota = OwnQuota::of(s);
    for a in &plan.admissions {
        let p = &s.pending[a.workload];
        let amount = u64::from(p.tasks.total_gpus());
        if !a.borrowed {
            in_quota_admitted[p.team * flavors + a.flavor] += amount;
        }
        for &t in &ancestors[p.team] {
            holding[t * flavors + a.flavor] += amount;
            admitted_now[t * flavors + a.flavor] = true;
        }
    }
    // Admitted work, and work waiting for reclaim (it counts on its GPUs): (pending,
    // flavor, in-quota).
    let admitted = plan.admissions.iter().map(|a| (a.workload, a.flavor, !a.borrowed));
    let reclaiming = plan.waiting.iter().filter_map(|w| match w.reason {
        Reason::WaitingForReclaim { flavor, .. } => Some((w.workload, flavor, true)),
        _ => None,
    });
    for (w, f, in_quota) in admitted.chain(reclaiming) {
        let p = &s.pending[w];
        let amount = u64::from(p.tasks.total_gpus());
        if in_quota {
            in_quota_own[p.team * flavors + f] += amount;
        }
        for &a in &ancestors[p.team] {
            subtree[a * flavors + f] += amount;
            admitted_into[a * flavors + f] = true;
        }
    }
    for (t, team) in s.teams.iter().enumerate() {
        for f in 0..flavors {
            let i = t * flavors + f;
            if let Some(limit) = team.quotas[f].limit
                && admitted_into[i]
                && subtree[i] > u64::from(limit * ONE_GPU)
            {
                out.push(format!("team {t} holds {} GPUs of flavor {f}, above its limit {limit}", gpus(subtree[i])));
            }
            if let Some(limit) = team.quotas[f].limit
                && admitted_now[i]
                && holding[i] > u64::from(limit * ONE_GPU)
            {
                out.push(format!(
                    "team {t} runs {} GPUs of flavor {f} while preempted work stops, above its limit {limit}",
                    gpus(holding[i])
                ));
            }
            // In-quota is judged against the team's own guarantee, by its own work.
            let guaranteed = own_quota.guaranteed(t, f);
            let running_own = own_quota.own(|i| running_subtree[i], t, f);
            if in_quota_admitted[i] > 0 && running_own + in_quota_admitted[i] > guaranteed {
                out.push(format!(
                    "team {t} runs {} GPUs of flavor {f} in-quota while preempted work stops, above its own guarantee {}",
                    gpus(running_own + in_quota_admitted[i]),
                    gpus(guaranteed)
                ));
            }
            let kept_own = own_quota.own(|i| kept_subtree[i], t, f);
            if in_quota_own[i] > 0 && kept_own + in_quota_own[i] > guaranteed {
                out.push(format!(
                    "team {t} runs {} GPUs of flavor {f} in-quota (with what keeps running), above its own guarantee {}",
                    gpus(kept_own + in_quota_own[i]),
                    gpus(guaranteed)
                ));
            }
        }
    }

    let known = Known::of(s, plan, ancestors, own_quota, &states, &kept_subtree);
    out.extend(hold_violations(s, plan, &known, &states, &gone));
    // The scheduler's view of quota: what holds GPUs now, plus what waits for victims.
    for w in &plan.waiting {
        if let Reason::WaitingForReclaim { flavor, .. } = w.reason {
            let p = &s.pending[w.workload];
            for &a in &known.ancestors[p.team] {
                holding[a * flavors + flavor] += u64::from(p.tasks.total_gpus());
            }
        }
    }
    out.extend(reclaim_violations(s, plan, &known, &states, &holding, &kept_running, &gone, &counted_on));
    out.extend(idle_violations(s, plan, &known, &states, &holding));
    out.extend(reason_violations(s, plan, &known));
    out
}

/// What the checks of waiting workloads below read, worked out once per plan.
struct Known {
    ancestors: Vec<Vec<usize>>,
    /// Per pending workload, as [`crate::feasible::impossible`].
    impossible: Vec<Vec<crate::feasible::Impossible>>,
    /// Every team's own fair share, per `team * flavors + flavor`.
    share: Vec<f64>,
    pools: Vec<Pool>,
    pool_at: Vec<Option<usize>>,
    /// The workloads each held node is held for (several only while they wait for
    /// victims).
    held: BTreeMap<NodeIx, Vec<PendingIx>>,
    /// Held nodes whose every holder waits for victims.
    held_for_reclaims: BTreeSet<NodeIx>,
    /// Workloads that may pause their team's borrowing, with the flavor: waiting for
    /// reclaim, or starving with nodes held and either only allowed to run in-quota or
    /// holding quota within the guarantee. (In-quota is judged against what keeps running,
    /// the least the team used when the hold was made, so a hold the scheduler made within
    /// the guarantee is always among them.)
    pausing: BTreeMap<PendingIx, FlavorIx>,
    /// Each team's own guarantee: in-quota is judged against it.
    own_quota: OwnQuota,
}

impl Known {
    fn of(
        s: &Snapshot,
        plan: &Plan,
        ancestors: Vec<Vec<usize>>,
        own_quota: OwnQuota,
        states: &[NodeState],
        kept_subtree: &[u64],
    ) -> Self {
        let impossible = crate::feasible::impossible(s, &ancestors);
        let (share, _) = own_shares(s, &impossible);
        let (mut pools, pool_at) = pools(s, states);
        for pool in &mut pools {
            cheapest_first(s, &mut pool.running);
        }
        let mut held: BTreeMap<NodeIx, Vec<PendingIx>> = BTreeMap::new();
        for w in &plan.waiting {
            for &n in &w.reserved_nodes {
                held.entry(n).or_default().push(w.workload);
            }
        }
        let reclaiming: BTreeSet<PendingIx> = (plan.waiting.iter())
            .filter(|w| matches!(w.reason, Reason::WaitingForReclaim { .. }))
            .map(|w| w.workload)
            .collect();
        let held_for_reclaims =
            held.iter().filter(|(_, h)| h.iter().all(|w| reclaiming.contains(w))).map(|(&n, _)| n).collect();
        let pausing = plan
            .waiting
            .iter()
            .filter_map(|w| match w.reason {
                Reason::WaitingForReclaim { flavor, .. } => Some((w.workload, flavor)),
                _ => {
                    let p = &s.pending[w.workload];
                    reservation(s, w)
                        .filter(|&(f, amount)| {
                            !p.preemptible
                                || own_quota.own(|i| kept_subtree[i], p.team, f) + amount
                                    <= own_quota.guaranteed(p.team, f)
                        })
                        .map(|(f, _)| (w.workload, f))
                }
            })
            .collect();
        Self { ancestors, impossible, share, pools, pool_at, held, held_for_reclaims, pausing, own_quota }
    }

    /// Per `team * flavors + flavor`: a workload of the team pauses its borrowing.
    fn paused(&self, s: &Snapshot) -> Vec<bool> {
        let mut paused = vec![false; s.teams.len() * s.flavors.len()];
        for (&w, &f) in &self.pausing {
            paused[s.pending[w].team * s.flavors.len() + f] = true;
        }
        paused
    }

    /// Whether waiting `w` fits, given `states`, on the nodes of `pool` that are not held
    /// for another workload (within one topology block when it requires one); with
    /// `reclaiming`, also on nodes held for other workloads' reclaims (what `states` says
    /// is free there is what `w`'s own victims would free).
    fn fits_on_open_nodes(
        &self,
        s: &Snapshot,
        states: &[NodeState],
        pool: &Pool,
        w: PendingIx,
        reclaiming: bool,
    ) -> bool {
        let p = &s.pending[w];
        let open: Vec<NodeIx> = (pool.nodes.iter().copied())
            .filter(|n| {
                self.held.get(n).is_none_or(|h| h.iter().all(|&h| h == w))
                    || (reclaiming && self.held_for_reclaims.contains(n) && !self.held[n].contains(&w))
            })
            .collect();
        let node_sets: Vec<Vec<NodeIx>> = if p.topology == TopologyPolicy::Required {
            pool.groups.iter().map(|g| g.iter().copied().filter(|n| open.contains(n)).collect()).collect()
        } else {
            vec![open]
        };
        node_sets.iter().any(|nodes| place(&mut states.to_vec(), nodes, &p.tasks, None).is_some())
    }
}

/// A node is held for several workloads only while each waits for victims, and the work
/// waiting for victims on a cluster and flavor fits in what is free there (after this
/// plan's admissions) once the work told to stop is gone: no two count on the same GPUs.
fn hold_violations(
    s: &Snapshot,
    plan: &Plan,
    known: &Known,
    states: &[NodeState],
    gone: &dyn Fn(RunningIx) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let reason = |w: PendingIx| &plan.waiting.iter().find(|x| x.workload == w).expect("holders wait").reason;
    for (n, holders) in known.held.iter().filter(|(_, h)| h.len() > 1) {
        if !holders.iter().all(|&w| matches!(reason(w), Reason::WaitingForReclaim { .. })) {
            out.push(format!("node {n} is held for {holders:?}, not all of which wait for victims"));
        }
    }
    let mut counted_on: BTreeMap<(usize, FlavorIx), u64> = BTreeMap::new();
    for w in &plan.waiting {
        if let Reason::WaitingForReclaim { cluster, flavor, .. } = w.reason {
            *counted_on.entry((cluster, flavor)).or_default() += u64::from(s.pending[w.workload].tasks.total_gpus());
        }
    }
    for ((c, f), needed) in counted_on {
        let free: u64 = (s.nodes.iter().enumerate())
            .filter(|(_, node)| node.cluster == c && node.flavor == f)
            .map(|(n, _)| u64::from(states[n].free_gpus()))
            .sum();
        let freed: u64 = (s.running.iter().enumerate())
            .filter(|&(v, r)| r.cluster == c && r.flavor == f && gone(v))
            .map(|(_, r)| u64::from(r.tasks.total_gpus()))
            .sum();
        if needed > free + freed {
            out.push(format!(
                "work waiting for victims counts on {} GPUs of flavor {f} on cluster {c}, but only {} will be free",
                gpus(needed),
                gpus(free + freed)
            ));
        }
    }
    out
}

/// The quota a starving workload's reservation holds along with its nodes: (flavor,
/// hundredths), in its nodes' flavor.
fn reservation(s: &Snapshot, w: &Waiting) -> Option<(FlavorIx, u64)> {
    let node = w.reserved_nodes.first()?;
    (!matches!(w.reason, Reason::WaitingForReclaim { .. }))
        .then(|| (s.nodes[*node].flavor, u64::from(s.pending[w.workload].tasks.total_gpus())))
}

/// No GPU idles while a waiting workload could run on it as things stand: within every
/// limit, in-quota or (preemptible) borrowed, past its team's fair share too (what is
/// left is lent), on open nodes of a cluster it may use.
fn idle_violations(s: &Snapshot, plan: &Plan, known: &Known, states: &[NodeState], holding: &[u64]) -> Vec<String> {
    let flavors = s.flavors.len();
    let Known { ancestors, impossible, pools, pool_at, .. } = known;
    // Usage as the scheduler counts it, per subtree: what holds GPUs now (stopping work
    // too), what is admitted, what waits for reclaim, and reservations.
    let mut subtree = holding.to_vec();
    let paused = known.paused(s);
    for w in &plan.waiting {
        let p = &s.pending[w.workload];
        if let Some((f, amount)) = reservation(s, w) {
            for &a in &ancestors[p.team] {
                subtree[a * flavors + f] += amount;
            }
        }
    }
    let mut out = Vec::new();
    for waiting in &plan.waiting {
        let w = waiting.workload;
        let p = &s.pending[w];
        let requested = u64::from(p.tasks.total_gpus());
        let mine = reservation(s, waiting);
        for &f in p.flavors.iter().filter(|&&f| !impossible[w].iter().any(|i| i.flavor() == f)) {
            // Its own reservation's quota is its own to use.
            let back = if mine.is_some_and(|(rf, _)| rf == f) { requested } else { 0 };
            let used = |a: usize| subtree[a * flavors + f] - back;
            let within_limits = ancestors[p.team]
                .iter()
                .all(|&a| s.teams[a].quotas[f].limit.is_none_or(|l| used(a) + requested <= u64::from(l * ONE_GPU)));
            // (Its own reservation's quota is in its team's own part.)
            let own =
                known.own_quota.own(|i| if i == p.team * flavors + f { used(p.team) } else { subtree[i] }, p.team, f);
            let in_quota = own + requested <= known.own_quota.guaranteed(p.team, f);
            // A workload waiting for reclaim or starving with quota held in its team or
            // above keeps it from borrowing, and from taking a team above past its guarantee.
            let over_held = |a: usize| {
                a != p.team
                    && paused[a * flavors + f]
                    && used(a) + requested > s.teams[a].quotas[f].guaranteed_hundredths()
            };
            let in_quota = in_quota && !ancestors[p.team].iter().any(|&a| over_held(a));
            let may_borrow = p.preemptible && !ancestors[p.team].iter().any(|&a| paused[a * flavors + f]);
            if matches!(waiting.reason, Reason::WaitingForReclaim { .. } | Reason::WaitingForPreemptor { .. })
                || budget_stop(s, &ancestors[p.team], f, in_quota).is_some()
                || !within_limits
                || !(in_quota || may_borrow)
            {
                continue;
            }
            for (c, cluster) in s.clusters.iter().enumerate().filter(|(_, c)| p.may_run_on(c) && !c.cordoned) {
                let Some(pool) = pool_at[c * flavors + f].map(|i| &pools[i]) else { continue };
                if known.fits_on_open_nodes(s, states, pool, w, false) {
                    out.push(format!(
                        "pending {w} waits ({}) though it could run now on cluster {} in flavor {f}",
                        waiting.reason.code(),
                        cluster.name
                    ));
                }
            }
        }
    }
    out
}

/// Every waiting workload's reason holds in the snapshot: the numbers it names are the
/// snapshot's, and what it says binds does.
fn reason_violations(s: &Snapshot, plan: &Plan, known: &Known) -> Vec<String> {
    let flavors = s.flavors.len();
    let Known { ancestors, impossible, share, pausing, .. } = known;
    let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
    let admitted: BTreeSet<PendingIx> = plan.admissions.iter().map(|a| a.workload).collect();
    let mut out = Vec::new();
    for waiting in &plan.waiting {
        let w = waiting.workload;
        let p = &s.pending[w];
        let requested = gpus(u64::from(p.tasks.total_gpus()));
        let possible: Vec<FlavorIx> =
            p.flavors.iter().copied().filter(|&f| !impossible[w].iter().any(|i| i.flavor() == f)).collect();
        let allowed = |f: FlavorIx| {
            s.clusters.iter().enumerate().filter(move |(c, cl)| p.may_run_on(cl) && pool_has_nodes(s, *c, f))
        };
        let sound = match &waiting.reason {
            Reason::QuotaLimitReached { team, flavor, used, limit, requested: r } => {
                ancestors[p.team].contains(team)
                    && possible.contains(flavor)
                    && s.teams[*team].quotas[*flavor].limit.is_some_and(|l| near(f64::from(l), *limit))
                    && near(*r, requested)
                    && used + r > limit + 1e-9
            }
            Reason::BudgetExhausted { team, flavor, budget, stop_new, resets_at } => {
                ancestors[p.team].contains(team)
                    && possible.contains(flavor)
                    && s.teams[*team].budget_stops.iter().any(|b| {
                        &b.budget == budget
                            && b.stop_new == *stop_new
                            && b.resets_at == *resets_at
                            && b.resets_at > s.now
                            && b.flavor.is_none_or(|bf| bf == *flavor)
                    })
            }
            Reason::GuaranteeExceeded { team, flavor, used, guaranteed, requested: r } => {
                *team == p.team
                    && !p.preemptible
                    && possible.contains(flavor)
                    && near(gpus(known.own_quota.guaranteed(*team, *flavor)), *guaranteed)
                    && near(*r, requested)
                    && used + r > guaranteed + 1e-9
            }
            Reason::FairShareReached { team, flavor, used, fair_share, requested: r } => {
                *team == p.team
                    && p.preemptible
                    && possible.contains(flavor)
                    && near(share[team * flavors + flavor], *fair_share)
                    && near(*r, requested)
                    && used + r > fair_share + 1e-9
            }
            Reason::BorrowingPaused { flavor, workload } => {
                // (Work that may not borrow waits only for a workload of a team above.)
                (p.preemptible || s.pending[*workload].team != p.team)
                    && pausing.get(workload) == Some(flavor)
                    && ancestors[p.team].contains(&s.pending[*workload].team)
            }
            Reason::NoClusterFits { attempts } => attempts.iter().all(|a| {
                possible.contains(&a.flavor)
                    && a.clusters.iter().all(|m| {
                        let cluster = &s.clusters[m.cluster];
                        p.may_run_on(cluster)
                            && pool_has_nodes(s, m.cluster, a.flavor)
                            && match m.miss {
                                Miss::Cordoned => cluster.cordoned,
                                Miss::NotEnoughGpus { free, needed } => near(needed, requested) && free < needed,
                                Miss::Topology => p.topology == TopologyPolicy::Required,
                                _ => !cluster.cordoned,
                            }
                    })
            }),
            Reason::TopologyUnsatisfiable { flavor } => {
                p.topology == TopologyPolicy::Required && possible.contains(flavor)
            }
            Reason::ClustersCordoned => {
                possible.iter().all(|&f| allowed(f).all(|(_, c)| c.cordoned))
                    && possible.iter().any(|&f| allowed(f).next().is_some())
            }
            Reason::PlacementMatchesNoCluster => possible.iter().all(|&f| allowed(f).next().is_none()),
            Reason::Unschedulable { why } => possible.is_empty() && why == &impossible[w],
            Reason::WaitingForPreemptor { workload } => {
                p.preempted_for == Some(*workload) && !admitted.contains(workload)
            }
            Reason::WaitingForReclaim { cluster, flavor, victims } => {
                possible.contains(flavor)
                    && !victims.is_empty()
                    && victims.iter().all(|&v| s.running[v].cluster == *cluster && s.running[v].flavor == *flavor)
            }
            Reason::WaitingForMinRuntime { cluster, flavor, victims, until } => {
                let r = |v: usize| &s.running[v];
                possible.contains(flavor)
                    && victims.iter().map(|&v| r(v).protected_until).max() == Some(*until)
                    && victims.iter().all(|&v| {
                        r(v).cluster == *cluster
                            && r(v).flavor == *flavor
                            && !r(v).preempting
                            && s.now < r(v).protected_until
                    })
            }
        };
        if !sound {
            out.push(format!("pending {w} waits with a reason the snapshot does not bear out: {:?}", waiting.reason));
        }
    }
    out
}

/// Whether cluster `c` has nodes of flavor `f`.
/// The used-up budget of `chain` (a team and its ancestors) that stops work of `f`
/// (borrowing, unless `in_quota`), if any.
fn budget_stop<'s>(s: &'s Snapshot, chain: &[usize], f: FlavorIx, in_quota: bool) -> Option<&'s BudgetStop> {
    chain
        .iter()
        .flat_map(|&a| &s.teams[a].budget_stops)
        .find(|b| b.resets_at > s.now && b.flavor.is_none_or(|bf| bf == f) && (b.stop_new || !in_quota))
}

fn pool_has_nodes(s: &Snapshot, c: usize, f: FlavorIx) -> bool {
    s.nodes.iter().any(|n| n.cluster == c && n.flavor == f)
}

/// No in-quota workload waits while preempting borrowed work of teams above their fair
/// share (or counting on work already stopping) would let it fit.
#[allow(clippy::too_many_arguments)]
fn reclaim_violations(
    s: &Snapshot,
    plan: &Plan,
    known: &Known,
    states: &[NodeState],
    subtree: &[u64],
    kept_running: &[u64],
    gone: &dyn Fn(RunningIx) -> bool,
    counted_on: &BTreeMap<RunningIx, PendingIx>,
) -> Vec<String> {
    let flavors = s.flavors.len();
    let Known { ancestors, share, pools, pool_at, .. } = known;
    // A starving workload's reservation holds its quota too: that quota is not free for
    // anyone else.
    let reservation = |w: &Waiting| reservation(s, w);
    let mut subtree = subtree.to_vec();
    for w in &plan.waiting {
        if let Some((f, amount)) = reservation(w) {
            for &a in &ancestors[s.pending[w.workload].team] {
                subtree[a * flavors + f] += amount;
            }
        }
    }
    let paused = known.paused(s);
    // What work waiting for victims ahead in the queue counts on, per subtree: it is
    // counted again where that work will run. (Work behind it reclaimed after its visit.)
    let mut counted = vec![0u64; s.teams.len() * flavors];
    let mut out = Vec::new();
    for waiting in &plan.waiting {
        // (One waiting for its preemptor waits by rule, whatever room there is.)
        match &waiting.reason {
            Reason::WaitingForReclaim { victims, .. } => {
                for r in victims.iter().map(|&v| &s.running[v]) {
                    for &a in &ancestors[r.team] {
                        counted[a * flavors + r.flavor] += u64::from(r.tasks.total_gpus());
                    }
                }
                continue;
            }
            Reason::WaitingForPreemptor { .. } => continue,
            _ => {}
        }
        let w = waiting.workload;
        let p = &s.pending[w];
        let requested = u64::from(p.tasks.total_gpus());
        let mut subtree = subtree.clone();
        if let Some((f, amount)) = reservation(waiting) {
            for &a in &ancestors[p.team] {
                subtree[a * flavors + f] -= amount;
            }
        }
        // What it could reclaim, each cluster; nothing, where somewhere it fits without
        // releasing anything (below): the scheduler looks for victims in every cluster and
        // preempts none if one cluster needs none.
        let mut could_reclaim = Vec::new();
        let mut fits_without_victims = false;
        for &f in &p.flavors {
            for (c, cluster) in s.clusters.iter().enumerate().filter(|(_, c)| p.may_run_on(c) && !c.cordoned) {
                let Some(pool) = pool_at[c * flavors + f].map(|i| &pools[i]) else { continue };
                let mut local: Vec<NodeState> = states.to_vec();
                // On nodes held for other workloads' reclaims, only what is released here.
                let unreleased = local.clone();
                for &n in known.held_for_reclaims.iter().filter(|n| !known.held[n].contains(&w)) {
                    local[n] = local[n].drained();
                }
                let mut taken: BTreeMap<usize, u64> = BTreeMap::new();
                // What releasing lowers each team's subtree by (an ancestor's limit may be
                // what blocks it).
                let mut freed = vec![0u64; s.teams.len()];
                let mut stopped = vec![0u64; s.teams.len()];
                for &v in &pool.running {
                    let r = &s.running[v];
                    let releasable = if r.preempting {
                        !counted_on.contains_key(&v) && crate::cycle::could_preempt(p, r, true)
                    } else if !gone(v) && r.preemptible && r.borrowed && r.team != p.team && s.now >= r.protected_until
                    {
                        let i = r.team * flavors + f;
                        let left = kept_running[i] - taken.get(&r.team).copied().unwrap_or(0);
                        let above = gpus(left) > share[i] + 1e-9;
                        if above {
                            *taken.entry(r.team).or_default() += u64::from(r.tasks.total_gpus());
                        }
                        above
                    } else {
                        false
                    };
                    if releasable {
                        for t in &r.placement {
                            local[t.node].give(&r.tasks, t.device);
                        }
                        for &a in &ancestors[r.team] {
                            freed[a] += u64::from(r.tasks.total_gpus());
                            if r.preempting {
                                stopped[a] += u64::from(r.tasks.total_gpus());
                            }
                        }
                    }
                }
                // Within the team's own guarantee once the stopping work here is gone
                // (with `counted`, and what other workloads wait for), within every limit,
                // and not past the guarantee of a team above that holds quota for a waiter.
                let quota_holds = |counted: Option<&[u64]>| {
                    let counted = |i: usize| counted.map_or(0, |c| c[i]);
                    let own = known.own_quota.own(
                        |i| subtree[i].saturating_sub(stopped[i / flavors] + counted(i)),
                        p.team,
                        f,
                    );
                    let used = |a: usize| subtree[a * flavors + f] - counted(a * flavors + f) - freed[a];
                    own + requested <= known.own_quota.guaranteed(p.team, f)
                        && ancestors[p.team].iter().all(|&a| {
                            s.teams[a].quotas[f].limit.is_none_or(|l| used(a) + requested <= u64::from(l * ONE_GPU))
                                && !(a != p.team
                                    && paused[a * flavors + f]
                                    && used(a) + requested > s.teams[a].quotas[f].guaranteed_hundredths())
                        })
                };
                let now = quota_holds(None);
                if !(now || quota_holds(Some(&counted))) || budget_stop(s, &ancestors[p.team], f, true).is_some() {
                    continue;
                }
                // (One that fits without releasing anything, on what is free on nodes held
                // for reclaims or once the victims of others are gone, waits for them. So
                // does one whose quota holds only once those are gone: it cannot start
                // before, and the room it found at its visit may since have gone to work
                // that may take it, which this check cannot tell.)
                if known.fits_on_open_nodes(s, &unreleased, pool, w, true) {
                    fits_without_victims = true;
                } else if now && known.fits_on_open_nodes(s, &local, pool, w, true) {
                    could_reclaim.push(format!(
                        "pending {w} waits ({}) though reclaiming borrowed work on cluster {} would let it fit",
                        waiting.reason.code(),
                        cluster.name
                    ));
                }
            }
        }
        if !fits_without_victims {
            out.extend(could_reclaim);
        }
    }
    out
}
