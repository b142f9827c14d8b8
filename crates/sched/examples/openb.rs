//! Packs Alibaba's GPU-sharing trace (openb; Weng et al., "Beware of Fragmentation",
//! USENIX ATC'23, CC-BY-4.0) onto the trace's 1,213 GPU nodes with Berth's scheduler, and
//! with first-fit and best-fit run by the same harness. Prints, per pod list, the GPUs
//! allocated and left unallocated once the GPUs asked for reach the cluster's.
//!
//! ```text
//! cargo run --release -p berth-sched --example openb -- [--traces ../shared/traces/alibaba-openb]
//!     [--lists default,gpushare40,multigpu30] [--load 1.0]
//! ```
//!
//! Model (the paper's saturation experiment, without its random sampling):
//! - Pods arrive one at a time in trace order and never leave. The list is repeated from its
//!   start while the GPUs asked for are below the cluster's.
//! - A pod that does not fit is refused and not retried.
//! - Each arrival is one scheduling cycle of Berth's: one team guaranteed every GPU, one
//!   cluster that shares GPUs, one flavor per GPU model, and every pod accepting every model
//!   (no pod of these lists names one), in the flavors' name order: once as that order of
//!   preference (`flavor_policy: ordered`), once leaving the choice to best fit
//!   (`best_fit`); and `best_fit` on a cluster with `packing: fragmentation` (Berth's FGD),
//!   packing for the shapes of the pods placed and refused so far, and once more with the
//!   pod list itself as the site's history (`recent_demand`) besides.
//! - A pod's `gpu_milli` is rounded up to Berth's hundredths of a GPU, for all three
//!   policies alike. CPU and memory count on every node.
//! - The baselines:
//!   - First-fit takes the first node (in the list's order) with room, and on it the first
//!     GPU.
//!   - Best-fit takes the node that is left with the least free GPU (then CPU), and on it
//!     the fullest GPU that fits.
//!
//!   - FGD (harness) is the paper's fragmentation gradient descent, written here to see what
//!     it would gain in this model: the node and GPU whose choice grows the expected
//!     fragment least, for the list's own distribution of requests (its 40 most frequent
//!     GPU, CPU and memory shapes; a node a shape cannot use for lack of CPU or memory is
//!     all fragment to it), with best fit breaking ties. It is not Berth's.
//!
//! "Unallocated" is capacity minus allocated, counted when the arrivals' GPUs reach
//! capacity (`--load 1.3`: 130 % of it). "Stranded" is the part of it on nodes whose CPU or
//! memory left is below what any GPU pod of the list asks.

use std::collections::BTreeMap;
use std::process::ExitCode;

use berth_core::cluster::{ClusterKind, Packing};
use berth_core::workload::{FlavorPolicy, TopologyPolicy, WorkloadKind};
use berth_sched::schedule;
use berth_sched::snapshot::{
    Cluster, Node, ONE_GPU, Pending, Quota, Resources, Running, Snapshot, TaskPlacement, Team,
};

struct GpuNode {
    model: String,
    gpus: u32,
    cpus_milli: u32,
    memory_mib: u64,
}

#[derive(Clone, Copy)]
struct Pod {
    cpus_milli: u32,
    memory_mib: u64,
    /// Whole GPUs (each `ONE_GPU`), or one shared GPU's hundredths, or none.
    gpus: u32,
}

impl Pod {
    fn is_fractional(self) -> bool {
        !self.gpus.is_multiple_of(ONE_GPU)
    }
}

