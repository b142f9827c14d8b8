//! One scheduling cycle (DESIGN.md §3): snapshot in, plan out.
//!
//! 1. Fair share per flavor ([`crate::fair_share`]) from what each team runs and wants.
//! 2. Visit order: team by team, always the team furthest below its fair share (used ÷
//!    share, updated after every admission; when equally far, the one whose next
//!    workload was submitted first); inside a team by priority, then submission time.
//! 3. Each workload, flavor by flavor in its order: the whole gang on one cluster (best
//!    fit on the nodes, preferring topology fit, then least room left over, then tier
//!    (reservation → on-demand → spot), then the backend that suits the kind), then quota
//!    (the team and every ancestor stay within their limits; within the team's guarantee
//!    it is *in-quota*, beyond it *borrowed*, which non-preemptible work may not be, and
//!    which may not take the team above its fair share — what it borrows then is not what
//!    reclaim takes back, so work is not admitted only to be preempted next cycle — until
//!    every workload has had its turn: then what is still free is lent past the fair
//!    shares ([`Cycle::lend`]), teams furthest below theirs first, and is what reclaim
//!    takes back first).
//!    Its reason names quota only where some flavor has room, and cordoned clusters
//!    before anything else about room.
//! 4. A workload that does not fit may preempt, only to run in-quota: first what is
//!    already stopping (and it could have preempted itself), then borrowed work of other
//!    teams above their fair share, then lower-priority preemptible work of its own team;
//!    cheapest first (lowest priority, most recently started), and only as many as
//!    needed; never work still within its min runtime ([`Running::protected_until`]) —
//!    a workload that only protected work could make room for says so and waits. It
//!    then waits for its victims, with the nodes it will use and its quota held
//!    for it; the victims keep their GPUs and quota until they are gone from the
//!    snapshot, so nothing is admitted into them during their grace period. A victim,
//!    requeued, waits until the workload it was preempted for has started
//!    ([`Pending::preempted_for`]).
//! 5. A starving workload (pending longer than the snapshot's starvation time) that still
//!    does not fit gets nodes reserved: nothing behind it in the order is placed on them,
//!    so that work cannot delay it (backfill elsewhere goes on), and its GPUs count against
//!    its team's quota, so that work behind it cannot use up the quota it needs either. A
//!    workload that cannot fit never blocks the ones behind it otherwise.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use berth_core::cluster::Packing;
use berth_core::workload::{FlavorPolicy, TopologyPolicy};
use rustc_hash::FxHashMap;

use crate::fair_share::{TeamInput, fair_shares};
use crate::feasible::Impossible;
use crate::fragmentation::Shapes;
use crate::nodes::{NodeState, Placed, node_states, place};
use crate::plan::{
    Admission, Borrowing, ClusterMiss, FlavorAttempt, Miss, Plan, Preemption, PreemptionCause, Reason, TeamShare,
    Waiting,
};
use crate::snapshot::{
    Cluster, ClusterIx, FlavorIx, InvalidSnapshot, NodeIx, ONE_GPU, OwnQuota, Pending, PendingIx, Resources, Running,
    RunningIx, Snapshot, TaskPlacement, TeamIx,
};

/// How many nodes a reclaim whose cheapest victims do not make room tries again with their
/// victims first ([`Cycle::reclaim_on`]).
const NODES_TRIED_FIRST: usize = 8;

/// Computes the plan for `s`. The same snapshot always yields the same plan.
///
/// # Errors
/// [`InvalidSnapshot`] when the snapshot breaks a rule of [`Snapshot::validate`].
pub fn schedule(s: &Snapshot) -> Result<Plan, InvalidSnapshot> {
    s.validate_references()?;
    let states = node_states(s).map_err(InvalidSnapshot)?;
    Ok(Cycle::new(s, states).run())
}

/// Nodes of one flavor in one cluster.
pub(crate) struct Pool {
    pub cluster: ClusterIx,
    /// Nodes that take new work (not cordoned), by index.
    pub nodes: Vec<NodeIx>,
    /// Node sets a gang with a topology wish may use: each block, and each node without one.
    pub groups: Vec<Vec<NodeIx>>,
    /// Running workloads on the pool (in snapshot order: [`cheapest_first`] sorts them).
    pub running: Vec<RunningIx>,
    /// Free GPU hundredths on `nodes`.
    pub free: u64,
    /// Bumped whenever what a gang could get here shrinks (an admission, held nodes).
    version: u64,
    /// What could be freed here without new victims: GPU hundredths of stopping work not
    /// yet counted on.
    stopping: u64,
    /// Upper bound on what reclaim could free here: borrowed preemptible work of teams that
    /// were above their fair share when the cycle began.
    reclaimable: u64,
    /// Upper bound on what a team could free here by priority: its preemptible work.
    own: FxHashMap<TeamIx, u64>,
    /// The running work behind `stopping`, `reclaimable` and `own`.
    stopping_list: Victims,
    reclaim_list: Victims,
    own_list: FxHashMap<TeamIx, Victims>,
}

/// Running work that could be preempted, put cheapest first only when a workload first
/// looks for victims among it: sorting all 100,000 running workloads every cycle took a
/// fifth of the plan at 100k running (bench/controllers scale), where nothing preempts.
#[derive(Default)]
struct Victims {
    found: Vec<RunningIx>,
    sorted: OnceCell<Vec<RunningIx>>,
}

impl Victims {
    fn cheapest_first(&self, s: &Snapshot) -> &[RunningIx] {
        self.sorted.get_or_init(|| {
            let mut sorted = self.found.clone();
            cheapest_first(s, &mut sorted);
            sorted
        })
    }
}

/// Sorts running work cheapest victim first: lowest priority, then most recently started.
pub(crate) fn cheapest_first(s: &Snapshot, running: &mut [RunningIx]) {
    // The index makes every key distinct, so an unstable sort gives the same order.
    running.sort_unstable_by_key(|&i| (s.running[i].priority, Reverse(s.running[i].started_at), i));
}

/// Builds the pools and a `(cluster, flavor) → pool` table.
pub(crate) fn pools(s: &Snapshot, states: &[NodeState]) -> (Vec<Pool>, Vec<Option<usize>>) {
    let flavors = s.flavors.len();
    let mut at = vec![None; s.clusters.len() * flavors];
    let mut pools: Vec<Pool> = Vec::new();
    let mut blocks: Vec<BTreeMap<&str, usize>> = Vec::new();
    for (i, n) in s.nodes.iter().enumerate() {
        let p = *at[n.cluster * flavors + n.flavor].get_or_insert_with(|| {
            pools.push(Pool {
                cluster: n.cluster,
                nodes: Vec::new(),
                groups: Vec::new(),
                running: Vec::new(),
                free: 0,
                version: 0,
                stopping: 0,
                reclaimable: 0,
                own: FxHashMap::default(),
                stopping_list: Victims::default(),
                reclaim_list: Victims::default(),
                own_list: FxHashMap::default(),
            });
            blocks.push(BTreeMap::new());
            pools.len() - 1
        });
        if n.cordoned {
            continue;
        }
        let pool = &mut pools[p];
        pool.nodes.push(i);
        pool.free += u64::from(states[i].free_gpus());
        match &n.block {
            Some(b) => {
                let g = *blocks[p].entry(b).or_insert_with(|| {
                    pool.groups.push(Vec::new());
                    pool.groups.len() - 1
                });
                pool.groups[g].push(i);
            }
            None => pool.groups.push(vec![i]),
        }
    }
    for (i, r) in s.running.iter().enumerate() {
        if let Some(p) = at[r.cluster * flavors + r.flavor] {
            pools[p].running.push(i);
        }
    }
    (pools, at)
}

/// The team and its ancestors, the team first.
pub fn ancestors(s: &Snapshot) -> Vec<Vec<TeamIx>> {
    (0..s.teams.len()).map(|t| std::iter::successors(Some(t), |&a| s.teams[a].parent).collect()).collect()
}

