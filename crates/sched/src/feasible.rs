//! What can never run as submitted, whatever else runs or stops.
//!
//! A pending workload is impossible in a flavor when no change of load could admit it
//! there: it asks for more than its team (or an ancestor) may ever hold, it is
//! non-preemptible and asks for more than its team's own guarantee, or no cluster its
//! placement allows could hold its tasks even with every node empty (task larger than any
//! node, a gang larger than a cluster, or than any topology block when the block is
//! required), or no cluster it could go to can run what it is (fractions of a GPU, work
//! without a container image: `ClusterKind::capabilities`). Such a workload claims no fair share in that flavor (it would hold idle
//! GPUs away from work that can run), and when it is impossible in every acceptable
//! flavor it waits as [`Reason::Unschedulable`], saying what can never fit and why. The
//! test runs every cycle, so a change of quotas, clusters or flavors is seen at once.
//!
//! Temporary conditions do not count: cordons, GPUs held by other work, nodes down.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::nodes::NodeState;
use crate::plan::Reason;
use crate::snapshot::{FlavorIx, ONE_GPU, Pending, Snapshot, TeamIx};

/// Why a workload can never run in one flavor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Impossible {
    /// `team` (the workload's, or an ancestor) may hold at most `limit` GPUs of the flavor.
    AboveLimit { flavor: FlavorIx, team: TeamIx, limit: f64, requested: f64 },
    /// Non-preemptible work runs only within its team's own guarantee.
    AboveGuarantee { flavor: FlavorIx, team: TeamIx, guaranteed: f64, requested: f64 },
    /// Even empty, no cluster the placement allows holds all the tasks: at most
    /// `most_tasks` of them fit on one (or on one topology block, when required), and the
    /// largest node has `largest_node_gpus`.
    NoClusterHolds { flavor: FlavorIx, tasks: u32, task_gpus: f64, most_tasks: u32, largest_node_gpus: u32 },
    /// No cluster the placement allows has nodes of the flavor.
    NoNodes { flavor: FlavorIx },
    /// The clusters the placement allows with nodes of the flavor cannot run it: they lack
    /// `missing` (a capability of their kind of backend).
    NotCapable { flavor: FlavorIx, missing: String },
}

impl Impossible {
    pub fn flavor(&self) -> FlavorIx {
        match self {
            Self::AboveLimit { flavor, .. }
            | Self::AboveGuarantee { flavor, .. }
            | Self::NoClusterHolds { flavor, .. }
            | Self::NoNodes { flavor }
            | Self::NotCapable { flavor, .. } => *flavor,
        }
    }
}

/// For each pending workload, why it is impossible in each of its flavors where it is
/// (empty when it is possible in all).
pub fn impossible(s: &Snapshot, ancestors: &[Vec<TeamIx>]) -> Vec<Vec<Impossible>> {
    s.pending.iter().map(|p| p.flavors.iter().filter_map(|&f| impossible_in(s, ancestors, p, f)).collect()).collect()
}

/// Why `p` can never run in flavor `f`, if it cannot.
pub fn impossible_in(s: &Snapshot, ancestors: &[Vec<TeamIx>], p: &Pending, f: FlavorIx) -> Option<Impossible> {
    let requested = u64::from(p.tasks.total_gpus());
    let gpus = |hundredths: u64| hundredths as f64 / f64::from(ONE_GPU);
    for &a in &ancestors[p.team] {
        if let Some(limit) = s.teams[a].quotas[f].limit
            && requested > u64::from(limit * ONE_GPU)
        {
            return Some(Impossible::AboveLimit {
                flavor: f,
                team: a,
                limit: f64::from(limit),
                requested: gpus(requested),
            });
        }
    }
    let guaranteed = s.teams[p.team].quotas[f].guaranteed;
    if !p.preemptible && requested > u64::from(guaranteed * ONE_GPU) {
        return Some(Impossible::AboveGuarantee {
            flavor: f,
            team: p.team,
            guaranteed: f64::from(guaranteed),
            requested: gpus(requested),
        });
    }
    // Tasks each allowed cluster (or topology block, when required) could hold, empty.
    let mut room: BTreeMap<(usize, Option<&str>), u32> = BTreeMap::new();
    let mut largest_node_gpus = 0;
    let mut missing = None;
    let required = p.topology == berth_core::workload::TopologyPolicy::Required;
    for node in s.nodes.iter().filter(|n| n.flavor == f && p.placement_allows(&s.clusters[n.cluster])) {
        if let Some(lacks) = p.missing_capability(s.clusters[node.cluster].kind) {
            missing.get_or_insert(lacks);
            continue;
        }
        let whole = crate::snapshot::Node { unavailable_gpus: 0, ..node.clone() };
        let tasks = NodeState::new(&whole).capacity_when_empty(&p.tasks, &whole);
        largest_node_gpus = largest_node_gpus.max(node.gpus);
        let key = (node.cluster, if required { Some(node.block.as_deref().unwrap_or(&node.name)) } else { None });
        let entry = room.entry(key).or_default();
        *entry = entry.saturating_add(tasks);
    }
    if room.is_empty() {
        return Some(match missing {
            Some(lacks) => Impossible::NotCapable { flavor: f, missing: lacks.to_owned() },
            None => Impossible::NoNodes { flavor: f },
        });
    }
    let most_tasks = room.values().copied().max().unwrap_or(0);
    (most_tasks < p.tasks.count).then(|| Impossible::NoClusterHolds {
        flavor: f,
        tasks: p.tasks.count,
        task_gpus: gpus(u64::from(p.tasks.gpus)),
        most_tasks,
        largest_node_gpus,
    })
}

/// The reason a workload impossible in every flavor waits: no cluster at all where
/// placement matches nothing, else [`Reason::Unschedulable`].
pub fn reason(why: &[Impossible]) -> Reason {
    if why.iter().all(|i| matches!(i, Impossible::NoNodes { .. })) {
        Reason::PlacementMatchesNoCluster
    } else {
        Reason::Unschedulable { why: why.to_vec() }
    }
}