fn main() -> ExitCode {
    let mut traces = "../shared/traces/alibaba-openb".to_owned();
    let mut lists = vec!["default".to_owned(), "gpushare40".to_owned(), "multigpu30".to_owned()];
    let mut load = 1.0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--traces", Some(v)) => traces = v,
            ("--lists", Some(v)) => lists = v.split(',').map(str::to_owned).collect(),
            ("--load", Some(v)) if v.parse::<f64>().is_ok_and(|l| l > 0.0) => load = v.parse().unwrap_or(1.0),
            _ => {
                eprintln!("usage: openb [--traces DIR] [--lists default,gpushare40,multigpu30] [--load 1.0]");
                return ExitCode::from(2);
            }
        }
    }
    let nodes = read_nodes(&format!("{traces}/openb_node_list_gpu_node.csv"));
    let capacity: u32 = nodes.iter().map(|n| n.gpus * ONE_GPU).sum();
    println!(
        "openb: {} GPU nodes, {} GPUs; pods in trace order until their GPUs reach {:.0} % of capacity",
        nodes.len(),
        capacity / ONE_GPU,
        load * 100.0
    );
    println!(
        "| pod list | policy | pods placed | pods refused | GPUs allocated | GPUs unallocated | of which stranded by CPU or memory | vs better baseline |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for list in &lists {
        let pods = read_pods(&format!("{traces}/openb_pod_list_{list}.csv"));
        let arrivals = arrivals(&pods, (f64::from(capacity) * load) as u32);
        let results = [
            ("first-fit", baseline(&nodes, &arrivals, false)),
            ("best-fit", baseline(&nodes, &arrivals, true)),
            ("berth, flavors ordered", berth(&nodes, &arrivals, FlavorPolicy::Ordered, Packing::BestFit, &[])),
            ("berth, flavors best_fit", berth(&nodes, &arrivals, FlavorPolicy::BestFit, Packing::BestFit, &[])),
            (
                "berth, best_fit, packing: fragmentation",
                berth(&nodes, &arrivals, FlavorPolicy::BestFit, Packing::Fragmentation, &[]),
            ),
            (
                "berth, best_fit, packing: fragmentation, history",
                berth(&nodes, &arrivals, FlavorPolicy::BestFit, Packing::Fragmentation, &pods),
            ),
            ("FGD (harness)", fgd(&nodes, &arrivals, &shapes(&pods))),
        ];
        let best_baseline = results[..2].iter().map(|(_, r)| capacity - r.allocated).min().unwrap_or(0);
        for (policy, r) in &results {
            let unallocated = capacity - r.allocated;
            let versus = if !matches!(*policy, "first-fit" | "best-fit") {
                format!("{:+.1} %", (f64::from(unallocated) / f64::from(best_baseline.max(1)) - 1.0) * 100.0)
            } else {
                String::new()
            };
            println!(
                "| {list} | {policy} | {} | {} | {:.1} ({:.1} %) | {:.1} | {} | {versus} |",
                r.placed,
                r.refused,
                f64::from(r.allocated) / f64::from(ONE_GPU),
                f64::from(r.allocated) / f64::from(capacity) * 100.0,
                f64::from(unallocated) / f64::from(ONE_GPU),
                r.stranded.map_or_else(|| "—".to_owned(), |s| format!("{:.1}", f64::from(s) / f64::from(ONE_GPU))),
            );
        }
    }
    ExitCode::SUCCESS
}

struct Packed {
    placed: usize,
    refused: usize,
    /// Hundredths of a GPU.
    allocated: u32,
    /// Unallocated hundredths on nodes whose CPU or memory left is below what any pod of
    /// the list that asks for GPUs needs (`None`: not counted).
    stranded: Option<u32>,
}

/// The free GPU hundredths on nodes that no GPU pod of `pods` could use for lack of CPU or
/// memory.
fn stranded(free: &Free, pods: &[Pod]) -> u32 {
    let gpu_pods = || pods.iter().filter(|p| p.gpus > 0);
    let cpus = gpu_pods().map(|p| p.cpus_milli).min().unwrap_or(0);
    let memory = gpu_pods().map(|p| p.memory_mib).min().unwrap_or(0);
    free.iter().filter(|(_, c, m)| *c < cpus || *m < memory).map(|(g, _, _)| g.iter().sum::<u32>()).sum()
}

/// The pods in trace order, the list repeated, until their GPUs reach `capacity`.
fn arrivals(pods: &[Pod], capacity: u32) -> Vec<Pod> {
    let mut out = Vec::new();
    let mut asked = 0;
    for pod in pods.iter().cycle() {
        if asked >= capacity {
            break;
        }
        asked += pod.gpus;
        out.push(*pod);
    }
    out
}

