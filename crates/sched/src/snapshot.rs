//! The scheduler's input: the team tree, the clusters with their nodes, what runs and what
//! waits, as plain data. Objects refer to each other by index into the snapshot's vectors,
//! so a cycle needs no lookups by name.
//!
//! GPU amounts are in hundredths of a GPU ([`ONE_GPU`] = 100): a task asks for whole GPUs
//! (a multiple of 100) or for a share of one GPU (1 to 99), and fractional tasks share a
//! GPU up to 100.

use std::collections::{BTreeMap, HashMap};

use berth_core::cluster::{Capabilities, ClusterKind, Packing, TIER_LABEL, TIERS};
use berth_core::workload::{FlavorPolicy, TopologyPolicy, WorkloadKind, WorkloadSpec};
use serde::{Deserialize, Serialize};

/// One GPU, in the hundredths every amount is counted in.
pub const ONE_GPU: u32 = 100;
/// Most GPUs one node may have.
pub const MAX_GPUS_PER_NODE: u32 = 32;

pub type FlavorIx = usize;
pub type TeamIx = usize;
pub type ClusterIx = usize;
pub type NodeIx = usize;
/// Index into [`Snapshot::running`].
pub type RunningIx = usize;
/// Index into [`Snapshot::pending`].
pub type PendingIx = usize;

/// Everything one scheduling cycle looks at.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The cycle's clock, in seconds (any epoch; only differences matter).
    pub now: i64,
    /// A workload pending longer than this starves: capacity is reserved for it.
    pub starvation_after_seconds: i64,
    pub flavors: Vec<String>,
    pub teams: Vec<Team>,
    pub clusters: Vec<Cluster>,
    pub nodes: Vec<Node>,
    pub running: Vec<Running>,
    pub pending: Vec<Pending>,
    /// Tasks of recent work no longer in the snapshot (finished, or turned away), which
    /// [`crate::fragmentation`] counts with the running and pending work as the demand to
    /// pack for; `count` is the number of tasks. The controllers leave it empty: their
    /// work waits in `pending` until it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_demand: Vec<Resources>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Team {
    pub name: String,
    pub parent: Option<TeamIx>,
    /// One entry per flavor, indexed like [`Snapshot::flavors`].
    pub quotas: Vec<Quota>,
    /// Its budgets that are used up and stop work (in the subtree) until they reset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budget_stops: Vec<BudgetStop>,
    /// The protection from preemption its subtree's running work gets at most; see
    /// [`min_runtime`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_runtime_seconds: Option<u32>,
    /// When its tree shares fairly over time (`spec.fair_sharing`): the recent GPU-hours
    /// of its own workloads, one entry per flavor; see [`crate::fair_share`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_usage: Option<Vec<f64>>,
}

/// How long work of `team` is protected from preemption once it runs: what the workload
/// declares (`declared`), at most what its team allows, and that when it declares none.
/// A team allows the lowest protection set on it and the teams above it, and none unless
/// its top-level team sets one: each level may only lower what the level above grants, so
/// those who manage a subtree cannot shield its borrowed work from other teams' reclaim
/// beyond what a platform admin granted the top-level team.
pub fn min_runtime(teams: &[Team], team: TeamIx, declared: Option<u32>) -> u32 {
    let (mut lowest, mut top) = (None, team);
    for t in std::iter::successors(Some(team), |&t| teams[t].parent) {
        top = t;
        if let Some(m) = teams[t].min_runtime_seconds {
            lowest = Some(lowest.map_or(m, |l: u32| l.min(m)));
        }
    }
    let allowed = if teams[top].min_runtime_seconds.is_some() { lowest.unwrap_or(0) } else { 0 };
    declared.map_or(allowed, |d| d.min(allowed))
}

/// A used-up budget that stops new work, or new borrowing, in a team's subtree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetStop {
    /// The budget, in words (`500 GPU-hours of h100 per month`).
    pub budget: String,
    /// Only work of this flavor; `None`: all.
    pub flavor: Option<FlavorIx>,
    /// No new work at all; else no new borrowing.
    pub stop_new: bool,
    /// When it resets ([`Snapshot::now`]'s clock): from then on it stops nothing.
    pub resets_at: i64,
}

