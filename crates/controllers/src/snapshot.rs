//! Builds the scheduler's snapshot from what the store holds, and keeps the way back from
//! the snapshot's indices to workloads, teams, clusters and nodes.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use berth_core::cluster::{Cluster, ClusterHealth};
use berth_core::team::Team;
use berth_core::workload::{PendingReason, Phase, TaskPlacement, Workload};
use berth_core::{ClusterId, TeamId};
use berth_sched::snapshot::{self as s, MAX_GPUS_PER_NODE, ONE_GPU, Resources};
use berth_store::cluster::ClusterNode;
use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;

/// What the store holds that the scheduler looks at.
pub struct World {
    pub now: DateTime<Utc>,
    pub flavors: Vec<String>,
    pub teams: Vec<Team>,
    pub clusters: Vec<Cluster>,
    pub nodes: Arc<Vec<(ClusterId, ClusterNode)>>,
    /// Every workload that is not finished, by uid.
    pub workloads: Vec<Arc<Workload>>,
}

/// A snapshot and the objects behind its indices.
pub struct Built {
    pub snapshot: s::Snapshot,
    /// Index into `World::workloads` of each `snapshot.running`.
    pub running: Vec<usize>,
    /// Index into `World::workloads` of each `snapshot.pending`.
    pub pending: Vec<usize>,
    /// Pending workloads the scheduler cannot consider at all, with why.
    pub unschedulable: Vec<(usize, PendingReason)>,
}

fn seconds(t: DateTime<Utc>) -> i64 {
    t.timestamp()
}

pub fn build(world: &World, starvation_after_seconds: i64) -> Built {
    // Fx hashing: these are looked up once or more per workload and node, 100,000s a cycle.
    let flavor_ix: FxHashMap<&str, usize> = world.flavors.iter().enumerate().map(|(i, f)| (f.as_str(), i)).collect();
    let team_ix: FxHashMap<&str, usize> =
        world.teams.iter().enumerate().map(|(i, t)| (t.metadata.name.as_str(), i)).collect();
    let cluster_ix: FxHashMap<&str, usize> =
        world.clusters.iter().enumerate().map(|(i, c)| (c.metadata.name.as_str(), i)).collect();
    let cluster_by_uid: FxHashMap<ClusterId, usize> =
        world.clusters.iter().enumerate().map(|(i, c)| (ClusterId(c.metadata.uid), i)).collect();

    let teams = s::Team::tree(&world.teams, &world.flavors);
    // What min runtime each team allows its work (most allow none).
    let allowed: Vec<u32> = (0..teams.len()).map(|t| s::min_runtime(&teams, t, None)).collect();
    let clusters = world
        .clusters
        .iter()
        .map(|c| s::Cluster {
            name: c.metadata.name.clone(),
            kind: c.spec.kind,
            labels: c.metadata.labels.clone(),
            cordoned: c.spec.cordoned || c.status.health == ClusterHealth::Unreachable,
            fractional_gpus: Some(c.spec.capabilities().fractional_gpus),
            packing: c.spec.packing,
        })
        .collect();
    let mut nodes: Vec<s::Node> = Vec::with_capacity(world.nodes.len());
    let mut node_ix: FxHashMap<(usize, &str), usize> =
        FxHashMap::with_capacity_and_hasher(world.nodes.len(), rustc_hash::FxBuildHasher);
    for (cluster, n) in world.nodes.iter() {
        let (Some(&c), Some(&f)) = (cluster_by_uid.get(cluster), n.flavor.as_deref().and_then(|f| flavor_ix.get(f)))
        else {
            continue;
        };
        node_ix.insert((c, n.name.as_str()), nodes.len());
        let (gpus, unavailable, block) = (n.gpus, n.unavailable_gpus, n.block.as_deref());
        nodes.push(s::Node::from_inventory(
            &n.name,
            c,
            f,
            gpus,
            unavailable,
            n.cpus,
            n.memory_mib,
            block,
            n.schedulable,
        ));
    }

    // Most unfinished work runs at a large site.
    let mut running = Vec::with_capacity(world.workloads.len());
    let mut running_ix = Vec::with_capacity(world.workloads.len());
    let mut pending = Vec::new();
    let mut pending_ix = Vec::new();
    let mut unschedulable = Vec::new();
    for (i, w) in world.workloads.iter().enumerate() {
        let team = w.metadata.team.as_deref().and_then(|t| team_ix.get(t).copied());
        let Some(team) = team else { continue };
        let tasks = Resources::of(&w.spec);
        let phase = w.status.phase;
        if phase.holds_gpus() {
            let Some(a) = &w.status.admission else { continue };
            let (Some(&cluster), Some(&flavor)) =
                (cluster_ix.get(a.cluster.as_str()), flavor_ix.get(a.flavor.as_str()))
            else {
                continue;
            };
            let placement = place_running(&mut nodes, &mut node_ix, cluster, flavor, &a.placement, &tasks);
            // Its min runtime counts from when its backend started it (the tree is walked
            // only where its team allows any).
            let declared = w.spec.preemption.map(|p| p.min_runtime_seconds);
            let min_runtime = if allowed[team] == 0 { 0 } else { s::min_runtime(&teams, team, declared) };
            let protected_until = match w.status.started_at {
                Some(at) if min_runtime > 0 => seconds(at) + i64::from(min_runtime),
                _ => 0,
            };
            running_ix.push(i);
            running.push(s::Running {
                id: w.metadata.uid.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).to_owned(),
                team,
                priority: w.spec.priority,
                preemptible: w.spec.preemptible,
                borrowed: a.borrowed,
                started_at: seconds(w.status.started_at.unwrap_or(w.metadata.update_timestamp)),
                protected_until,
                preempting: phase == Phase::Preempting || w.stopping(),
                cluster,
                flavor,
                tasks,
                placement,
            });
        } else if phase == Phase::Pending && !w.stopping() {
            let flavors: Vec<usize> =
                w.spec.tasks.resources.flavors.iter().filter_map(|f| flavor_ix.get(f.as_str()).copied()).collect();
            if tasks.gpus > MAX_GPUS_PER_NODE * ONE_GPU || flavors.is_empty() {
                unschedulable.push((
                    i,
                    PendingReason {
                        code: "Unschedulable".into(),
                        message: if flavors.is_empty() {
                            "can never run as submitted: none of its flavors exists".into()
                        } else {
                            format!(
                                "can never run as submitted: each task asks for {} GPUs; no node has more than \
                                 {MAX_GPUS_PER_NODE}",
                                w.spec.tasks.resources.gpus
                            )
                        },
                        details: None,
                    },
                ));
                continue;
            }
            pending_ix.push(i);
            let submitted_at = seconds(w.status.submitted_at.unwrap_or(w.metadata.creation_timestamp));
            pending.push(s::Pending::of(w.metadata.uid.to_string(), team, flavors, &w.spec, submitted_at));
        }
    }
    make_room_for_running(&mut nodes, &running);
    let mut snapshot = s::Snapshot {
        now: seconds(world.now),
        starvation_after_seconds,
        flavors: world.flavors.clone(),
        teams,
        clusters,
        nodes,
        running,
        pending,
        recent_demand: Vec::new(),
    };
    // A requeued victim waits for the workload it was preempted for.
    let preemptor_of: HashMap<String, String> = pending_ix
        .iter()
        .filter_map(|&i| {
            let w = &world.workloads[i];
            w.status.preempted_for.map(|by| (w.metadata.uid.to_string(), by.to_string()))
        })
        .collect();
    snapshot.link_preemptors(&preemptor_of);
    Built { snapshot, running: running_ix, pending: pending_ix, unschedulable }
}