/// Every team's own fair share per flavor (GPUs), indexed `team * flavors + flavor`, and
/// its own demand, indexed the same way. `impossible` (per pending workload) lists the
/// flavors where it can never run: it claims no share there.
pub(crate) fn own_shares(s: &Snapshot, impossible: &[Vec<Impossible>]) -> (Vec<f64>, Vec<f64>) {
    let flavors = s.flavors.len();
    let mut demand = vec![0.0; s.teams.len() * flavors];
    for r in s.running.iter().filter(|r| !r.preempting) {
        demand[r.team * flavors + r.flavor] += gpus(u64::from(r.tasks.total_gpus()));
    }
    for (p, never) in s.pending.iter().zip(impossible) {
        // Counted in every acceptable flavor where it could ever run, so that a fallback
        // flavor can be borrowed too.
        for &f in p.flavors.iter().filter(|&&f| !never.iter().any(|i| i.flavor() == f)) {
            demand[p.team * flavors + f] += gpus(u64::from(p.tasks.total_gpus()));
        }
    }
    let mut capacity = vec![0.0; flavors];
    for n in s.nodes.iter().filter(|n| !n.cordoned && !s.clusters[n.cluster].cordoned) {
        capacity[n.flavor] += f64::from(n.gpus - n.unavailable_gpus);
    }
    let mut share = vec![0.0; s.teams.len() * flavors];
    for f in 0..flavors {
        let input: Vec<TeamInput> = s
            .teams
            .iter()
            .enumerate()
            .map(|(t, team)| {
                let q = team.quotas[f];
                TeamInput {
                    parent: team.parent,
                    guaranteed: f64::from(q.guaranteed),
                    limit: q.limit.map(f64::from),
                    weight: f64::from(q.weight),
                    own_demand: demand[t * flavors + f],
                    recent: team.recent_usage.as_ref().map(|r| r[f]),
                }
            })
            .collect();
        for (t, fs) in fair_shares(&input, capacity[f]).iter().enumerate() {
            share[t * flavors + f] = fs.own;
        }
    }
    (share, demand)
}

/// Hundredths to GPUs.
pub(crate) fn gpus(hundredths: u64) -> f64 {
    hundredths as f64 / f64::from(ONE_GPU)
}

/// A pool and a gang's shape: count, GPUs, CPUs and memory per task, topology policy.
type ShapeOnPool = (usize, u32, u32, u32, u64, u8);

/// A gang placed on a cluster, before it is chosen.
struct Candidate {
    /// Topology missed, fragment growth, room left unused, tier, backend, cluster.
    key: (bool, i64, u32, usize, usize, ClusterIx),
    pool: usize,
    placed: Placed,
}

/// A team's place in the visit order: its used ÷ share as float bits, then when its next
/// workload was submitted ([`Cycle::team_key`]).
type TeamKey = (u64, i64);

/// Victims that make room for a workload on one pool.
struct Reclaim {
    key: (usize, u64, usize, ClusterIx),
    pool: usize,
    /// Empty: it fits without victims of its own (in what is free on nodes held for other
    /// reclaims, or once the victims those wait for are gone), so it waits.
    victims: Vec<RunningIx>,
    /// The nodes it would run on, with what is free on each now that it will not use.
    nodes: Vec<(NodeIx, NodeState)>,
}

/// Who a node is held for in this cycle.
#[derive(Clone)]
enum NodeHold {
    Open,
    /// For a starving workload, which alone may use it.
    Starving(PendingIx),
    /// For workloads waiting for their victims to go, with what is free there now that
    /// they will not use (`spare`). Another workload may still reclaim that and what its
    /// own victims free there (so a second workload of a team reclaiming does not wait for
    /// the first one's victims to go before it preempts its own).
    Reclaim {
        holders: Vec<PendingIx>,
        spare: NodeState,
    },
}

impl NodeHold {
    /// Whether `w` may be placed on the node now: no other workload holds it.
    fn open_to(&self, w: PendingIx) -> bool {
        match self {
            NodeHold::Open => true,
            NodeHold::Starving(h) => *h == w,
            NodeHold::Reclaim { holders, .. } => holders.iter().all(|&h| h == w),
        }
    }
}

struct Cycle<'a> {
    s: &'a Snapshot,
    flavors: usize,
    states: Vec<NodeState>,
    pools: Vec<Pool>,
    pool_at: Vec<Option<usize>>,
    /// Who each node is held for (starving, or waiting for victims).
    holds: Vec<NodeHold>,
    /// The same, by workload.
    held: BTreeMap<PendingIx, Vec<NodeIx>>,
    /// The flavor whose quota a starving workload holds along with its nodes.
    reserved_quota: BTreeMap<PendingIx, FlavorIx>,
    /// What of its team's guarantee (index `team * flavors + flavor`, GPU hundredths) a
    /// workload waiting for protected work will take once that may be preempted, and the
    /// sum per team and flavor: a second workload of the team is not told it takes the same.
    min_runtime_claims: BTreeMap<PendingIx, (usize, u64)>,
    claimed: Vec<u64>,
    /// The protected work each workload waiting for it names, and per running workload
    /// whether one does: a workload of another team is not told it preempts the same work
    /// (the first to be visited once the protection ends takes it, and the other waited on
    /// for a reason that no longer held).
    promised_to: BTreeMap<PendingIx, Vec<RunningIx>>,
    promised: Vec<bool>,
    /// Why a gang shape missed a pool, and the pool's version then.
    misses: HashMap<ShapeOnPool, (u64, Miss)>,
    /// The pool's version when a gang shape last fitted it (so it still does).
    fits: HashMap<ShapeOnPool, u64>,
    /// Per flavor: nodes held for a workload were opened on a later pass.
    reopened: Vec<bool>,
    /// Teams whose subtree usage went down since the last pass (a reservation let go).
    lowered: BTreeSet<TeamIx>,
    pool_reserved: Vec<bool>,
    ancestors: Vec<Vec<TeamIx>>,
    /// GPU hundredths per `team * flavors + flavor`: the team's own workloads (running,
    /// stopping or preempted in this plan, admitted, waiting for victims, or starving with
    /// quota held)…
    used: Vec<u64>,
    /// …the same for the team's whole subtree…
    subtree_used: Vec<u64>,
    /// …the part of that which is stopping or preempted in this plan (gone once its
    /// backend confirms)…
    subtree_stopping: Vec<u64>,
    /// …the part of that which workloads waiting for victims in this plan count on…
    subtree_counted_on: Vec<u64>,
    /// …and only what runs (and is not preempted), which decides who is above its share.
    running_used: Vec<u64>,
    share: Vec<f64>,
    demand: Vec<f64>,
    /// Per `team * flavors + flavor`: a workload of the team waits for reclaim to run
    /// in-quota, or starves with nodes held, so the subtree may not borrow more in this
    /// cycle (that would use up the quota the waiting workload counts on).
    paused: Vec<Option<PendingIx>>,
    /// Per running workload: preempted, or counted on by a waiting workload, in this plan.
    gone: Vec<bool>,
    /// Per running workload: borrowed, preemptible, of a team above its share at the start.
    reclaimable: Vec<bool>,
    /// Per running workload: within its min runtime, so no victim in this cycle.
    protected: Vec<bool>,
    any_protected: bool,
    /// Per pending workload: admitted in this plan.
    admitted: Vec<bool>,
    /// Per pending workload: why it can never run in each flavor where it cannot.
    impossible: Vec<Vec<Impossible>>,
    /// What of each team's guarantee is its own work's.
    own_quota: OwnQuota,
    /// Lending what is left past the fair share ([`Self::lend`])…
    lending: bool,
    /// …to the pending workloads whose last visit found room in some flavor but not
    /// within the team's fair share.
    share_blocked: Vec<bool>,
    /// The snapshot's task shapes, when some cluster packs against fragmentation.
    shapes: Option<Shapes>,
    plan: Plan,
}