/// Per node: free hundredths of each GPU, CPU and memory.
type Free = Vec<(Vec<u32>, u32, u64)>;

/// Places the arrivals one by one where `choose` says (a node, and the GPUs it takes), on
/// the nodes as the baselines see them.
fn pack(
    nodes: &[GpuNode],
    arrivals: &[Pod],
    mut choose: impl FnMut(&Free, &Pod) -> Option<(usize, Vec<usize>)>,
) -> Packed {
    let mut free: Free = nodes.iter().map(|n| (vec![ONE_GPU; n.gpus as usize], n.cpus_milli, n.memory_mib)).collect();
    let mut packed = Packed { placed: 0, refused: 0, allocated: 0, stranded: None };
    for pod in arrivals {
        match choose(&free, pod) {
            Some((i, take)) => {
                let (gpus, cpus, memory) = &mut free[i];
                for d in take {
                    gpus[d] -= if pod.is_fractional() { pod.gpus } else { ONE_GPU };
                }
                *cpus -= pod.cpus_milli;
                *memory -= pod.memory_mib;
                packed.placed += 1;
                packed.allocated += pod.gpus;
            }
            None => packed.refused += 1,
        }
    }
    packed.stranded = Some(stranded(&free, arrivals));
    packed
}

/// First-fit or best-fit over the same nodes.
fn baseline(nodes: &[GpuNode], arrivals: &[Pod], best: bool) -> Packed {
    pack(nodes, arrivals, |free, pod| {
        // For each node that fits: the GPUs it would take, and the best-fit score.
        let mut chosen: Option<(usize, Vec<usize>, (u32, u32))> = None;
        for (i, (gpus, cpus, memory)) in free.iter().enumerate() {
            if *cpus < pod.cpus_milli || *memory < pod.memory_mib {
                continue;
            }
            let take: Vec<usize> = if pod.is_fractional() {
                let fits = gpus.iter().enumerate().filter(|(_, f)| **f >= pod.gpus);
                let pick = if best { fits.min_by_key(|(_, f)| **f) } else { fits.min_by_key(|(d, _)| *d) };
                pick.map(|(d, _)| vec![d]).unwrap_or_default()
            } else {
                gpus.iter()
                    .enumerate()
                    .filter(|(_, f)| **f == ONE_GPU)
                    .map(|(d, _)| d)
                    .take((pod.gpus / ONE_GPU) as usize)
                    .collect()
            };
            let enough =
                if pod.is_fractional() { take.len() == 1 } else { take.len() == (pod.gpus / ONE_GPU) as usize };
            if !enough {
                continue;
            }
            let score = (gpus.iter().sum::<u32>() - pod.gpus, cpus - pod.cpus_milli);
            if chosen.as_ref().is_none_or(|c| best && score < c.2) {
                chosen = Some((i, take, score));
                if !best {
                    break;
                }
            }
        }
        chosen.map(|(i, take, _)| (i, take))
    })
}

/// The 40 most frequent requests (GPU hundredths, CPU, memory) among the pods that ask
/// for GPUs (over 90 % of them), each with its frequency among those 40.
fn shapes(pods: &[Pod]) -> Vec<(Pod, f64)> {
    let mut counts: BTreeMap<(u32, u32, u64), usize> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.gpus > 0) {
        *counts.entry((p.gpus, p.cpus_milli, p.memory_mib)).or_default() += 1;
    }
    let mut top: Vec<((u32, u32, u64), usize)> = counts.into_iter().collect();
    top.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    top.truncate(40);
    let total = top.iter().map(|(_, n)| n).sum::<usize>() as f64;
    top.into_iter()
        .map(|((gpus, cpus_milli, memory_mib), n)| (Pod { cpus_milli, memory_mib, gpus }, n as f64 / total))
        .collect()
}