impl Team {
    /// The stored teams as the scheduler sees them, in the same order: parents by index,
    /// one quota per flavor of `flavors` (a flavor a team declares nothing for gets
    /// [`Quota::default`]; quotas of flavors not in `flavors` are left out), at `now`.
    pub fn tree(teams: &[berth_core::team::Team], flavors: &[String], now: chrono::DateTime<chrono::Utc>) -> Vec<Self> {
        let flavor_ix: HashMap<&str, usize> = flavors.iter().enumerate().map(|(i, f)| (f.as_str(), i)).collect();
        let team_ix: HashMap<&str, usize> =
            teams.iter().enumerate().map(|(i, t)| (t.metadata.name.as_str(), i)).collect();
        teams
            .iter()
            .map(|t| {
                let mut quotas = vec![Quota::default(); flavors.len()];
                for q in &t.spec.quotas {
                    if let Some(&f) = flavor_ix.get(q.flavor.as_str()) {
                        quotas[f] = Quota::from(q);
                    }
                }
                let parent = t.spec.parent.as_deref().and_then(|p| team_ix.get(p).copied());
                // The tree's setting is its top-level team's.
                let top = std::iter::successors(Some(t), |t| {
                    t.spec.parent.as_deref().and_then(|p| team_ix.get(p)).map(|&p| &teams[p])
                })
                .take(teams.len())
                .last()
                .unwrap_or(t);
                // It counts once the tree's use has been added up (before, a tree that just
                // set it would count as having used nothing).
                let on = top.spec.fair_sharing.is_some() && top.status.recent_usage.is_some();
                let recent_usage = on.then(|| {
                    let mut used = vec![0.0; flavors.len()];
                    for u in t.status.recent_usage.iter().flat_map(|r| &r.flavors) {
                        if let Some(&f) = flavor_ix.get(u.flavor.as_str()) {
                            used[f] = u.gpu_hours;
                        }
                    }
                    used
                });
                Self {
                    name: t.metadata.name.clone(),
                    parent,
                    quotas,
                    budget_stops: budget_stops(t, &flavor_ix, now),
                    min_runtime_seconds: t.spec.preemption.map(|p| p.min_runtime_seconds),
                    recent_usage,
                }
            })
            .collect()
    }
}

/// The budgets `t` declares that are used up and whose action stops work. Its status says
/// which are, as the budgets controller last added them up (every 10 s at most); a budget
/// declared or changed since counts as used up at once when what the status last said its
/// flavor and period used already reaches it (a new budget of 0 GPU-hours, one lowered
/// below what was used): before, work was admitted for seconds after a budget stopped it.
fn budget_stops(
    t: &berth_core::team::Team,
    flavor_ix: &HashMap<&str, usize>,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<BudgetStop> {
    use berth_core::usage::{BudgetAction, BudgetState};
    t.spec
        .budgets
        .iter()
        .filter(|b| b.action != BudgetAction::Warn)
        .filter_map(|b| {
            // Its own entry, else one of its flavor and period (the budget changed since).
            let known = t.status.budgets.iter().find(|s| s.budget == *b).or_else(|| {
                t.status.budgets.iter().find(|s| s.budget.flavor == b.flavor && s.budget.period == b.period)
            });
            let resets_at = match known.filter(|s| s.budget == *b) {
                Some(s) if s.state == BudgetState::Exhausted => s.resets_at,
                Some(_) => return None,
                None => {
                    let (start, resets_at) = b.period.around(now);
                    let used = known.filter(|s| s.period_start == start).map_or(0.0, |s| s.used_gpu_hours);
                    if used < b.gpu_hours {
                        return None;
                    }
                    resets_at
                }
            };
            let flavor = match &b.flavor {
                Some(f) => Some(*flavor_ix.get(f.as_str())?),
                None => None,
            };
            Some(BudgetStop {
                budget: b.describe(),
                flavor,
                stop_new: b.action == BudgetAction::StopNew,
                resets_at: resets_at.timestamp(),
            })
        })
        .collect()
}

/// A team's quota for one flavor, in whole GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub guaranteed: u32,
    /// Most the team's subtree may hold, borrowed GPUs included; `None`: no limit.
    pub limit: Option<u32>,
    pub weight: u32,
}