impl<'a> Cycle<'a> {
    fn new(s: &'a Snapshot, states: Vec<NodeState>) -> Self {
        let flavors = s.flavors.len();
        let (pools, pool_at) = pools(s, &states);
        let ancestors = ancestors(s);
        let impossible = crate::feasible::impossible(s, &ancestors);
        let (share, demand) = own_shares(s, &impossible);
        // Work being preempted runs until its backend says it stopped: its GPUs count
        // against its team and ancestors until it is gone from the snapshot.
        let mut used = vec![0; s.teams.len() * flavors];
        let mut subtree_used = used.clone();
        let mut subtree_stopping = used.clone();
        let mut running_used = used.clone();
        for r in &s.running {
            let amount = u64::from(r.tasks.total_gpus());
            used[r.team * flavors + r.flavor] += amount;
            if !r.preempting {
                running_used[r.team * flavors + r.flavor] += amount;
            }
            for &a in &ancestors[r.team] {
                subtree_used[a * flavors + r.flavor] += amount;
                if r.preempting {
                    subtree_stopping[a * flavors + r.flavor] += amount;
                }
            }
        }
        let mut pools = pools;
        let protected: Vec<bool> = s.running.iter().map(|r| !r.preempting && s.now < r.protected_until).collect();
        let reclaimable: Vec<bool> = s
            .running
            .iter()
            .map(|r| {
                let i = r.team * flavors + r.flavor;
                !r.preempting && r.preemptible && r.borrowed && gpus(running_used[i]) > share[i] + 1e-9
            })
            .collect();
        for pool in &mut pools {
            for &v in &pool.running {
                let r = &s.running[v];
                let amount = u64::from(r.tasks.total_gpus());
                if r.preempting {
                    pool.stopping += amount;
                    pool.stopping_list.found.push(v);
                    continue;
                }
                if reclaimable[v] {
                    pool.reclaimable += amount;
                    pool.reclaim_list.found.push(v);
                }
                if r.preemptible {
                    *pool.own.entry(r.team).or_default() += amount;
                    pool.own_list.entry(r.team).or_default().found.push(v);
                }
            }
        }
        Self {
            s,
            flavors,
            holds: vec![NodeHold::Open; s.nodes.len()],
            held: BTreeMap::new(),
            reserved_quota: BTreeMap::new(),
            min_runtime_claims: BTreeMap::new(),
            promised_to: BTreeMap::new(),
            promised: vec![false; s.running.len()],
            claimed: vec![0; s.teams.len() * flavors],
            misses: HashMap::new(),
            fits: HashMap::new(),
            reopened: vec![false; flavors],
            lowered: BTreeSet::new(),
            pool_reserved: vec![false; pools.len()],
            running_used,
            subtree_stopping,
            subtree_counted_on: vec![0; s.teams.len() * flavors],
            states,
            pools,
            pool_at,
            ancestors,
            used,
            subtree_used,
            share,
            demand,
            gone: vec![false; s.running.len()],
            reclaimable,
            any_protected: protected.contains(&true),
            protected,
            admitted: vec![false; s.pending.len()],
            paused: vec![None; s.teams.len() * flavors],
            impossible,
            own_quota: OwnQuota::of(s),
            lending: false,
            share_blocked: vec![false; s.pending.len()],
            shapes: s.clusters.iter().any(|c| c.packing == Packing::Fragmentation).then(|| Shapes::of(s)),
            plan: Plan::default(),
        }
    }

    fn run(mut self) -> Plan {
        let s = self.s;
        let starving: Vec<bool> =
            s.pending.iter().map(|p| s.now - p.submitted_at >= s.starvation_after_seconds).collect();
        // (workload, reason) in visit order; `None` once admitted.
        let mut waiting: Vec<(PendingIx, Option<Reason>)> = Vec::with_capacity(s.pending.len());
        let mut queues: Vec<(TeamIx, Vec<PendingIx>)> = (0..s.teams.len()).map(|t| (t, Vec::new())).collect();
        for w in 0..s.pending.len() {
            queues[s.pending[w].team].1.push(w);
        }
        for (_, q) in &mut queues {
            q.sort_by_key(|&w| (Reverse(s.pending[w].priority), s.pending[w].submitted_at, w));
        }
        self.in_share_order(&queues, |w| w, |c, w| waiting.push((w, c.visit(w, starving[w]))));
        // A workload admitted on a later pass opens the nodes it held; one that no longer
        // starves with nodes held gives back its quota and lets its team borrow; and one
        // admitted after a workload preempted for it was visited lets that one come back:
        // visit the rest again, in the same order, until nothing changes. (Preemption frees
        // nothing within a plan: victims hold their GPUs until they are gone.)
        // Then what is still free is lent past the fair share, which may open held nodes
        // in turn.
        loop {
            self.settle(&mut waiting, &starving);
            if !self.lend(&mut waiting, &starving) {
                break;
            }
        }
        let mut team_count = vec![0; s.teams.len()];
        self.plan.waiting.reserve(waiting.len());
        for (w, reason) in waiting {
            let Some(reason) = reason else { continue };
            let t = s.pending[w].team;
            team_count[t] += 1;
            self.plan.waiting.push(Waiting {
                workload: w,
                reason,
                position: self.plan.waiting.len() as u32 + 1,
                team_position: team_count[t],
                reserved_nodes: self.held.remove(&w).unwrap_or_default(),
            });
        }
        self.plan.shares = self.shares();
        self.plan
    }

    /// Visits the waiting workloads again, in the same order, while a pass changed what they
    /// could get.
    fn settle(&mut self, waiting: &mut [(PendingIx, Option<Reason>)], starving: &[bool]) {
        let s = self.s;
        let preemptor_started = |reason: &Option<Reason>, admitted: &[bool]| matches!(reason, Some(Reason::WaitingForPreemptor { workload }) if admitted[*workload]);
        while !self.lowered.is_empty()
            || self.reopened.contains(&true)
            || waiting.iter().any(|(_, r)| preemptor_started(r, &self.admitted))
        {
            let lowered = std::mem::take(&mut self.lowered);
            let reopened = std::mem::replace(&mut self.reopened, vec![false; self.flavors]);
            for (w, reason) in waiting.iter_mut() {
                let t = s.pending[*w].team;
                // Quota depends on the team's own subtree and on its ancestors' limits.
                let affected = lowered.contains(&t)
                    || preemptor_started(reason, &self.admitted)
                    || s.pending[*w].flavors.iter().any(|&f| reopened[f])
                    || self.ancestors[t]
                        .iter()
                        .any(|&a| lowered.contains(&a) && s.teams[a].quotas.iter().any(|q| q.limit.is_some()));
                if affected && reason.as_ref().is_some_and(|r| !matches!(r, Reason::WaitingForReclaim { .. })) {
                    *reason = self.visit(*w, starving[*w]);
                }
            }
        }
    }

    /// How far the team is from its fair share of its next workload's first flavor, as an
    /// order key (used ÷ share; lower goes first); between teams equally far, the one whose
    /// next workload was submitted first.
    fn team_key(&self, t: TeamIx, next: &PendingIx) -> TeamKey {
        let p = &self.s.pending[*next];
        let i = t * self.flavors + p.flavors[0];
        let ratio = if self.share[i] > 0.0 { gpus(self.used[i]) / self.share[i] } else { f64::INFINITY };
        (ratio.to_bits(), p.submitted_at) // Non-negative floats order like their bits.
    }

    /// Lends what is still free once every workload had its turn past the fair share:
    /// work that waits only because its team reached its share runs on room that no other
    /// team's work could use in this cycle (GPUs idle beside a team held at its share are
    /// what made Berth's tail longer than FIFO's in the Philly replay). Teams furthest
    /// below their share go first; no loan preempts anything or takes held nodes. A loan
    /// is borrowed work of a team above its share, so the first in-quota workload of
    /// another team that needs its GPUs reclaims it. Whether anything was lent.
    fn lend(&mut self, waiting: &mut [(PendingIx, Option<Reason>)], starving: &[bool]) -> bool {
        let s = self.s;
        // (index in `waiting`, workload) per team, in visit order.
        let mut queues: BTreeMap<TeamIx, Vec<(usize, PendingIx)>> = BTreeMap::new();
        for (k, (w, reason)) in waiting.iter().enumerate() {
            // Not one whose victims are being preempted for it.
            if self.share_blocked[*w] && reason.as_ref().is_some_and(|r| !matches!(r, Reason::WaitingForReclaim { .. }))
            {
                queues.entry(s.pending[*w].team).or_default().push((k, *w));
            }
        }
        let queues: Vec<(TeamIx, Vec<(usize, PendingIx)>)> = queues.into_iter().collect();
        self.lending = true;
        let mut lent = false;
        self.in_share_order(
            &queues,
            |(_, w)| w,
            |c, (k, w)| {
                // A starving one is visited, so that it gives back the quota it holds first (and
                // holds it again if it still waits, with the reason it had); the others only
                // try for room: what they could preempt, their first visit found.
                let admitted = if c.reserved_quota.contains_key(&w) {
                    c.visit(w, starving[w]).is_none()
                } else {
                    c.share_blocked[w] = false;
                    c.place(w).is_ok()
                };
                if admitted {
                    waiting[k].1 = None;
                    lent = true;
                }
            },
        );
        self.lending = false;
        lent
    }