/// The GPU capacity of a node (free hundredths per GPU, CPU and memory left) that a task
/// `m` cannot use: all of it when the task does not fit (GPUs, CPU or memory), else what is
/// free on GPUs it cannot take (FGD's fragment measure).
fn fragment(free: &[u32], cpus: u32, memory: u64, m: &Pod) -> u32 {
    let total: u32 = free.iter().sum();
    let g = m.gpus;
    if cpus < m.cpus_milli || memory < m.memory_mib {
        total
    } else if g < ONE_GPU {
        if free.iter().any(|&f| f >= g) { free.iter().filter(|&&f| f < g).sum() } else { total }
    } else if free.iter().filter(|&&f| f == ONE_GPU).count() as u32 >= g / ONE_GPU {
        free.iter().filter(|&&f| f < ONE_GPU).sum()
    } else {
        total
    }
}

fn expected_fragment(free: &[u32], cpus: u32, memory: u64, shapes: &[(Pod, f64)]) -> f64 {
    shapes.iter().map(|(m, p)| p * f64::from(fragment(free, cpus, memory, m))).sum()
}

/// Fragmentation gradient descent (Weng et al., ATC'23) in this harness: the node and GPU
/// whose choice grows the expected fragment least, for the pod list's own distribution of
/// requests ([`shapes`]); ties go to best fit.
fn fgd(nodes: &[GpuNode], arrivals: &[Pod], shapes: &[(Pod, f64)]) -> Packed {
    pack(nodes, arrivals, |free, pod| {
        let mut chosen: Option<(usize, Vec<usize>, (f64, u32))> = None;
        for (i, (gpus, cpus, memory)) in free.iter().enumerate() {
            if *cpus < pod.cpus_milli || *memory < pod.memory_mib {
                continue;
            }
            let choices: Vec<Vec<usize>> = if pod.gpus == 0 {
                vec![Vec::new()]
            } else if pod.is_fractional() {
                (0..gpus.len()).filter(|&d| gpus[d] >= pod.gpus).map(|d| vec![d]).collect()
            } else {
                let whole: Vec<usize> = (0..gpus.len()).filter(|&d| gpus[d] == ONE_GPU).collect();
                if whole.len() < (pod.gpus / ONE_GPU) as usize {
                    Vec::new()
                } else {
                    vec![whole[..(pod.gpus / ONE_GPU) as usize].to_vec()]
                }
            };
            let before = expected_fragment(gpus, *cpus, *memory, shapes);
            for take in choices {
                let mut after = gpus.clone();
                for &d in &take {
                    after[d] -= if pod.is_fractional() { pod.gpus } else { ONE_GPU };
                }
                let after_fragment = expected_fragment(&after, cpus - pod.cpus_milli, memory - pod.memory_mib, shapes);
                let score = (after_fragment - before, after.iter().sum::<u32>());
                if chosen
                    .as_ref()
                    .is_none_or(|c| score.0 < c.2.0 - 1e-9 || (score.0 - c.2.0).abs() <= 1e-9 && score.1 < c.2.1)
                {
                    chosen = Some((i, take, score));
                }
            }
        }
        chosen.map(|(i, take, _)| (i, take))
    })
}

