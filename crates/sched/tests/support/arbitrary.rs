//! Random snapshots as proptest strategies, so that a failing case shrinks to a small one.
//!
//! They cover the configurations sites have and earlier generators missed: deep team
//! trees (a chain of departments), limits equal to guarantees, shapes no node can hold
//! (too many GPUs, CPU cores or memory per task), nodes that run out of CPU or memory
//! before GPUs, and clusters of every backend kind.

use std::collections::BTreeMap;

use berth_core::cluster::{ClusterKind, Packing};
use berth_core::workload::{FlavorPolicy, TopologyPolicy, WorkloadKind};
use berth_sched::nodes::{node_states, place};
use berth_sched::snapshot::{
    BudgetStop, Cluster, Node, ONE_GPU, Pending, Quota, Resources, Running, Snapshot, TaskPlacement, Team,
};
use proptest::prelude::*;
use proptest::sample::{Index, select};

/// A team's parent: none, the team made just before it (so chains make deep trees), or
/// any earlier team.
#[derive(Debug, Clone)]
enum Parent {
    Root,
    Previous,
    Earlier(Index),
}

#[derive(Debug, Clone)]
enum Limit {
    None,
    /// The department may use what it bought, and no more.
    EqualsGuarantee,
    Above(u32),
}

fn quota() -> impl Strategy<Value = Quota> {
    let limit =
        prop_oneof![5 => Just(Limit::None), 3 => Just(Limit::EqualsGuarantee), 2 => (0u32..17).prop_map(Limit::Above)];
    (select(vec![0, 0, 2, 4, 8, 16]), limit, 0u32..4).prop_map(|(guaranteed, limit, weight)| Quota {
        guaranteed,
        limit: match limit {
            Limit::None => None,
            Limit::EqualsGuarantee => Some(guaranteed),
            Limit::Above(extra) => Some(guaranteed + extra),
        },
        weight,
    })
}

/// A used-up budget, now and then: (flavor 0 or 1, or all; stops new work, else
/// borrowing; already reset).
type Stop = Option<(Option<usize>, bool, bool)>;

/// Recent GPU-hours per flavor, for a team whose tree shares over time (1 in 3).
type Recent = Option<Vec<f64>>;

fn team() -> impl Strategy<Value = (Parent, Vec<Quota>, Stop, Recent)> {
    let parent = prop_oneof![4 => Just(Parent::Root), 3 => Just(Parent::Previous), 3 => any::<Index>().prop_map(Parent::Earlier)];
    let stop = prop_oneof![6 => Just(None), 1 => (proptest::option::of(0usize..2), any::<bool>(), any::<bool>()).prop_map(Some)];
    let recent = prop_oneof![2 => Just(None), 1 => proptest::collection::vec(0u32..400, 2).prop_map(|h| Some(h.into_iter().map(f64::from).collect()))];
    (parent, proptest::collection::vec(quota(), 2), stop, recent)
}

/// What each task needs: mostly ordinary, sometimes more than any node has.
fn resources() -> impl Strategy<Value = Resources> {
    let heavy = (select(vec![8_000, 16_000, 48_000, 96_000]), select(vec![32_768, 131_072, 600_000]));
    let needs = prop_oneof![8 => Just((1_000, 1_024)), 2 => heavy];
    let count = prop_oneof![9 => 1u32..4, 1 => 4u32..9];
    (count, select(vec![25, 50, ONE_GPU, ONE_GPU, 2 * ONE_GPU, 4 * ONE_GPU, 8 * ONE_GPU, 16 * ONE_GPU]), needs)
        .prop_map(|(count, gpus, (cpus_milli, memory_mib))| Resources { count, gpus, cpus_milli, memory_mib })
}

#[derive(Debug, Clone)]
struct NodeSpec {
    flavor: Index,
    gpus: u32,
    unavailable: bool,
    cpus_milli: u32,
    memory_mib: u64,
    block: Option<&'static str>,
    cordoned: bool,
}

fn node() -> impl Strategy<Value = NodeSpec> {
    (
        any::<Index>(),
        select(vec![1, 2, 4, 8, 8]),
        prop::bool::weighted(0.1),
        select(vec![8_000, 32_000, 64_000, 64_000]),
        select(vec![65_536, 262_144, 524_288]),
        select(vec![None, Some("x"), Some("y")]),
        prop::bool::weighted(0.05),
    )
        .prop_map(|(flavor, gpus, unavailable, cpus_milli, memory_mib, block, cordoned)| NodeSpec {
            flavor,
            gpus,
            unavailable,
            cpus_milli,
            memory_mib,
            block,
            cordoned,
        })
}