    /// Takes the teams' queues in turn, one workload at a time: next, the team furthest
    /// below its fair share for its next workload ([`Self::team_key`], taken again after
    /// each visit, so an admission moves its team back); between equal keys, the team
    /// first in `queues`.
    fn in_share_order<T: Copy>(
        &mut self,
        queues: &[(TeamIx, Vec<T>)],
        workload: impl Fn(T) -> PendingIx,
        mut visit: impl FnMut(&mut Self, T),
    ) {
        let mut heap: BinaryHeap<Reverse<(TeamKey, usize, usize)>> = (queues.iter().enumerate())
            .filter_map(|(i, (t, q))| Some(Reverse((self.team_key(*t, &workload(*q.first()?)), i, 0))))
            .collect();
        while let Some(Reverse((_, i, next))) = heap.pop() {
            let (t, q) = &queues[i];
            visit(self, q[next]);
            if let Some(&item) = q.get(next + 1) {
                heap.push(Reverse((self.team_key(*t, &workload(item)), i, next + 1)));
            }
        }
    }

    /// Admits `w`, or says why it waits (holding nodes for it when it reclaims or starves).
    fn visit(&mut self, w: PendingIx, starving: bool) -> Option<Reason> {
        let s = self.s;
        let p = &s.pending[w];
        // Visited again: its reservation's quota is its own to use…
        let reserved_in = self.reserved_quota.remove(&w);
        if let Some((i, amount)) = self.min_runtime_claims.remove(&w) {
            self.claimed[i] -= amount;
        }
        for v in self.promised_to.remove(&w).unwrap_or_default() {
            self.promised[v] = false;
        }
        let mut pausing = None;
        if let Some(f) = reserved_in {
            self.charge(p.team, f, -i64::from(p.tasks.total_gpus()));
            let i = p.team * self.flavors + f;
            if self.paused[i] == Some(w) {
                self.paused[i] = None;
                pausing = Some(i);
            }
        }
        self.share_blocked[w] = false;
        let reason = self.admit_or_wait(w, starving, reserved_in);
        // …and when it no longer holds them, the work it kept from borrowing is visited
        // again.
        if let Some(i) = pausing
            && self.paused[i] != Some(w)
        {
            self.lowered.extend((0..s.teams.len()).filter(|&t| self.ancestors[t].contains(&p.team)));
        }
        reason
    }

    /// [`Self::visit`] with its reservation's quota given back: `reserved_in` is the flavor
    /// it held quota in until this visit, if it did.
    fn admit_or_wait(&mut self, w: PendingIx, starving: bool, reserved_in: Option<FlavorIx>) -> Option<Reason> {
        let s = self.s;
        let p = &s.pending[w];
        if self.impossible[w].len() == p.flavors.len() {
            return Some(crate::feasible::reason(&self.impossible[w]));
        }
        if let Some(q) = p.preempted_for
            && !self.admitted[q]
        {
            return Some(Reason::WaitingForPreemptor { workload: q });
        }
        let Err((quota_reason, attempts)) = self.place(w) else {
            return None;
        };
        if let Some(reason) = self.preempt_for(w) {
            return Some(reason);
        }
        let protected = self.waits_for_min_runtime(w);
        if starving {
            match reserved_in {
                // Its nodes are still held: hold the quota again.
                Some(f) => self.hold_quota(w, f),
                None => self.reserve(w),
            }
        }
        Some(protected.unwrap_or_else(|| self.reason(p, quota_reason, attempts)))
    }

    /// Admits `w` in the first flavor (or with `best_fit`, the best) that has room and
    /// quota for it without preempting anything; or why not: the first quota reason
    /// where some flavor has room, and each flavor's misses.
    fn place(&mut self, w: PendingIx) -> Result<(), (Option<Reason>, Vec<FlavorAttempt>)> {
        let p = &self.s.pending[w];
        let mut quota_reason = None;
        let mut attempts = Vec::new();
        let possible: Vec<FlavorIx> =
            p.flavors.iter().copied().filter(|&f| !self.impossible[w].iter().any(|i| i.flavor() == f)).collect();
        // With `best_fit`, every flavor with room is tried and the best kept: within the
        // guarantee before borrowing, then by the placement's own key (topology, room left
        // unused, tier, backend), then in the list's order.
        let mut fitting: Option<(bool, FlavorIx, Candidate)> = None;
        for f in possible {
            // Capacity is reported before quota: quota is the reason only where there is
            // room (so a full flavor says so, whatever the limits).
            let mut borrowing = None;
            let room = match self.quota(p, f, None) {
                Ok(in_quota) => match self.best_cluster(w, f) {
                    Ok(c) if p.flavor_policy == FlavorPolicy::BestFit => {
                        if fitting.as_ref().is_none_or(|(q, _, b)| (!in_quota, c.key) < (!*q, b.key)) {
                            fitting = Some((in_quota, f, c));
                        }
                        Ok(())
                    }
                    Ok(c) => {
                        self.admit(w, f, in_quota, c);
                        return Ok(());
                    }
                    Err(misses) => {
                        borrowing = if in_quota { None } else { self.borrowing(p, f) };
                        Err(misses)
                    }
                },
                Err(reason) => {
                    let room = self.room(w, f);
                    if room.is_err() {
                        borrowing = self.borrowing(p, f);
                    }
                    room.map(|()| {
                        self.share_blocked[w] |= matches!(reason, Reason::FairShareReached { .. });
                        quota_reason.get_or_insert(reason);
                    })
                }
            };
            if let Err(misses) = room {
                attempts.push(FlavorAttempt { flavor: f, clusters: misses, borrowing });
            }
        }
        if let Some((in_quota, f, c)) = fitting {
            self.admit(w, f, in_quota, c);
            return Ok(());
        }
        Err((quota_reason, attempts))
    }

    /// Holds `nodes` for starving `w`: no other workload is placed on them in this cycle.
    fn hold(&mut self, w: PendingIx, nodes: &[NodeIx]) {
        for &n in nodes {
            if matches!(self.holds[n], NodeHold::Open) {
                self.holds[n] = NodeHold::Starving(w);
                self.held_by(w, n);
            }
        }
    }

    /// Holds `nodes` for `w`, which waits for its victims: nothing is placed on them in
    /// this cycle, and another reclaim only takes what is free there and `w` will not use,
    /// and what its own victims free. Nodes it held while starving are let go.
    fn hold_for_reclaim(&mut self, w: PendingIx, nodes: Vec<(NodeIx, NodeState)>) {
        for n in self.held.remove(&w).unwrap_or_default() {
            self.holds[n] = NodeHold::Open;
            self.reopened[self.s.nodes[n].flavor] = true;
            self.node_changed(n);
        }
        for (n, left) in nodes {
            match &mut self.holds[n] {
                NodeHold::Reclaim { holders, spare } => {
                    holders.push(w);
                    *spare = left;
                }
                hold => *hold = NodeHold::Reclaim { holders: vec![w], spare: left },
            }
            self.held_by(w, n);
        }
    }

    fn held_by(&mut self, w: PendingIx, n: NodeIx) {
        self.held.entry(w).or_default().push(n);
        self.node_changed(n);
    }

    /// A node was held or let go: what was cached of its pool no longer holds.
    fn node_changed(&mut self, n: NodeIx) {
        let node = &self.s.nodes[n];
        if let Some(pool) = self.pool_at[node.cluster * self.flavors + node.flavor] {
            self.pools[pool].version += 1;
        }
    }

    /// How `p` would borrow in `f`, if it would: what its team's own work uses of its own
    /// guarantee, which `p` would take it past.
    fn borrowing(&self, p: &Pending, f: FlavorIx) -> Option<Borrowing> {
        let used = self.own_quota.own(|i| self.subtree_used[i], p.team, f);
        let (guaranteed, requested) = (self.own_quota.guaranteed(p.team, f), u64::from(p.tasks.total_gpus()));
        (used + requested > guaranteed).then(|| Borrowing {
            team: p.team,
            used: gpus(used),
            guaranteed: gpus(guaranteed),
            requested: gpus(requested),
        })
    }

