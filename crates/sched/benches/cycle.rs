//! One full scheduling cycle (validation, node states, fair share, ordering, placement,
//! preemption, reasons), single thread, on large synthetic snapshots:
//!
//! - `small`: 5,000 pending, 1,000 nodes (8,000 GPUs), 100 teams, 4 clusters;
//! - `large`: 50,000 pending, 10,000 nodes (80,000 GPUs), 1,000 teams, 50 clusters;
//! - `stream`: a large site while work streams in: 350 pending on 55,000 nodes (440,000
//!   GPUs) of 3 clusters in topology blocks of 16 nodes, about 100,000 running, 1,000 teams
//!   (the nearest to `bench/controllers scale`, whose simulated clusters have no blocks);
//! - `armada`: Armada's published shape, 32,000 pending single-GPU jobs on 1,000 empty
//!   nodes (8,000 GPUs) of one cluster, 10 teams sharing it evenly (Armada reports 606 ms).
//!
//! Clusters start about 70 % full with running work (some of it borrowed); pending work is
//! mostly single GPUs, with fractions, multi-GPU tasks and multi-node gangs, two flavors,
//! priorities, topology wishes and placement constraints. Run: `cargo bench -p berth-sched`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use berth_core::cluster::{ClusterKind, Packing};
use berth_core::workload::{TopologyPolicy, WorkloadKind};
use berth_sched::schedule;
use berth_sched::snapshot::{
    Cluster, Node, ONE_GPU, Pending, Quota, Resources, Running, Snapshot, TaskPlacement, Team,
};

#[path = "../tests/support/rng.rs"]
mod rng;

use rng::Rng;

fn main() {
    for (name, s) in [("small", &*SMALL), ("large", &*LARGE), ("stream", &*STREAM), ("armada", &*ARMADA)] {
        let plan = schedule(s).expect("valid snapshot");
        println!(
            "{name}: {} pending, {} nodes, {} teams, {} clusters, {} running → {} admitted, {} preempted, {} waiting",
            s.pending.len(),
            s.nodes.len(),
            s.teams.len(),
            s.clusters.len(),
            s.running.len(),
            plan.admissions.len(),
            plan.preemptions.len(),
            plan.waiting.len()
        );
    }
    divan::main();
}

static SMALL: LazyLock<Snapshot> = LazyLock::new(|| synthetic(5_000, 1_000, 100, 4, 1));
static LARGE: LazyLock<Snapshot> = LazyLock::new(|| synthetic(50_000, 10_000, 1_000, 50, 2));

static STREAM: LazyLock<Snapshot> = LazyLock::new(|| synthetic(350, 55_000, 1_000, 3, 4));
static ARMADA: LazyLock<Snapshot> = LazyLock::new(armada);

#[divan::bench(sample_count = 10, sample_size = 1)]
fn armada_32k_single_gpu_pending_1k_empty_nodes() -> berth_sched::Plan {
    schedule(divan::black_box(&ARMADA)).unwrap()
}

#[divan::bench(sample_count = 20, sample_size = 1)]
fn small_5k_pending_1k_nodes_100_teams() -> berth_sched::Plan {
    schedule(divan::black_box(&SMALL)).unwrap()
}

#[divan::bench(sample_count = 10, sample_size = 1)]
fn large_50k_pending_10k_nodes_1k_teams_50_clusters() -> berth_sched::Plan {
    schedule(divan::black_box(&LARGE)).unwrap()
}

#[divan::bench(sample_count = 10, sample_size = 1)]
fn stream_350_pending_100k_running_55k_nodes_1k_teams() -> berth_sched::Plan {
    schedule(divan::black_box(&STREAM)).unwrap()
}

/// What the controllers add to each cycle before it: what runs judged borrowed or
/// in-quota against the guarantees as they stand, on `stream`'s 100,000 running.
#[divan::bench(sample_count = 10, sample_size = 1)]
fn settle_borrowed_100k_running_1k_teams(bencher: divan::Bencher) {
    bencher.with_inputs(|| STREAM.clone()).bench_local_values(|mut s| {
        s.settle_borrowed();
        s
    });
}

/// 32,000 single-GPU jobs of 10 teams (each guaranteed a tenth) waiting for 1,000 empty
/// 8-GPU nodes of one cluster.
fn armada() -> Snapshot {
    let mut rng = Rng(3);
    let mut s = Snapshot {
        now: 1_000_000,
        starvation_after_seconds: 6 * 3600,
        flavors: vec!["h100".into()],
        ..Snapshot::default()
    };
    let teams = 10;
    for t in 0..teams {
        s.teams.push(Team {
            name: format!("team-{t}"),
            parent: None,
            quotas: vec![Quota { guaranteed: 800, limit: None, weight: 1 }],
            budget_stops: Vec::new(),
            recent_usage: None,
            min_runtime_seconds: None,
        });
    }
    s.clusters.push(Cluster {
        name: "cluster-0".into(),
        kind: ClusterKind::Kubernetes,
        labels: BTreeMap::new(),
        cordoned: false,
        fractional_gpus: None,
        packing: Packing::BestFit,
    });
    for n in 0..1_000 {
        s.nodes.push(Node {
            name: format!("node-{n}"),
            cluster: 0,
            flavor: 0,
            gpus: 8,
            unavailable_gpus: 0,
            cpus_milli: 128_000,
            memory_mib: 1 << 20,
            block: None,
            cordoned: false,
        });
    }
    for i in 0..32_000 {
        s.pending.push(Pending {
            id: format!("pending-{i}"),
            team: rng.below(teams as u64) as usize,
            kind: WorkloadKind::Training,
            priority: 0,
            preemptible: true,
            submitted_at: s.now - rng.below(3600) as i64,
            flavors: vec![0],
            tasks: Resources { count: 1, gpus: ONE_GPU, cpus_milli: 4_000, memory_mib: 32_768 },
            topology: TopologyPolicy::None,
            cluster_selector: BTreeMap::new(),
            backend_kinds: Vec::new(),
            flavor_policy: Default::default(),
            has_image: true,
            has_command: true,
            preempted_for: None,
        });
    }
    s
}