/// A cluster: kind, tier label, cordoned, packing, nodes.
type ClusterSpec = (ClusterKind, Option<&'static str>, bool, Packing, Vec<NodeSpec>);

fn cluster() -> impl Strategy<Value = ClusterSpec> {
    (
        select(vec![ClusterKind::Slurm, ClusterKind::Kubernetes, ClusterKind::Sim]),
        select(vec![None, Some("reservation"), Some("on-demand"), Some("spot")]),
        prop::bool::weighted(0.1),
        select(vec![Packing::BestFit, Packing::BestFit, Packing::Fragmentation]),
        proptest::collection::vec(node(), 1..6),
    )
}

#[derive(Debug, Clone)]
struct RunningSpec {
    team: Index,
    node: Index,
    priority: i32,
    preemptible: bool,
    borrowed: bool,
    age: i64,
    /// Its min runtime, if it has one (still running within it where above `age`).
    min_runtime: Option<i64>,
    preempting: bool,
    tasks: Resources,
}

fn running() -> impl Strategy<Value = RunningSpec> {
    (
        (any::<Index>(), any::<Index>(), -2i32..3),
        (prop::bool::weighted(0.8), any::<bool>(), 0i64..10_000, prop::bool::weighted(0.1)),
        (resources(), prop::option::weighted(0.25, 0i64..20_000)),
    )
        .prop_map(|((team, node, priority), (preemptible, borrowed, age, preempting), (tasks, min_runtime))| {
            RunningSpec { team, node, priority, preemptible, borrowed, age, min_runtime, preempting, tasks }
        })
}

#[derive(Debug, Clone)]
struct PendingSpec {
    team: Index,
    kind: WorkloadKind,
    priority: i32,
    preemptible: bool,
    age: i64,
    /// Bit f: flavor f is acceptable (none set: the first).
    flavors: u8,
    reversed: bool,
    selector: Option<&'static str>,
    backend: Option<ClusterKind>,
    has_image: bool,
    has_command: bool,
    topology: TopologyPolicy,
    flavor_policy: FlavorPolicy,
    tasks: Resources,
}

fn pending() -> impl Strategy<Value = PendingSpec> {
    let selector = prop_oneof![17 => Just(None), 3 => select(vec!["reservation", "spot"]).prop_map(Some)];
    let backend = prop_oneof![17 => Just(None), 3 => select(vec![ClusterKind::Slurm, ClusterKind::Sim]).prop_map(Some)];
    (
        (any::<Index>(), select(vec![WorkloadKind::Training, WorkloadKind::Batch, WorkloadKind::Inference]), -2i32..3),
        (prop::bool::weighted(0.8), 0i64..7_200, 0u8..4, any::<bool>()),
        (selector, backend, prop::bool::weighted(0.8), prop::bool::weighted(0.9)),
        (
            select(vec![TopologyPolicy::None, TopologyPolicy::Preferred, TopologyPolicy::Required]),
            select(vec![FlavorPolicy::Ordered, FlavorPolicy::BestFit]),
        ),
        resources(),
    )
        .prop_map(
            |(
                (team, kind, priority),
                (preemptible, age, flavors, reversed),
                (selector, backend, has_image, has_command),
                (topology, flavor_policy),
                tasks,
            )| PendingSpec {
                team,
                kind,
                priority,
                preemptible,
                age,
                flavors,
                reversed,
                selector,
                backend,
                has_image,
                has_command,
                topology,
                flavor_policy,
                tasks,
            },
        )
}

/// A valid snapshot: 1–2 flavors, 1–8 teams, 1–3 clusters of 1–5 nodes, up to 14
/// running workloads placed on real room (one that does not fit is left out), and up
/// to 16 pending ones.
pub fn snapshots() -> impl Strategy<Value = Snapshot> {
    (
        1usize..3,
        proptest::collection::vec(team(), 1..9),
        proptest::collection::vec(cluster(), 1..4),
        proptest::collection::vec(running(), 0..15),
        proptest::collection::vec(pending(), 0..17),
    )
        .prop_map(|(flavors, teams, clusters, running, pending)| build(flavors, &teams, &clusters, &running, &pending))
}

fn build(
    flavors: usize,
    teams: &[(Parent, Vec<Quota>, Stop, Recent)],
    clusters: &[ClusterSpec],
    running: &[RunningSpec],
    pending: &[PendingSpec],
) -> Snapshot {
    let mut s = Snapshot {
        now: 100_000,
        starvation_after_seconds: 3_600,
        flavors: (0..flavors).map(|f| format!("f{f}")).collect(),
        ..Snapshot::default()
    };
    for (t, (parent, quotas, stop, recent)) in teams.iter().enumerate() {
        let parent = match parent {
            _ if t == 0 => None,
            Parent::Root => None,
            Parent::Previous => Some(t - 1),
            Parent::Earlier(i) => Some(i.index(t)),
        };
        let budget_stops = stop
            .iter()
            .filter(|(f, _, _)| f.is_none_or(|f| f < flavors))
            .map(|&(flavor, stop_new, reset)| BudgetStop {
                budget: format!("b{t}"),
                flavor,
                stop_new,
                resets_at: if reset { s.now } else { s.now + 86_400 },
            })
            .collect();
        s.teams.push(Team {
            name: format!("t{t}"),
            parent,
            quotas: quotas[..flavors].to_vec(),
            budget_stops,
            min_runtime_seconds: None,
            recent_usage: recent.as_ref().map(|r| r[..flavors].to_vec()),
        });
    }
    for (c, (kind, tier, cordoned, packing, nodes)) in clusters.iter().enumerate() {
        let labels: BTreeMap<String, String> = tier.iter().map(|t| ("tier".to_string(), t.to_string())).collect();
        s.clusters.push(Cluster {
            name: format!("c{c}"),
            kind: *kind,
            labels,
            cordoned: *cordoned,
            fractional_gpus: None,
            packing: *packing,
        });
        for n in nodes {
            s.nodes.push(Node {
                name: format!("n{}", s.nodes.len()),
                cluster: c,
                flavor: n.flavor.index(flavors),
                gpus: n.gpus,
                unavailable_gpus: u32::from(n.unavailable),
                cpus_milli: n.cpus_milli,
                memory_mib: n.memory_mib,
                block: n.block.map(Into::into),
                cordoned: n.cordoned,
            });
        }
    }
    let mut states = node_states(&s).expect("nodes are valid");
    for (i, r) in running.iter().enumerate() {
        let node = r.node.index(s.nodes.len());
        let (cluster, flavor) = (s.nodes[node].cluster, s.nodes[node].flavor);
        let pool: Vec<usize> =
            (0..s.nodes.len()).filter(|&n| s.nodes[n].cluster == cluster && s.nodes[n].flavor == flavor).collect();
        let Some(placed) = place(&mut states, &pool, &r.tasks, None) else { continue };
        s.running.push(Running {
            id: format!("r{i}"),
            team: r.team.index(s.teams.len()),
            priority: r.priority,
            preemptible: r.preemptible,
            borrowed: r.borrowed,
            started_at: s.now - r.age,
            protected_until: r.min_runtime.map_or(0, |m| s.now - r.age + m),
            preempting: r.preempting,
            cluster,
            flavor,
            tasks: r.tasks,
            placement: placed.tasks.iter().map(|&(node, device)| TaskPlacement { node, device }).collect(),
        });
    }
    for (i, p) in pending.iter().enumerate() {
        let mut wanted: Vec<usize> = (0..flavors).filter(|f| p.flavors & (1 << f) != 0).collect();
        if wanted.is_empty() {
            wanted.push(0);
        }
        if p.reversed {
            wanted.reverse();
        }
        s.pending.push(Pending {
            id: format!("p{i}"),
            team: p.team.index(s.teams.len()),
            kind: p.kind,
            priority: p.priority,
            preemptible: p.preemptible,
            submitted_at: s.now - p.age,
            flavors: wanted,
            tasks: p.tasks,
            topology: p.topology,
            cluster_selector: p.selector.iter().map(|t| ("tier".to_string(), t.to_string())).collect(),
            backend_kinds: p.backend.into_iter().collect(),
            flavor_policy: p.flavor_policy,
            has_image: p.has_image,
            has_command: p.has_command,
            preempted_for: None,
        });
    }
    s
}