impl Quota {
    /// The guarantee in GPU hundredths, as usage is counted.
    pub fn guaranteed_hundredths(&self) -> u64 {
        u64::from(self.guaranteed * ONE_GPU)
    }
}

impl From<&berth_core::team::Quota> for Quota {
    fn from(q: &berth_core::team::Quota) -> Self {
        Self { guaranteed: q.guaranteed, limit: q.limit, weight: q.weight }
    }
}

impl Default for Quota {
    /// What a team has for a flavor it declares nothing for: nothing guaranteed, no limit,
    /// weight 1.
    fn default() -> Self {
        Self { guaranteed: 0, limit: None, weight: 1 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub name: String,
    pub kind: ClusterKind,
    pub labels: BTreeMap<String, String>,
    /// A cordoned cluster keeps its running work but takes nothing new.
    pub cordoned: bool,
    /// Whether it runs tasks of a fraction of a GPU; `None`: as every cluster of its kind
    /// does (`ClusterSpec::capabilities` says, e.g. a Slurm cluster with shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fractional_gpus: Option<bool>,
    /// How its nodes are chosen for each task ([`crate::fragmentation`]).
    #[serde(default, skip_serializing_if = "Packing::is_best_fit")]
    pub packing: Packing,
}

impl Cluster {
    /// What the cluster can run.
    pub fn capabilities(&self) -> Capabilities {
        let mut can = self.kind.capabilities();
        can.fractional_gpus = self.fractional_gpus.unwrap_or(can.fractional_gpus);
        can
    }

    /// Rank of the cluster's `tier` label: reservation 0, on-demand 1, spot 2. A cluster
    /// without a tier ranks as on-demand.
    pub fn tier_rank(&self) -> usize {
        self.labels.get(TIER_LABEL).and_then(|t| TIERS.iter().position(|x| x == t)).unwrap_or(1)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub cluster: ClusterIx,
    pub flavor: FlavorIx,
    /// GPUs in the node, at most [`MAX_GPUS_PER_NODE`].
    pub gpus: u32,
    /// GPUs that cannot be used (held by work outside Berth, or broken).
    pub unavailable_gpus: u32,
    pub cpus_milli: u32,
    pub memory_mib: u64,
    /// Nodes sharing a block (NVLink domain, IB switch) are close to each other.
    pub block: Option<String>,
    pub cordoned: bool,
}

impl Node {
    /// A node as a cluster's inventory reports it (the store's integers), clamped to what
    /// a snapshot allows: at most [`MAX_GPUS_PER_NODE`] GPUs, no more unavailable than it
    /// has; an unschedulable node is cordoned.
    #[allow(clippy::too_many_arguments)]
    pub fn from_inventory(
        name: &str,
        cluster: ClusterIx,
        flavor: FlavorIx,
        gpus: i32,
        unavailable_gpus: i32,
        cpus: i32,
        memory_mib: i64,
        block: Option<&str>,
        schedulable: bool,
    ) -> Self {
        let gpus = u32::try_from(gpus).unwrap_or(0).min(MAX_GPUS_PER_NODE);
        Self {
            name: name.to_owned(),
            cluster,
            flavor,
            gpus,
            unavailable_gpus: u32::try_from(unavailable_gpus).unwrap_or(0).min(gpus),
            cpus_milli: u32::try_from(cpus).unwrap_or(0).saturating_mul(1000),
            memory_mib: u64::try_from(memory_mib).unwrap_or(0),
            block: block.map(str::to_owned),
            cordoned: !schedulable,
        }
    }
}

/// What each of a workload's identical tasks needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub count: u32,
    /// Per task, in hundredths: a multiple of [`ONE_GPU`], or 1–99 for a share of one GPU.
    pub gpus: u32,
    pub cpus_milli: u32,
    pub memory_mib: u64,
}

/// GPUs (as a spec states them) in hundredths.
pub fn hundredths(gpus: f64) -> u32 {
    (gpus * f64::from(ONE_GPU)).round() as u32
}

impl Resources {
    /// What each task of `spec` asks for.
    pub fn of(spec: &WorkloadSpec) -> Self {
        let r = &spec.tasks.resources;
        Self {
            count: spec.tasks.count,
            gpus: hundredths(r.gpus),
            cpus_milli: r.cpus.map_or(0, |c| (c * 1000.0).round() as u32),
            memory_mib: r.memory_mib.unwrap_or(0),
        }
    }

    /// The whole workload's GPUs, in hundredths.
    pub fn total_gpus(&self) -> u32 {
        self.count * self.gpus
    }

    pub fn is_fractional(&self) -> bool {
        !self.gpus.is_multiple_of(ONE_GPU)
    }
}

/// Where one task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskPlacement {
    pub node: NodeIx,
    /// For a fractional task, the GPU of the node it shares.
    pub device: Option<u8>,
}

/// A workload holding GPUs: admitted, dispatched, running, or being preempted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub id: String,
    pub team: TeamIx,
    pub priority: i32,
    pub preemptible: bool,
    /// Admitted beyond its team's guarantee: reclaimable.
    pub borrowed: bool,
    pub started_at: i64,
    /// No preemption takes it before this time (its min runtime, counted from when it
    /// started running); 0: none.
    #[serde(default)]
    pub protected_until: i64,
    /// Already told to stop: its GPUs are about to be free.
    pub preempting: bool,
    pub cluster: ClusterIx,
    pub flavor: FlavorIx,
    pub tasks: Resources,
    /// One entry per task.
    pub placement: Vec<TaskPlacement>,
}