/// Maps a running workload's stored placement to node indices. A node the inventory no
/// longer lists gets a cordoned stand-in, so the work still counts where it runs.
fn place_running<'a>(
    nodes: &mut Vec<s::Node>,
    node_ix: &mut FxHashMap<(usize, &'a str), usize>,
    cluster: usize,
    flavor: usize,
    placement: &'a [TaskPlacement],
    tasks: &Resources,
) -> Vec<s::TaskPlacement> {
    let mut out = Vec::with_capacity(tasks.count as usize);
    for t in 0..tasks.count as usize {
        let (name, gpu) = match placement.get(t) {
            Some(p) => (p.node.as_str(), p.gpu),
            None => ("(unknown)", None),
        };
        let ix = *node_ix.entry((cluster, name)).or_insert_with(|| {
            nodes.push(s::Node {
                name: name.to_owned(),
                cluster,
                flavor,
                gpus: 0,
                unavailable_gpus: 0,
                cpus_milli: 0,
                memory_mib: 0,
                block: None,
                cordoned: true,
            });
            nodes.len() - 1
        });
        let device = if tasks.is_fractional() { Some(gpu.unwrap_or(0)) } else { None };
        // A node of another flavor than the admission says cannot hold it: use a stand-in.
        let ix = if nodes[ix].flavor == flavor {
            ix
        } else {
            nodes.push(s::Node { flavor, cordoned: true, gpus: 0, ..nodes[ix].clone() });
            nodes.len() - 1
        };
        out.push(s::TaskPlacement { node: ix, device });
    }
    out
}

/// The store can lag the backends (a node shrank, a stand-in has no GPUs): grow a node
/// that holds more than it has, and cordon it, so the snapshot stays consistent.
fn make_room_for_running(nodes: &mut [s::Node], running: &[s::Running]) {
    let mut whole = vec![0u32; nodes.len()];
    let mut shared: Vec<BTreeSet<u8>> = vec![BTreeSet::new(); nodes.len()];
    let mut cpus = vec![0u32; nodes.len()];
    let mut memory = vec![0u64; nodes.len()];
    for r in running {
        for p in &r.placement {
            match p.device {
                Some(d) => {
                    shared[p.node].insert(d);
                }
                None => whole[p.node] += r.tasks.gpus / ONE_GPU,
            }
            cpus[p.node] = cpus[p.node].saturating_add(r.tasks.cpus_milli);
            memory[p.node] = memory[p.node].saturating_add(r.tasks.memory_mib);
        }
    }
    for (i, n) in nodes.iter_mut().enumerate() {
        let top_device = shared[i].last().map_or(0, |&d| u32::from(d) + 1);
        let needed = (whole[i] + shared[i].len() as u32).max(top_device);
        if needed + n.unavailable_gpus > n.gpus {
            n.unavailable_gpus = n.gpus.saturating_sub(needed);
        }
        if needed > n.gpus {
            n.gpus = needed.min(MAX_GPUS_PER_NODE);
            n.cordoned = true;
        }
        if cpus[i] > n.cpus_milli || memory[i] > n.memory_mib {
            n.cpus_milli = n.cpus_milli.max(cpus[i]);
            n.memory_mib = n.memory_mib.max(memory[i]);
            n.cordoned = true;
        }
    }
}

/// Team uid by snapshot index.
pub fn team_uid(world: &World, team: usize) -> TeamId {
    TeamId(world.teams[team].metadata.uid)
}