fn synthetic(pending: usize, nodes: usize, teams: usize, clusters: usize, seed: u64) -> Snapshot {
    let mut rng = Rng(seed);
    let flavors = 2;
    let mut s = Snapshot {
        now: 1_000_000,
        starvation_after_seconds: 6 * 3600,
        flavors: vec!["h100".into(), "a100".into()],
        ..Snapshot::default()
    };
    // Ten departments, the other teams below them; guarantees add up to about 80 % of
    // capacity, split evenly, with a limit on every third team.
    let capacity_per_flavor = (nodes * 8 / flavors) as u32;
    let departments = 10;
    let leaves = teams - departments;
    for t in 0..teams {
        let leaf = t >= departments;
        let quotas = (0..flavors)
            .map(|_| {
                let guaranteed =
                    if leaf { capacity_per_flavor * 8 / 10 / leaves as u32 } else { capacity_per_flavor * 8 / 100 };
                let limit = (leaf && t % 3 == 0).then_some(guaranteed * 4 + 8);
                Quota { guaranteed, limit, weight: 1 + (t % 3) as u32 }
            })
            .collect();
        let parent = leaf.then_some(t % departments);
        s.teams.push(Team {
            name: format!("team-{t}"),
            parent,
            quotas,
            budget_stops: Vec::new(),
            recent_usage: None,
            min_runtime_seconds: None,
        });
    }
    let tiers = ["reservation", "on-demand", "spot"];
    let kinds = [ClusterKind::Slurm, ClusterKind::Kubernetes, ClusterKind::Sim];
    for c in 0..clusters {
        let labels = BTreeMap::from([("tier".to_string(), tiers[c % 3].to_string())]);
        s.clusters.push(Cluster {
            name: format!("cluster-{c}"),
            kind: kinds[c % 3],
            labels,
            cordoned: false,
            fractional_gpus: None,
            packing: Packing::BestFit,
        });
    }
    for n in 0..nodes {
        let cluster = n % clusters;
        s.nodes.push(Node {
            name: format!("node-{n}"),
            cluster,
            flavor: (n / clusters) % flavors,
            gpus: 8,
            unavailable_gpus: 0,
            cpus_milli: 128_000,
            memory_mib: 1 << 20,
            block: Some(format!("block-{}", n / (clusters * 16))),
            cordoned: false,
        });
    }
    // Fill nodes about 70 % with whole-GPU work of random teams.
    let mut used = vec![0u32; teams * flavors];
    for n in 0..nodes {
        let node = &s.nodes[n];
        let mut free = 8;
        while free > 2 && rng.chance(75) {
            let gpus = [1, 1, 2, 4][rng.below(4) as usize].min(free);
            free -= gpus;
            let team = departments + rng.below(leaves as u64) as usize;
            let i = team * flavors + node.flavor;
            used[i] += gpus;
            s.running.push(Running {
                id: format!("run-{}", s.running.len()),
                team,
                priority: rng.below(3) as i32,
                preemptible: rng.chance(90),
                borrowed: used[i] > s.teams[team].quotas[node.flavor].guaranteed,
                started_at: s.now - rng.below(86_400) as i64,
                protected_until: 0,
                preempting: false,
                cluster: node.cluster,
                flavor: node.flavor,
                tasks: Resources { count: 1, gpus: gpus * ONE_GPU, cpus_milli: 4_000, memory_mib: 32_768 },
                placement: vec![TaskPlacement { node: n, device: None }],
            });
        }
    }
    for i in 0..pending {
        let (count, gpus) = match rng.below(100) {
            0..60 => (1, ONE_GPU),
            60..70 => (1, [25, 50][rng.below(2) as usize]),
            70..80 => (1, 2 * ONE_GPU),
            80..88 => (1, 4 * ONE_GPU),
            88..95 => (1, 8 * ONE_GPU),
            95..98 => (2, 8 * ONE_GPU),
            _ => (4, 8 * ONE_GPU),
        };
        let flavors = match rng.below(3) {
            0 => vec![0],
            1 => vec![1],
            _ => vec![0, 1],
        };
        let mut cluster_selector = BTreeMap::new();
        if rng.chance(10) {
            cluster_selector.insert("tier".into(), tiers[rng.below(3) as usize].into());
        }
        s.pending.push(Pending {
            id: format!("pending-{i}"),
            team: departments + rng.below(leaves as u64) as usize,
            kind: if rng.chance(80) { WorkloadKind::Training } else { WorkloadKind::Inference },
            priority: rng.below(5) as i32 - 2,
            preemptible: rng.chance(85),
            submitted_at: s.now - rng.below(12 * 3600) as i64,
            flavors,
            tasks: Resources { count, gpus, cpus_milli: 4_000, memory_mib: 32_768 },
            topology: if count > 1 && rng.chance(50) { TopologyPolicy::Preferred } else { TopologyPolicy::None },
            cluster_selector,
            backend_kinds: Vec::new(),
            flavor_policy: Default::default(),
            has_image: true,
            has_command: true,
            preempted_for: None,
        });
    }
    s
}