/// A workload waiting for admission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub id: String,
    pub team: TeamIx,
    pub kind: WorkloadKind,
    pub priority: i32,
    pub preemptible: bool,
    pub submitted_at: i64,
    /// Acceptable flavors, most preferred first.
    pub flavors: Vec<FlavorIx>,
    pub tasks: Resources,
    pub topology: TopologyPolicy,
    /// Only clusters carrying all these labels.
    pub cluster_selector: BTreeMap<String, String>,
    /// Only these backend kinds; empty: any.
    pub backend_kinds: Vec<ClusterKind>,
    /// How it picks one of several flavors.
    #[serde(default)]
    pub flavor_policy: FlavorPolicy,
    /// Whether it names a container image (some backends run only containers).
    #[serde(default)]
    pub has_image: bool,
    /// Whether it gives a script or a command (some backends run nothing else).
    #[serde(default)]
    pub has_command: bool,
    /// The waiting workload it was preempted for, if that one still waits (and was not
    /// itself preempted for another): it is not admitted before that one, which would
    /// only preempt it again.
    #[serde(default)]
    pub preempted_for: Option<PendingIx>,
}

impl Pending {
    /// `spec` waiting in `team` for one of `flavors` since `submitted_at`.
    pub fn of(id: String, team: TeamIx, flavors: Vec<FlavorIx>, spec: &WorkloadSpec, submitted_at: i64) -> Self {
        Self {
            id,
            team,
            kind: spec.kind,
            priority: spec.priority,
            preemptible: spec.preemptible,
            submitted_at,
            flavors,
            tasks: Resources::of(spec),
            topology: spec.topology,
            cluster_selector: spec.placement.cluster_selector.clone(),
            backend_kinds: spec.placement.backend_kinds.clone(),
            flavor_policy: spec.placement.flavor_policy,
            has_image: spec.run.image.as_deref().is_some_and(|i| !i.is_empty()),
            has_command: spec.run.script.as_deref().is_some_and(|s| !s.is_empty()) || !spec.run.command.is_empty(),
            preempted_for: None,
        }
    }