    /// Whether `p` may take `f` now (`reclaim` is `None`), or once the `victims` it names
    /// are gone (and with them what other workloads waiting for victims in this plan count
    /// on, as those are already counted where they will run): `Ok(in_quota)`, or why not.
    fn quota(&self, p: &Pending, f: FlavorIx, reclaim: Option<&[RunningIx]>) -> Result<bool, Reason> {
        let requested = u64::from(p.tasks.total_gpus());
        let freed = |a: TeamIx| -> u64 {
            let Some(victims) = reclaim else { return 0 };
            let victims: u64 = victims
                .iter()
                .map(|&v| &self.s.running[v])
                .filter(|v| v.flavor == f && self.ancestors[v.team].contains(&a))
                .map(|v| u64::from(v.tasks.total_gpus()))
                .sum();
            victims + self.subtree_counted_on[a * self.flavors + f]
        };
        let used = |a: TeamIx| self.subtree_used[a * self.flavors + f] - freed(a);
        let own_used = self.own_quota.own(|i| used(i / self.flavors), p.team, f);
        let own_guaranteed = self.own_quota.guaranteed(p.team, f);
        let in_quota = own_used + requested <= own_guaranteed;
        // A used-up budget is named before a limit: the limit frees as work ends, the
        // budget only when its period resets.
        for &a in &self.ancestors[p.team] {
            if let Some(b) = self.s.teams[a]
                .budget_stops
                .iter()
                .find(|b| b.resets_at > self.s.now && b.flavor.is_none_or(|bf| bf == f) && (b.stop_new || !in_quota))
            {
                return Err(Reason::BudgetExhausted {
                    team: a,
                    flavor: f,
                    budget: b.budget.clone(),
                    stop_new: b.stop_new,
                    resets_at: b.resets_at,
                });
            }
        }
        for &a in &self.ancestors[p.team] {
            if let Some(limit) = self.s.teams[a].quotas[f].limit
                && used(a) + requested > u64::from(limit * ONE_GPU)
            {
                return Err(Reason::QuotaLimitReached {
                    team: a,
                    flavor: f,
                    used: gpus(used(a)),
                    limit: f64::from(limit),
                    requested: gpus(requested),
                });
            }
        }
        if !in_quota && !p.preemptible {
            return Err(Reason::GuaranteeExceeded {
                team: p.team,
                flavor: f,
                used: gpus(own_used),
                guaranteed: gpus(own_guaranteed),
                requested: gpus(requested),
            });
        }
        // While a workload of its team or a team above waits for reclaim or starves with
        // quota held, nothing borrows under that team, nor takes it past its guarantee
        // (in-quota for a child team, say): either would use up the quota that workload
        // counts on, and once it ran it would be borrowed and reclaimed by the work it
        // preempted.
        // (In-quota work of the team itself takes nothing the waiter counts on: its own
        // guarantee is apart from the guarantees of the teams below.)
        if let Some(waiter) = self.ancestors[p.team].iter().find_map(|&a| {
            let waiter = self.paused[a * self.flavors + f]?;
            let past_guarantee = a != p.team && used(a) + requested > self.s.teams[a].quotas[f].guaranteed_hundredths();
            (!in_quota || past_guarantee).then_some(waiter)
        }) {
            return Err(Reason::BorrowingPaused { flavor: f, workload: waiter });
        }
        let i = p.team * self.flavors + f;
        if !in_quota && !self.lending && gpus(self.used[i] + requested) > self.share[i] + 1e-9 {
            return Err(Reason::FairShareReached {
                team: p.team,
                flavor: f,
                used: gpus(self.used[i]),
                fair_share: self.share[i],
                requested: gpus(requested),
            });
        }
        Ok(in_quota)
    }

    /// Whether `p` fits in its team's own guarantee of `f` (limits aside) once the work
    /// being stopped is gone, with `claimed` of it claimed by others.
    fn within_guarantee(&self, p: &Pending, f: FlavorIx, claimed: u64) -> bool {
        let requested = u64::from(p.tasks.total_gpus());
        let own = self.own_quota.own(|i| self.subtree_used[i] - self.subtree_stopping[i], p.team, f);
        own + claimed + requested <= self.own_quota.guaranteed(p.team, f)
    }

    /// Clusters `p` may use for flavor `f`, with their pool.
    fn allowed_pools<'s>(&'s self, p: &'s Pending, f: FlavorIx) -> impl Iterator<Item = (ClusterIx, usize)> + 's {
        self.s
            .clusters
            .iter()
            .enumerate()
            .filter(move |(_, c)| p.may_run_on(c))
            .filter_map(move |(c, _)| self.pool_at[c * self.flavors + f].map(|pool| (c, pool)))
    }

    /// The best cluster for `w` in flavor `f`, or why each allowed cluster misses.
    fn best_cluster(&mut self, w: PendingIx, f: FlavorIx) -> Result<Candidate, Vec<ClusterMiss>> {
        let s = self.s;
        let p = &s.pending[w];
        let mut best: Option<Candidate> = None;
        let mut misses = Vec::new();
        let mut allowed: Vec<(ClusterIx, usize)> = self.allowed_pools(p, f).collect();
        // In tier and backend order, so that a perfect fit (in one block, nothing left over)
        // ends the search: no cluster after it can beat it.
        allowed.sort_by_key(|&(c, _)| (s.clusters[c].tier_rank(), p.backend_rank(s.clusters[c].kind), c));
        for (c, pool) in allowed {
            let outcome = if s.clusters[c].cordoned { Err(Miss::Cordoned) } else { self.try_pool(w, pool) };
            match outcome {
                Ok(candidate) if best.as_ref().is_none_or(|b| candidate.key < b.key) => {
                    // (Unless some cluster packs against fragmentation: growth may be negative.)
                    let perfect = !candidate.key.0 && candidate.key.2 == 0 && self.shapes.is_none();
                    best = Some(candidate);
                    if perfect {
                        break;
                    }
                }
                Ok(_) => {}
                Err(miss) => misses.push(ClusterMiss { cluster: c, miss }),
            }
        }
        best.ok_or(misses)
    }

    /// Whether some cluster `w` may use has room for it in flavor `f` now, or why each
    /// misses: [`Self::best_cluster`] without choosing, stopping at the first that fits.
    fn room(&mut self, w: PendingIx, f: FlavorIx) -> Result<(), Vec<ClusterMiss>> {
        let p = &self.s.pending[w];
        let r = &p.tasks;
        let cacheable = !self.held.contains_key(&w);
        let allowed: Vec<(ClusterIx, usize)> = self.allowed_pools(p, f).collect();
        let mut misses = Vec::new();
        for (c, pool) in allowed {
            let key = (pool, r.count, r.gpus, r.cpus_milli, r.memory_mib, p.topology as u8);
            if cacheable && !self.s.clusters[c].cordoned && self.fits.get(&key) == Some(&self.pools[pool].version) {
                return Ok(());
            }
            let outcome = if self.s.clusters[c].cordoned { Err(Miss::Cordoned) } else { self.try_pool(w, pool) };
            match outcome {
                Ok(_) => return Ok(()),
                Err(miss) => misses.push(ClusterMiss { cluster: c, miss }),
            }
        }
        Err(misses)
    }