/// Berth's scheduler, one cycle per arrival. A refused pod is gone in this model, where
/// Berth would keep it pending: it stays in the snapshot's `recent_demand`, so that
/// `packing: fragmentation` packs for the shapes that arrived, as it would with the pod
/// waiting. `history` is work the site ran before (also `recent_demand`): the pod list
/// itself, for a site whose demand looks like yesterday's, as FGD assumes.
fn berth(
    nodes: &[GpuNode],
    arrivals: &[Pod],
    flavor_policy: FlavorPolicy,
    packing: Packing,
    history: &[Pod],
) -> Packed {
    let mut models: Vec<String> = nodes.iter().map(|n| n.model.clone()).collect();
    models.sort();
    models.dedup();
    let flavor = |model: &str| models.iter().position(|m| m == model).expect("a model");
    let mut s =
        Snapshot { now: 1_000_000, starvation_after_seconds: 6 * 3600, flavors: models.clone(), ..Snapshot::default() };
    let per_flavor: Vec<u32> =
        (0..models.len()).map(|f| nodes.iter().filter(|n| flavor(&n.model) == f).map(|n| n.gpus).sum()).collect();
    s.teams.push(Team {
        name: "openb".into(),
        parent: None,
        quotas: per_flavor.iter().map(|&g| Quota { guaranteed: g, limit: None, weight: 1 }).collect(),
        budget_stops: Vec::new(),
        recent_usage: None,
        min_runtime_seconds: None,
    });
    s.clusters.push(Cluster {
        name: "openb".into(),
        kind: ClusterKind::Sim,
        labels: BTreeMap::new(),
        cordoned: false,
        fractional_gpus: Some(true),
        packing,
    });
    for (i, n) in nodes.iter().enumerate() {
        s.nodes.push(Node {
            name: format!("node-{i}"),
            cluster: 0,
            flavor: flavor(&n.model),
            gpus: n.gpus,
            unavailable_gpus: 0,
            cpus_milli: n.cpus_milli,
            memory_mib: n.memory_mib,
            block: None,
            cordoned: false,
        });
    }
    let every_flavor: Vec<usize> = (0..models.len()).collect();
    s.recent_demand = history
        .iter()
        .map(|p| Resources { count: 1, gpus: p.gpus, cpus_milli: p.cpus_milli, memory_mib: p.memory_mib })
        .collect();
    let mut packed = Packed { placed: 0, refused: 0, allocated: 0, stranded: None };
    for (i, pod) in arrivals.iter().enumerate() {
        let tasks = Resources { count: 1, gpus: pod.gpus, cpus_milli: pod.cpus_milli, memory_mib: pod.memory_mib };
        s.pending = vec![Pending {
            id: format!("pod-{i}"),
            team: 0,
            kind: WorkloadKind::Training,
            priority: 0,
            preemptible: false,
            submitted_at: s.now,
            flavors: every_flavor.clone(),
            tasks,
            topology: TopologyPolicy::None,
            cluster_selector: BTreeMap::new(),
            backend_kinds: Vec::new(),
            flavor_policy,
            has_image: true,
            has_command: true,
            preempted_for: None,
        }];
        let plan = schedule(&s).expect("a valid snapshot");
        match plan.admissions.first() {
            Some(a) => {
                s.running.push(Running {
                    id: format!("pod-{i}"),
                    team: 0,
                    priority: 0,
                    preemptible: false,
                    borrowed: a.borrowed,
                    started_at: s.now,
                    protected_until: 0,
                    preempting: false,
                    cluster: a.cluster,
                    flavor: a.flavor,
                    tasks,
                    placement: a.placement.iter().map(|p| TaskPlacement { node: p.node, device: p.device }).collect(),
                });
                packed.placed += 1;
                packed.allocated += pod.gpus;
            }
            None => {
                packed.refused += 1;
                s.recent_demand.push(tasks);
            }
        }
        s.now += 1;
    }
    packed
}

fn csv(path: &str) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| header.iter().zip(l.split(',')).map(|(k, v)| ((*k).to_owned(), v.to_owned())).collect())
        .collect()
}

fn read_nodes(path: &str) -> Vec<GpuNode> {
    csv(path)
        .into_iter()
        .map(|r| GpuNode {
            model: r["model"].clone(),
            gpus: r["gpu"].parse().expect("gpu"),
            cpus_milli: r["cpu_milli"].parse().expect("cpu_milli"),
            memory_mib: r["memory_mib"].parse().expect("memory_mib"),
        })
        .collect()
}

fn read_pods(path: &str) -> Vec<Pod> {
    csv(path)
        .into_iter()
        .map(|r| {
            let count: u32 = r["num_gpu"].parse().expect("num_gpu");
            let milli: u32 = r["gpu_milli"].parse().expect("gpu_milli");
            let gpus = match count {
                0 => 0,
                1 if milli < 1000 => milli.div_ceil(10).max(1),
                n => n * ONE_GPU,
            };
            Pod {
                cpus_milli: r["cpu_milli"].parse().expect("cpu_milli"),
                memory_mib: r["memory_mib"].parse().expect("memory_mib"),
                gpus,
            }
        })
        .collect()
}