    /// Whether `cluster` satisfies the workload's placement constraints and can run it.
    pub fn may_run_on(&self, cluster: &Cluster) -> bool {
        self.placement_allows(cluster) && self.missing_capability(cluster).is_none()
    }

    /// Whether `cluster` satisfies the workload's placement constraints.
    pub fn placement_allows(&self, cluster: &Cluster) -> bool {
        (self.backend_kinds.is_empty() || self.backend_kinds.contains(&cluster.kind))
            && self.cluster_selector.iter().all(|(k, v)| cluster.labels.get(k) == Some(v))
    }

    /// Why `cluster` cannot run this workload, in words that follow "the clusters"; `None`
    /// when it can.
    pub fn missing_capability(&self, cluster: &Cluster) -> Option<&'static str> {
        let can = cluster.capabilities();
        if self.kind == WorkloadKind::Inference && !can.serves_inference {
            Some("do not serve inference (they run batch jobs), and it is an inference service (spec.kind)")
        } else if self.tasks.is_fractional() && !can.fractional_gpus {
            Some("cannot share a GPU, and it asks for a fraction of one")
        } else if can.requires_image && !self.has_image {
            Some("run only containers, and it names no image (spec.run.image)")
        } else if can.requires_command && !self.has_command {
            Some("run only batch scripts, and it gives no script or command (spec.run.script, spec.run.command)")
        } else {
            None
        }
    }

    /// 0 when `kind` is the backend that suits this kind of work best: Slurm for training
    /// and batch, Kubernetes for inference and notebooks; 1 otherwise.
    pub fn backend_rank(&self, kind: ClusterKind) -> usize {
        let suits = match self.kind {
            WorkloadKind::Training | WorkloadKind::Batch => ClusterKind::Slurm,
            WorkloadKind::Inference | WorkloadKind::Notebook => ClusterKind::Kubernetes,
        };
        usize::from(kind != suits)
    }
}

/// Why a snapshot cannot be scheduled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid snapshot: {0}")]
pub struct InvalidSnapshot(pub String);

/// What of each team's guarantee is its own work's (work submitted to the team itself, not
/// to the teams below it): the guarantee less its child teams' guarantees, which are
/// theirs (guarantees nest, so this is never negative). A leaf team's is its whole
/// guarantee. A department that ran its own work in its whole guarantee kept that work
/// in-quota, and its child team, guaranteed the same GPUs, waited with nothing and could
/// not take them back. Work beyond this is borrowed, as fair sharing already counted it.
#[derive(Debug, Clone)]
pub struct OwnQuota {
    flavors: usize,
    children: Vec<Vec<TeamIx>>,
    guaranteed: Vec<u64>,
}

impl OwnQuota {
    pub fn of(s: &Snapshot) -> Self {
        let flavors = s.flavors.len();
        let mut children = vec![Vec::new(); s.teams.len()];
        for (t, team) in s.teams.iter().enumerate() {
            if let Some(parent) = team.parent {
                children[parent].push(t);
            }
        }
        let guaranteed = (0..s.teams.len() * flavors)
            .map(|i| {
                let (t, f) = (i / flavors, i % flavors);
                let theirs: u64 = children[t].iter().map(|&c| s.teams[c].quotas[f].guaranteed_hundredths()).sum();
                s.teams[t].quotas[f].guaranteed_hundredths().saturating_sub(theirs)
            })
            .collect();
        Self { flavors, children, guaranteed }
    }

    /// The GPU hundredths of flavor `f` team `t`'s own work runs in-quota.
    pub fn guaranteed(&self, t: TeamIx, f: FlavorIx) -> u64 {
        self.guaranteed[t * self.flavors + f]
    }