    /// Nodes of `pool` that `w` may use: not held for another workload.
    fn open_nodes<'n>(&self, w: PendingIx, nodes: &'n [NodeIx]) -> Cow<'n, [NodeIx]> {
        if self.held.is_empty() {
            return Cow::Borrowed(nodes);
        }
        nodes.iter().copied().filter(|&n| self.holds[n].open_to(w)).collect()
    }

    /// Tries the gang on one pool without changing anything.
    fn try_pool(&mut self, w: PendingIx, pool_ix: usize) -> Result<Candidate, Miss> {
        let s = self.s;
        let p = &s.pending[w];
        let pool = &self.pools[pool_ix];
        let shapes = shapes_on(&self.shapes, &s.clusters[pool.cluster]);
        let r = &p.tasks;
        let needed = u64::from(r.total_gpus());
        if pool.free < needed {
            return Err(Miss::NotEnoughGpus { free: gpus(pool.free), needed: gpus(needed) });
        }
        // A gang of the same shape that missed here since the pool last shrank misses again
        // (unless nodes are held for this workload, which only it may use).
        let key = (pool_ix, r.count, r.gpus, r.cpus_milli, r.memory_mib, p.topology as u8);
        let cacheable = !self.held.contains_key(&w);
        if cacheable
            && let Some((version, miss)) = self.misses.get(&key)
            && *version == pool.version
        {
            return Err(miss.clone());
        }
        let open = self.open_nodes(w, &pool.nodes);
        let mut best: Option<Placed> = None;
        if p.topology != TopologyPolicy::None {
            for group in &pool.groups {
                let group = self.open_nodes(w, group);
                if let Some(placed) = trial(&mut self.states, &group, r, shapes)
                    && best.as_ref().is_none_or(|b| (placed.growth, placed.leftover) < (b.growth, b.leftover))
                {
                    best = Some(placed);
                }
            }
        }
        let topology_fit = best.is_some() || p.topology == TopologyPolicy::None;
        if best.is_none() && p.topology != TopologyPolicy::Required {
            best = trial(&mut self.states, &open, r, shapes);
        }
        let Some(placed) = best else {
            let open_free: u64 = open.iter().map(|&n| u64::from(self.states[n].free_gpus())).sum();
            let miss = if p.topology == TopologyPolicy::Required && trial(&mut self.states, &open, r, None).is_some() {
                Miss::Topology
            } else if open.len() < pool.nodes.len() && trial(&mut self.states, &pool.nodes, r, None).is_some() {
                Miss::Reserved
            } else if open_free < needed {
                Miss::NotEnoughGpus { free: gpus(open_free), needed: gpus(needed) }
            } else {
                self.short_of(&open, r)
            };
            if cacheable {
                self.misses.insert(key, (pool.version, miss.clone()));
            }
            return Err(miss);
        };
        if cacheable {
            self.fits.insert(key, pool.version);
        }
        let cluster = &self.s.clusters[pool.cluster];
        let key = (
            !topology_fit,
            placed.growth,
            placed.leftover,
            cluster.tier_rank(),
            p.backend_rank(cluster.kind),
            pool.cluster,
        );
        Ok(Candidate { key, pool: pool_ix, placed })
    }

    /// Why a gang with GPUs enough on `open` still does not fit: CPU cores or memory on the
    /// nodes that have the GPUs, or else the GPUs are spread over too many nodes.
    fn short_of(&self, open: &[NodeIx], r: &Resources) -> Miss {
        let (mut by_gpu, mut by_cpu, mut by_memory) = (0u64, 0u64, 0u64);
        let (mut cpus, mut memory) = (0u64, 0u64);
        for &n in open {
            let state = &self.states[n];
            let (g, c, m) = state.room_for(r);
            if g > 0 {
                cpus += u64::from(state.cpus_free());
                memory += state.memory_free();
            }
            by_gpu += u64::from(g);
            by_cpu += u64::from(c);
            by_memory += u64::from(m);
        }
        let count = u64::from(r.count);
        if by_gpu >= count && by_cpu < count {
            let cores = |milli: u64| milli as f64 / 1000.0;
            Miss::InsufficientCpu { free: cores(cpus), needed: cores(count * u64::from(r.cpus_milli)) }
        } else if by_gpu >= count && by_memory < count {
            Miss::InsufficientMemory { free: memory, needed: count * r.memory_mib }
        } else {
            Miss::Fragmented
        }
    }

    fn admit(&mut self, w: PendingIx, f: FlavorIx, in_quota: bool, c: Candidate) {
        let s = self.s;
        let p = &s.pending[w];
        // Nodes it held (it starved or waited for victims, and is admitted on a later pass)
        // are open again: whatever wants their flavor is visited again.
        let released = self.held.remove(&w).unwrap_or_default();
        for &n in &released {
            self.holds[n] = match std::mem::replace(&mut self.holds[n], NodeHold::Open) {
                NodeHold::Reclaim { mut holders, spare } if holders.len() > 1 => {
                    holders.retain(|&h| h != w);
                    NodeHold::Reclaim { holders, spare }
                }
                _ => NodeHold::Open,
            };
            self.node_changed(n);
        }
        for &n in &released {
            self.reopened[s.nodes[n].flavor] = true;
        }
        // Where its trial placed it: nothing was taken since.
        let placed = c.placed;
        crate::nodes::take_placed(&mut self.states, &p.tasks, &placed.tasks);
        self.pools[c.pool].free -= u64::from(p.tasks.total_gpus());
        self.pools[c.pool].version += 1;
        self.charge(p.team, f, i64::from(p.tasks.total_gpus()));
        self.admitted[w] = true;
        self.plan.admissions.push(Admission {
            workload: w,
            cluster: self.pools[c.pool].cluster,
            flavor: f,
            borrowed: !in_quota,
            placement: placed.tasks.iter().map(|&(node, device)| TaskPlacement { node, device }).collect(),
        });
    }

    /// Counts `amount` hundredths of `f` against `team` and its ancestors (a negative
    /// amount gives them back).
    fn charge(&mut self, team: TeamIx, f: FlavorIx, amount: i64) {
        let add = |x: &mut u64| *x = x.checked_add_signed(amount).expect("usage stays non-negative");
        add(&mut self.used[team * self.flavors + f]);
        for &a in &self.ancestors[team] {
            add(&mut self.subtree_used[a * self.flavors + f]);
        }
    }

    /// Counts a starving workload's GPUs of `f` against its team and ancestors while its
    /// nodes are held, and pauses its team's borrowing if it may only run in-quota or holds
    /// quota within the guarantee, so that
    /// work behind it cannot take the quota it needs either (otherwise that work runs, the
    /// starving one is over quota again, loses its nodes, and preempts the same work once
    /// more, every other cycle).
    fn hold_quota(&mut self, w: PendingIx, f: FlavorIx) {
        let p = &self.s.pending[w];
        let in_quota = self.within_guarantee(p, f, 0);
        self.charge(p.team, f, i64::from(p.tasks.total_gpus()));
        self.reserved_quota.insert(w, f);
        // A non-preemptible one runs only within the guarantee, which anything its team
        // borrows now would use up next cycle; so would a preemptible one that holds quota
        // within the guarantee (borrowed work admitted beside it would count against it
        // next cycle, take it over the guarantee and, beyond its fair share, lose it the
        // hold: seen as a requeued victim coming back borrowed while its preemptor waits,
        // and being preempted again every other cycle).
        // What a preemptible one holds beyond the guarantee, its team's fair share and
        // limits, borrowing already respects with its GPUs counted.
        if !p.preemptible || in_quota {
            self.paused[p.team * self.flavors + f].get_or_insert(w);
        }
    }

    /// Finds the fewest, cheapest victims that let `w` run in-quota, preempts them and
    /// holds the nodes for `w`; returns the waiting reason, or `None` when no preemption
    /// helps.
    fn preempt_for(&mut self, w: PendingIx) -> Option<Reason> {
        let s = self.s;
        let p = &s.pending[w];
        let (f, found) = self.victims_for(w, false)?;
        for &v in &found.victims {
            self.gone[v] = true;
            let victim = &s.running[v];
            let amount = u64::from(victim.tasks.total_gpus());
            for &a in &self.ancestors[victim.team] {
                self.subtree_counted_on[a * self.flavors + victim.flavor] += amount;
            }
            let pool = &mut self.pools[found.pool];
            if victim.preempting {
                pool.stopping -= amount;
                continue;
            }
            if self.reclaimable[v] {
                pool.reclaimable -= amount;
            }
            *pool.own.get_mut(&victim.team).expect("counted") -= amount;
            // It keeps its GPUs (and its quota) through its grace period, so nothing is
            // unblocked by it in this plan; it no longer counts as running above its
            // team's share.
            self.running_used[victim.team * self.flavors + victim.flavor] -= amount;
            for &a in &self.ancestors[victim.team] {
                self.subtree_stopping[a * self.flavors + victim.flavor] += amount;
            }
            let cause = if victim.team == p.team {
                PreemptionCause::Priority { workload: w }
            } else {
                PreemptionCause::Reclaim { team: p.team, workload: w }
            };
            self.plan.preemptions.push(Preemption { victim: v, cause });
        }
        self.charge(p.team, f, i64::from(p.tasks.total_gpus()));
        self.paused[p.team * self.flavors + f].get_or_insert(w);
        self.hold_for_reclaim(w, found.nodes);
        let cluster = self.pools[found.pool].cluster;
        Some(Reason::WaitingForReclaim { cluster, flavor: f, victims: found.victims })
    }

    /// The fewest, cheapest victims that let `w` run in-quota, in its first flavor where
    /// any do; work within its min runtime counts as a victim only with
    /// `ignore_protection`.
    fn victims_for(&self, w: PendingIx, ignore_protection: bool) -> Option<(FlavorIx, Reclaim)> {
        let p = &self.s.pending[w];
        let mut best: Option<(FlavorIx, Reclaim)> = None;
        for &f in &p.flavors {
            // Within its team's own guarantee, a workload may take back borrowed work
            // wherever that frees what blocks it: nodes, or an ancestor's limit (the
            // victims' usage counts against the ancestors they share with it; `fits` in
            // `reclaim_on` checks every limit with the victims gone).
            let in_quota_now = self.within_guarantee(p, f, 0);
            let pools: Vec<(ClusterIx, usize)> =
                self.allowed_pools(p, f).filter(|&(c, _)| !self.s.clusters[c].cordoned).collect();
            for (_, pool) in pools {
                let Some(found) = self.reclaim_on(w, f, pool, in_quota_now, ignore_protection) else { continue };
                // It fits without victims of its own (in what nodes held for other reclaims
                // leave free, or once their victims are gone): it waits, and preempts nothing.
                if found.victims.is_empty() {
                    return None;
                }
                if best.as_ref().is_none_or(|(_, b)| found.key < b.key) {
                    best = Some((f, found));
                }
            }
            if best.is_some() {
                break;
            }
        }
        best
    }

    /// Why `w` waits when preempting work still within its min runtime would let it run
    /// in-quota (and nothing else would): that work, and when the last of it may be
    /// preempted.
    fn waits_for_min_runtime(&mut self, w: PendingIx) -> Option<Reason> {
        if !self.any_protected {
            return None;
        }
        let (flavor, found) = self.victims_for(w, true)?;
        let victims: Vec<RunningIx> = found.victims.iter().copied().filter(|&v| self.protected[v]).collect();
        let until = victims.iter().map(|&v| self.s.running[v].protected_until).max()?;
        // A reclaim (of other teams' work) runs within the guarantee, with what other
        // workloads of the team waiting so have claimed of it.
        let p = &self.s.pending[w];
        if found.victims.iter().all(|&v| self.s.running[v].team != p.team) {
            let (i, amount) = (p.team * self.flavors + flavor, u64::from(p.tasks.total_gpus()));
            if !self.within_guarantee(p, flavor, self.claimed[i]) {
                return None;
            }
            self.claimed[i] += amount;
            self.min_runtime_claims.insert(w, (i, amount));
        }
        for &v in &victims {
            self.promised[v] = true;
        }
        self.promised_to.insert(w, victims.clone());
        Some(Reason::WaitingForMinRuntime { cluster: self.pools[found.pool].cluster, flavor, victims, until })
    }

    /// Victims on one pool that let `w` run in-quota in flavor `f`, if any (work within its
    /// min runtime only with `ignore_protection`).
    fn reclaim_on(
        &self,
        w: PendingIx,
        f: FlavorIx,
        pool_ix: usize,
        in_quota_now: bool,
        ignore_protection: bool,
    ) -> Option<Reclaim> {
        let s = self.s;
        let p = &s.pending[w];
        let pool = &self.pools[pool_ix];
        let reclaim_bound = if in_quota_now { pool.reclaimable } else { 0 };
        let own_bound = pool.own.get(&p.team).copied().unwrap_or(0);
        if pool.free + pool.stopping + reclaim_bound + own_bound < u64::from(p.tasks.total_gpus()) {
            return None;
        }
        let mut candidates: Vec<RunningIx> = Vec::new();
        // Already stopping: free to count on, for a workload that could have preempted it
        // (so work told to stop for one workload is not taken by another, which would leave
        // the first to preempt again while the victims come back).
        candidates.extend(
            (pool.stopping_list.cheapest_first(s).iter())
                .filter(|&&v| !self.gone[v] && could_preempt(p, &s.running[v], in_quota_now)),
        );
        // (Waiting for protected work, not for work another waiting workload is told of.)
        let open = |v: RunningIx| !self.gone[v] && (!self.protected[v] || ignore_protection && !self.promised[v]);
        let counted_on = candidates.len();
        if in_quota_now {
            // Borrowed work of other teams (above their share: checked as victims are taken).
            candidates.extend(
                pool.reclaim_list.cheapest_first(s).iter().filter(|&&v| open(v) && s.running[v].team != p.team),
            );
        }
        if let Some(own) = pool.own_list.get(&p.team) {
            candidates.extend(own.cheapest_first(s).iter().filter(|&&v| open(v) && s.running[v].priority < p.priority));
        }
        if ignore_protection {
            // Waiting for protected work: what is preempted once it may be is the work whose
            // protection ends first (the cheapest, started last, is protected longest): it
            // named the job protected longest, and the time its protection ends, while other
            // work was preempted minutes before.
            candidates[counted_on..].sort_by_key(|&v| s.running[v].protected_until);
        }
        let needed = u64::from(p.tasks.total_gpus());
        let at_most: u64 = candidates.iter().map(|&v| u64::from(s.running[v].tasks.total_gpus())).sum();
        if candidates.is_empty() || pool.free + at_most < needed {
            return None;
        }
        // On a node held for other reclaims, what they leave free, and what its victims free.
        let (open, base): (Vec<NodeIx>, Vec<NodeState>) = (pool.nodes.iter())
            .filter_map(|&n| match &self.holds[n] {
                NodeHold::Starving(h) if *h != w => None,
                NodeHold::Reclaim { holders, spare } if !holders.contains(&w) => Some((n, *spare)),
                _ => Some((n, self.states[n])),
            })
            .unzip();
        let position: BTreeMap<NodeIx, usize> = open.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        // Node sets the gang may use, as positions into `open`.
        let node_sets: Vec<Vec<usize>> = if p.topology == TopologyPolicy::Required {
            pool.groups.iter().map(|g| g.iter().filter_map(|n| position.get(n).copied()).collect()).collect()
        } else {
            vec![(0..open.len()).collect()]
        };
        let release = |states: &mut Vec<NodeState>, victims: &[RunningIx]| {
            for &v in victims {
                let r = &s.running[v];
                for t in &r.placement {
                    if let Some(&i) = position.get(&t.node) {
                        states[i].give(&r.tasks, t.device);
                    }
                }
            }
        };
        let fits = |victims: &[RunningIx]| -> Option<(Placed, Vec<NodeState>)> {
            if !matches!(self.quota(p, f, Some(victims)), Ok(true)) {
                return None;
            }
            let mut states = base.clone();
            release(&mut states, victims);
            let placed = node_sets.iter().find_map(|set| place(&mut states, set, &p.tasks, None))?;
            Some((placed, states))
        };
        let free_now: u64 = base.iter().map(|n| u64::from(n.free_gpus())).sum();
        // Takes victims in `order` until `w` fits; whether a victim was passed over because
        // its team would fall to its fair share.
        let take = |order: &mut dyn Iterator<Item = RunningIx>| {
            let mut taken: BTreeMap<TeamIx, u64> = BTreeMap::new();
            let (mut chosen, mut free, mut capped) = (Vec::new(), free_now, false);
            for v in order {
                let r = &s.running[v];
                if !r.preempting && r.team != p.team {
                    // Only while the victim's team stays above its fair share.
                    let i = r.team * self.flavors + f;
                    let left = self.running_used[i] - taken.get(&r.team).copied().unwrap_or(0);
                    if gpus(left) <= self.share[i] + 1e-9 {
                        capped = true;
                        continue;
                    }
                    *taken.entry(r.team).or_default() += u64::from(r.tasks.total_gpus());
                }
                chosen.push(v);
                free += u64::from(r.tasks.total_gpus());
                if free >= needed
                    && let Some(found) = fits(&chosen)
                {
                    return (Some((chosen, found)), capped);
                }
            }
            (None, capped)
        };
        let (mut found, capped) = take(&mut candidates.iter().copied());
        if found.is_none() && capped {
            // The cheapest victims, spread over the nodes, reached their teams' fair shares
            // before any node was free enough: ml's 8 newest borrowed 1-GPU jobs, 4 on each
            // of two full nodes, let research's 8-GPU job (within its guarantee) take
            // neither, though the 8 on either node were victims as good. Again with the
            // victims on one node first, for the nodes where most could come free.
            let on = |v: RunningIx, n: NodeIx| s.running[v].placement.iter().any(|t| t.node == n);
            // What could come free on each node: free now, and the GPUs of the victims there
            // (one pass over the victims: a pool may have thousands of nodes).
            let mut room: Vec<(u64, Option<RunningIx>)> =
                base.iter().map(|n| (u64::from(n.free_gpus()), None)).collect();
            for &v in &candidates {
                for t in &s.running[v].placement {
                    if let Some(&i) = position.get(&t.node)
                        && room[i].1 != Some(v)
                    {
                        room[i] = (room[i].0 + u64::from(s.running[v].tasks.total_gpus()), Some(v));
                    }
                }
            }
            let mut nodes: Vec<(u64, usize)> =
                room.iter().enumerate().filter(|(_, (_, any))| any.is_some()).map(|(i, &(r, _))| (r, i)).collect();
            nodes.sort_by_key(|&(room, i)| (Reverse(room), i));
            for &(_, i) in nodes.iter().take(NODES_TRIED_FIRST) {
                let first = candidates.iter().copied().filter(|&v| on(v, open[i]));
                let rest = candidates.iter().copied().filter(|&v| !on(v, open[i]));
                found = take(&mut first.chain(rest)).0;
                if found.is_some() {
                    break;
                }
            }
        }
        let (mut chosen, (mut placed, mut after)) = found?;
        // Drop victims not needed after all, the most expensive first.
        for i in (0..chosen.len()).rev() {
            let mut fewer = chosen.clone();
            fewer.remove(i);
            // (Work already stopping is kept to count on: once it is gone, nothing waits
            // for the victims of other workloads.)
            if fewer.is_empty() && s.running[chosen[i]].preempting {
                continue;
            }
            if let Some(found) = fits(&fewer) {
                chosen = fewer;
                (placed, after) = found;
            }
        }
        let new_victims = chosen.iter().filter(|&&v| !s.running[v].preempting).count();
        let lost: u64 = chosen
            .iter()
            .map(|&v| &s.running[v])
            .filter(|r| !r.preempting)
            .map(|r| (s.now - r.started_at).max(0) as u64 * u64::from(r.tasks.total_gpus()))
            .sum();
        let mut nodes: Vec<(NodeIx, NodeState)> =
            placed.tasks.iter().map(|&(i, _)| (open[i], base[i].left_free(after[i]))).collect();
        nodes.sort_unstable_by_key(|&(n, _)| n);
        nodes.dedup_by_key(|&mut (n, _)| n);
        Some(Reclaim {
            key: (new_victims, lost, s.clusters[pool.cluster].tier_rank(), pool.cluster),
            pool: pool_ix,
            victims: chosen,
            nodes,
        })
    }

    /// Whether `p` would keep its quota in `f` once the work below its team ran what it is
    /// guaranteed: within its team's own guarantee (the child teams' guarantees are theirs,
    /// so a reservation that counted on them lost its quota as soon as they ran, and a
    /// child preempted its own work for room the reservation held, every other cycle), or,
    /// preemptible, within its team's fair share, which children do not change.
    fn quota_holds_when_children_run(&self, p: &Pending, f: FlavorIx) -> bool {
        let i = p.team * self.flavors + f;
        let requested = u64::from(p.tasks.total_gpus());
        self.own_quota.own(|i| self.subtree_used[i], p.team, f) + requested <= self.own_quota.guaranteed(p.team, f)
            || (p.preemptible && gpus(self.used[i] + requested) <= self.share[i] + 1e-9)
    }

    /// Holds nodes for a starving workload on the allowed pool with the most free room
    /// that could hold it once those nodes are empty; one reservation per pool.
    fn reserve(&mut self, w: PendingIx) {
        let s = self.s;
        let p = &s.pending[w];
        let mut best: Option<(u64, Vec<NodeIx>, usize, FlavorIx)> = None;
        for &f in &p.flavors {
            if self.quota(p, f, None).is_err() || !self.quota_holds_when_children_run(p, f) {
                continue;
            }
            for (c, pool_ix) in self.allowed_pools(p, f) {
                if self.s.clusters[c].cordoned || self.pool_reserved[pool_ix] {
                    continue;
                }
                let pool = &self.pools[pool_ix];
                let groups =
                    if p.topology == TopologyPolicy::Required { pool.groups.clone() } else { vec![pool.nodes.clone()] };
                for group in groups {
                    let mut nodes = self.open_nodes(w, &group).into_owned();
                    nodes.sort_by_key(|&n| (Reverse(self.states[n].free_gpus()), n));
                    let mut room = 0;
                    let mut picked = Vec::new();
                    for n in nodes {
                        if room >= p.tasks.count {
                            break;
                        }
                        room += self.states[n].capacity_when_empty(&p.tasks, &self.s.nodes[n]);
                        picked.push(n);
                    }
                    if room < p.tasks.count {
                        continue;
                    }
                    let free: u64 = picked.iter().map(|&n| u64::from(self.states[n].free_gpus())).sum();
                    if best.as_ref().is_none_or(|(b, _, _, _)| free > *b) {
                        best = Some((free, picked, pool_ix, f));
                    }
                }
            }
            if best.is_some() {
                break;
            }
        }
        let Some((_, mut nodes, pool_ix, f)) = best else { return };
        self.pool_reserved[pool_ix] = true;
        nodes.sort_unstable();
        self.hold(w, &nodes);
        self.hold_quota(w, f);
    }

    /// The reason for a workload neither admitted nor waiting for victims: its placement
    /// rules, then quota where some flavor has room (`quota_reason`), then why no cluster
    /// has room (cordoned clusters first).
    fn reason(&self, p: &Pending, quota_reason: Option<Reason>, attempts: Vec<FlavorAttempt>) -> Reason {
        let allowed = p.flavors.iter().any(|&f| self.allowed_pools(p, f).next().is_some());
        if !allowed {
            return Reason::PlacementMatchesNoCluster;
        }
        if let Some(reason) = quota_reason {
            return reason;
        }
        let misses = || attempts.iter().flat_map(|a| &a.clusters);
        if misses().next().is_none() {
            return Reason::PlacementMatchesNoCluster;
        }
        if misses().all(|m| m.miss == Miss::Cordoned) {
            return Reason::ClustersCordoned;
        }
        if misses().all(|m| matches!(m.miss, Miss::Topology | Miss::Cordoned)) {
            let flavor = attempts.iter().find(|a| a.clusters.iter().any(|m| m.miss == Miss::Topology)).unwrap().flavor;
            return Reason::TopologyUnsatisfiable { flavor };
        }
        Reason::NoClusterFits { attempts }
    }

    fn shares(&self) -> Vec<TeamShare> {
        // What runs (stopping work too, until it has stopped), plus what this plan admits
        // (not what waits).
        let mut used = vec![0; self.s.teams.len() * self.flavors];
        for r in &self.s.running {
            used[r.team * self.flavors + r.flavor] += u64::from(r.tasks.total_gpus());
        }
        for a in &self.plan.admissions {
            used[self.s.pending[a.workload].team * self.flavors + a.flavor] +=
                u64::from(self.s.pending[a.workload].tasks.total_gpus());
        }
        let mut out = Vec::new();
        for (t, team) in self.s.teams.iter().enumerate() {
            for f in 0..self.flavors {
                let i = t * self.flavors + f;
                let q = team.quotas[f];
                if q.guaranteed == 0 && q.limit.is_none() && self.demand[i] == 0.0 && used[i] == 0 {
                    continue;
                }
                out.push(TeamShare {
                    team: t,
                    flavor: f,
                    guaranteed: f64::from(q.guaranteed),
                    limit: q.limit.map(f64::from),
                    fair_share: self.share[i],
                    used: gpus(used[i]),
                    demand: self.demand[i],
                });
            }
        }
        out
    }
}

/// Whether `p` may preempt `r`: lower-priority preemptible work of its own team, or (when
/// `p` is within its team's guarantee) borrowed preemptible work of another team.
pub(crate) fn could_preempt(p: &Pending, r: &Running, in_quota: bool) -> bool {
    r.preemptible && if r.team == p.team { r.priority < p.priority } else { in_quota && r.borrowed }
}

/// The shapes to pack against on `cluster`: the cycle's, if it packs against fragmentation.
fn shapes_on<'a>(shapes: &'a Option<Shapes>, cluster: &Cluster) -> Option<&'a Shapes> {
    shapes.as_ref().filter(|_| cluster.packing == Packing::Fragmentation)
}

/// Places without keeping the placement.
fn trial(
    states: &mut [NodeState],
    nodes: &[NodeIx],
    r: &crate::snapshot::Resources,
    shapes: Option<&Shapes>,
) -> Option<Placed> {
    let placed = place(states, nodes, r, shapes)?;
    for &(n, d) in placed.tasks.iter().rev() {
        states[n].give(r, d);
    }
    Some(placed)
}
