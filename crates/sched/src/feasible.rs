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
use crate::snapshot::{ClusterIx, FlavorIx, Node, ONE_GPU, OwnQuota, Pending, Snapshot, TeamIx};

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
    /// The clusters the placement allows with nodes of the flavor cannot run it: `missing`
    /// says what of their kind of backend stands in the way.
    NotCapable { flavor: FlavorIx, missing: String },
}

impl Impossible {
    /// In words, naming the flavor and team as `s` does.
    pub fn describe(&self, s: &Snapshot) -> String {
        let team = |t: usize| s.teams[t].name.as_str();
        let flavor = |f: usize| s.flavors[f].as_str();
        match self {
            Self::AboveLimit { flavor: f, team: t, limit, requested } => {
                format!("{}: it asks for {requested} GPUs, and team {} may hold at most {limit}", flavor(*f), team(*t))
            }
            Self::AboveGuarantee { flavor: f, team: t, guaranteed, requested } => format!(
                "{}: non-preemptible work runs only within the guarantee, and team {}{} is guaranteed {guaranteed}, \
                 not {requested}",
                flavor(*f),
                team(*t),
                if s.has_child_teams(*t) { "'s own work (its guarantee less its teams')" } else { "" }
            ),
            Self::NoClusterHolds { flavor: f, task_gpus, largest_node_gpus, .. }
                if *task_gpus > f64::from(*largest_node_gpus) =>
            {
                format!(
                    "{}: a task asks for {task_gpus} GPUs, and the largest node the placement allows has \
                     {largest_node_gpus}",
                    flavor(*f)
                )
            }
            Self::NoClusterHolds { flavor: f, most_tasks: 0, .. } => format!(
                "{}: a task fits no node the placement allows, even an empty one (it asks for more CPU cores or \
                 memory than any has)",
                flavor(*f)
            ),
            Self::NoClusterHolds { flavor: f, tasks, task_gpus, most_tasks, .. } => format!(
                "{}: {tasks} tasks of {task_gpus} {}, but even empty no allowed cluster (or required topology \
                 block) holds more than {most_tasks} of them",
                flavor(*f),
                if *task_gpus == 1.0 { "GPU" } else { "GPUs" }
            ),
            Self::NoNodes { flavor: f } => format!("{}: no cluster the placement allows has such nodes", flavor(*f)),
            Self::NotCapable { flavor: f, missing } => {
                format!("{}: the clusters with such nodes {missing}", flavor(*f))
            }
        }
    }

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

/// Nodes alike for this purpose, counted: what "could it ever fit" reads, once per cycle
/// (or per read of the door check), so the test costs per pending workload the number of
/// node shapes, not of nodes. With them, each team's own guarantee, which bounds what its
/// non-preemptible work may ask for.
pub struct Shapes {
    own_quota: OwnQuota,
    /// Alike in cluster, flavor, topology block and size: for gangs that require a block.
    by_block: Vec<Shape>,
    /// Alike in cluster, flavor and size, whatever their block: for all other work (a site
    /// with a block per 16 nodes has thousands of blocks and a handful of these).
    by_size: Vec<Shape>,
}

/// Alike nodes: of one flavor and cluster (and block, in `Shapes::by_block`), and of one
/// size.
struct Shape {
    /// One of them, with no GPU held by others (what could ever be free).
    node: Node,
    count: u32,
}

impl Shapes {
    pub fn of(s: &Snapshot) -> Self {
        type Key<'k> = (FlavorIx, ClusterIx, Option<&'k str>, u32, u32, u64);
        let mut by_block: BTreeMap<Key<'_>, Shape> = BTreeMap::new();
        for n in &s.nodes {
            let key = (n.flavor, n.cluster, n.block.as_deref(), n.gpus, n.cpus_milli, n.memory_mib);
            let shape = by_block.entry(key).or_insert_with(|| Shape {
                node: Node { unavailable_gpus: 0, cordoned: false, ..n.clone() },
                count: 0,
            });
            shape.count += 1;
        }
        let mut by_size: BTreeMap<Key<'_>, Shape> = BTreeMap::new();
        for shape in by_block.values() {
            let n = &shape.node;
            let key = (n.flavor, n.cluster, None, n.gpus, n.cpus_milli, n.memory_mib);
            let alike =
                by_size.entry(key).or_insert_with(|| Shape { node: Node { block: None, ..n.clone() }, count: 0 });
            alike.count += shape.count;
        }
        Self {
            own_quota: OwnQuota::of(s),
            by_block: by_block.into_values().collect(),
            by_size: by_size.into_values().collect(),
        }
    }
}

/// For each pending workload, why it is impossible in each of its flavors where it is
/// (empty when it is possible in all).
pub fn impossible(s: &Snapshot, ancestors: &[Vec<TeamIx>]) -> Vec<Vec<Impossible>> {
    let shapes = Shapes::of(s);
    s.pending.iter().map(|p| impossible_for(s, &shapes, ancestors, p)).collect()
}

/// Why `p` (of a team of `s`, pending or not) is impossible in each of its flavors where it
/// is; `shapes` are `s`'s.
pub fn impossible_for(s: &Snapshot, shapes: &Shapes, ancestors: &[Vec<TeamIx>], p: &Pending) -> Vec<Impossible> {
    p.flavors.iter().filter_map(|&f| impossible_in(s, shapes, ancestors, p, f)).collect()
}

/// Why `p` can never run in flavor `f`, if it cannot.
fn impossible_in(
    s: &Snapshot,
    shapes: &Shapes,
    ancestors: &[Vec<TeamIx>],
    p: &Pending,
    f: FlavorIx,
) -> Option<Impossible> {
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
    let guaranteed = shapes.own_quota.guaranteed(p.team, f);
    if !p.preemptible && requested > guaranteed {
        return Some(Impossible::AboveGuarantee {
            flavor: f,
            team: p.team,
            guaranteed: gpus(guaranteed),
            requested: gpus(requested),
        });
    }
    // Tasks each allowed cluster (or topology block, when required) could hold, empty.
    let mut room: BTreeMap<(ClusterIx, Option<&str>), u64> = BTreeMap::new();
    let mut largest_node_gpus = 0;
    let mut missing = None;
    let required = p.topology == berth_core::workload::TopologyPolicy::Required;
    for shape in if required { &shapes.by_block } else { &shapes.by_size } {
        let node = &shape.node;
        let cluster = &s.clusters[node.cluster];
        if node.flavor != f || !p.placement_allows(cluster) {
            continue;
        }
        if let Some(lacks) = p.missing_capability(cluster) {
            missing.get_or_insert(lacks);
            continue;
        }
        let tasks = NodeState::new(node).capacity_when_empty(&p.tasks, node);
        largest_node_gpus = largest_node_gpus.max(node.gpus);
        let block = node.block.as_deref();
        if required && block.is_none() {
            // Without a block, a node is a block of its own.
            let entry = room.entry((node.cluster, Some(node.name.as_str()))).or_default();
            *entry = (*entry).max(u64::from(tasks));
        } else {
            let key = (node.cluster, if required { block } else { None });
            *room.entry(key).or_default() += u64::from(tasks) * u64::from(shape.count);
        }
    }
    if room.is_empty() {
        return Some(match missing {
            Some(lacks) => Impossible::NotCapable { flavor: f, missing: lacks.to_owned() },
            None => Impossible::NoNodes { flavor: f },
        });
    }
    let most_tasks = u32::try_from(room.values().copied().max().unwrap_or(0)).unwrap_or(u32::MAX);
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