    /// Team `t`'s own part of an amount counted per subtree (`subtree`, indexed `team *
    /// flavors + flavor`, each team's figure including the teams below it).
    pub fn own(&self, subtree: impl Fn(usize) -> u64, t: TeamIx, f: FlavorIx) -> u64 {
        let below: u64 = self.children[t].iter().map(|&c| subtree(c * self.flavors + f)).sum();
        subtree(t * self.flavors + f).saturating_sub(below)
    }
}

impl Snapshot {
    /// Whether teams are placed under team `t`.
    pub fn has_child_teams(&self, t: TeamIx) -> bool {
        self.teams.iter().any(|team| team.parent == Some(t))
    }

    /// Each running workload's `borrowed` as its team's guarantee stands now, not as it
    /// stood at the admission: a team's own work (all that is not already stopping) counts
    /// in-quota while it fits the team's own guarantee ([`OwnQuota`]), as an admission
    /// counts it, keeping what was in-quota so first, then the highest priority and the
    /// longest running. A guarantee taken from a team makes its work reclaimable at once
    /// (it stayed in-quota until it ended, while the team now guaranteed those GPUs
    /// waited); work admitted borrowed is in-quota once the team's other work has gone.
    pub fn settle_borrowed(&mut self) {
        let flavors = self.flavors.len();
        let own_quota = OwnQuota::of(self);
        let mut own = vec![0u64; self.teams.len() * flavors];
        for r in self.running.iter().filter(|r| !r.preempting) {
            own[r.team * flavors + r.flavor] += u64::from(r.tasks.total_gpus());
        }
        let guaranteed = |i: usize| own_quota.guaranteed(i / flavors, i % flavors);
        // Where all of it fits (most teams, most cycles), all of it is in-quota: only the
        // rest is put in order (sorting 100,000 running workloads each cycle cost tens of ms).
        let mut over: Vec<Vec<usize>> = vec![Vec::new(); self.teams.len() * flavors];
        for i in 0..self.running.len() {
            let r = &self.running[i];
            let at = r.team * flavors + r.flavor;
            if r.preempting {
                continue;
            }
            if own[at] <= guaranteed(at) {
                self.running[i].borrowed = false;
            } else {
                over[at].push(i);
            }
        }
        for (at, mut group) in over.into_iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            group.sort_by_key(|&i| {
                let r = &self.running[i];
                (r.borrowed, std::cmp::Reverse(r.priority), r.started_at, i)
            });
            let (mut used, limit) = (0, guaranteed(at));
            for i in group {
                let amount = u64::from(self.running[i].tasks.total_gpus());
                self.running[i].borrowed = used + amount > limit;
                used += amount;
            }
        }
    }

    /// Sets each pending workload's `preempted_for` from `preemptor_of` (a workload's id →
    /// the id of the one it was last preempted for): linked while that one is pending too
    /// and was not itself preempted for a pending workload (so no chain or cycle can keep
    /// work waiting on work that waits).
    pub fn link_preemptors(&mut self, preemptor_of: &std::collections::HashMap<String, String>) {
        // Positions of the workloads named as preemptors only: a map of every pending id,
        // built each cycle, was a fifth of a cycle's CPU with 46,000 pending.
        let named: std::collections::HashSet<&str> = preemptor_of.values().map(String::as_str).collect();
        let position: std::collections::HashMap<&str, PendingIx> = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| named.contains(p.id.as_str()))
            .map(|(i, p)| (p.id.as_str(), i))
            .collect();
        let waits_for = |p: &Pending| preemptor_of.get(&p.id).and_then(|q| position.get(q.as_str()).copied());
        let links: Vec<Option<PendingIx>> = self
            .pending
            .iter()
            .enumerate()
            .map(|(i, p)| waits_for(p).filter(|&q| q != i && waits_for(&self.pending[q]).is_none()))
            .collect();
        for (p, link) in self.pending.iter_mut().zip(links) {
            p.preempted_for = link;
        }
    }

    /// Checks references, sizes and that the running work fits its nodes.
    ///
    /// # Errors
    /// The first broken rule.
    pub fn validate(&self) -> Result<(), InvalidSnapshot> {
        self.validate_references()?;
        crate::nodes::node_states(self).map(|_| ()).map_err(InvalidSnapshot)
    }

    /// [`Self::validate`] without placing the running work on its nodes.
    pub(crate) fn validate_references(&self) -> Result<(), InvalidSnapshot> {
        let bad = |m: String| Err(InvalidSnapshot(m));
        let flavors = self.flavors.len();
        for (i, t) in self.teams.iter().enumerate() {
            if t.quotas.len() != flavors {
                return bad(format!("team {i} has {} quotas for {flavors} flavors", t.quotas.len()));
            }
            if let Some(r) = &t.recent_usage
                && (r.len() != flavors || r.iter().any(|u| !u.is_finite() || *u < 0.0))
            {
                return bad(format!("team {i}'s recent usage is not one number of 0 or more per flavor"));
            }
            if t.parent.is_some_and(|p| p >= self.teams.len()) {
                return bad(format!("team {i} has an unknown parent"));
            }
            // Walking up more steps than there are teams means a cycle.
            let mut at = t.parent;
            for _ in 0..=self.teams.len() {
                match at {
                    Some(p) => at = self.teams[p].parent,
                    None => break,
                }
            }
            if at.is_some() {
                return bad(format!("team {i} is in a parent cycle"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.cluster >= self.clusters.len() || n.flavor >= flavors {
                return bad(format!("node {i} refers to an unknown cluster or flavor"));
            }
            if n.gpus > MAX_GPUS_PER_NODE || n.unavailable_gpus > n.gpus {
                return bad(format!("node {i} has {} GPUs ({} unavailable)", n.gpus, n.unavailable_gpus));
            }
        }
        for (i, r) in self.running.iter().enumerate() {
            check_resources(&r.tasks).map_err(|m| InvalidSnapshot(format!("running {i}: {m}")))?;
            if r.team >= self.teams.len() || r.cluster >= self.clusters.len() || r.flavor >= flavors {
                return bad(format!("running {i} refers to an unknown team, cluster or flavor"));
            }
            if r.placement.len() != r.tasks.count as usize {
                return bad(format!("running {i} places {} of {} tasks", r.placement.len(), r.tasks.count));
            }
            for p in &r.placement {
                let Some(node) = self.nodes.get(p.node) else {
                    return bad(format!("running {i} is on an unknown node"));
                };
                if node.cluster != r.cluster || node.flavor != r.flavor {
                    return bad(format!("running {i} is on node {} of another cluster or flavor", p.node));
                }
                if r.tasks.is_fractional() != p.device.is_some() || p.device.is_some_and(|d| u32::from(d) >= node.gpus)
                {
                    return bad(format!("running {i}: a fractional task names its GPU, a whole one does not"));
                }
            }
        }
        for (i, p) in self.pending.iter().enumerate() {
            check_resources(&p.tasks).map_err(|m| InvalidSnapshot(format!("pending {i}: {m}")))?;
            if p.team >= self.teams.len() || p.flavors.is_empty() || p.flavors.iter().any(|&f| f >= flavors) {
                return bad(format!("pending {i} refers to an unknown team or has no known flavor"));
            }
            if let Some(q) = p.preempted_for
                && (q >= self.pending.len() || q == i || self.pending[q].preempted_for.is_some())
            {
                return bad(format!("pending {i} was preempted for pending {q}, which is not one waiting on its own"));
            }
        }
        Ok(())
    }
}

fn check_resources(r: &Resources) -> Result<(), String> {
    if r.count == 0 {
        return Err("no tasks".into());
    }
    if r.is_fractional() && r.gpus > ONE_GPU {
        return Err(format!("{} hundredths of a GPU: fractions must stay within one GPU", r.gpus));
    }
    if r.gpus > MAX_GPUS_PER_NODE * ONE_GPU {
        return Err(format!("{} GPUs per task is more than a node has", r.gpus / ONE_GPU));
    }
    Ok(())
}
