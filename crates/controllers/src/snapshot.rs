//! Builds the scheduler's snapshot from what the store holds, and keeps the way back from
//! the snapshot's indices to workloads, teams, clusters and nodes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use berth_core::cluster::{Cluster, ClusterHealth};
use berth_core::team::Team;
use berth_core::workload::{PendingReason, Phase, TaskPlacement, Workload};
use berth_core::{ClusterId, TeamId};
use berth_sched::snapshot::{self as s, MAX_GPUS_PER_NODE, ONE_GPU, Resources};
use berth_store::cluster::ClusterNode;
use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;
use uuid::Uuid;

/// What the store holds that the scheduler looks at.
#[derive(Clone)]
pub struct World {
    pub now: DateTime<Utc>,
    pub flavors: Vec<String>,
    pub teams: Vec<Team>,
    pub clusters: Vec<Cluster>,
    pub nodes: Arc<Vec<(ClusterId, ClusterNode)>>,
    /// Every workload that is not finished, by uid.
    pub workloads: Vec<Arc<Workload>>,
    /// What the last build derived from each workload, kept with the world between
    /// cycles (a world read anew has an empty one).
    pub derived: Arc<Mutex<Derivations>>,
}

/// What [`build`] made of each workload, kept so that the next build makes it again only
/// for the workloads written since (making it of all 120,000 took 60 ms a cycle, when some
/// hundreds had been written since the last). An entry holds while its
/// workload is the same object ([`Arc::ptr_eq`]: the kept world replaces a workload
/// written since) and the indices it names mean the same ([`Key`]).
///
/// A build lends its running and pending entries to the snapshot (moved, not copied:
/// copying 100,000 took longer than the rest of the build); [`give_back`] returns them
/// after the cycle. An entry not given back (an error, another build meanwhile) is made
/// again by the next build.
#[derive(Default)]
pub struct Derivations {
    key: Option<Key>,
    /// By uid, as the kept world's workloads come.
    entries: Vec<(Uuid, Arc<Workload>, Derived)>,
    /// The last build's entries, emptied: the next is written there (tens of megabytes at
    /// 100,000 workloads, which a new allocation would take from the kernel again).
    spare: Vec<(Uuid, Arc<Workload>, Derived)>,
    /// The snapshot's lists given back, emptied, for the next build to fill.
    spare_running: Vec<s::Running>,
    spare_pending: Vec<s::Pending>,
    /// Counts the builds: only the last one's snapshot is taken back.
    builds: u64,
}

/// What a derived workload's indices and protection depend on besides the workload.
struct Key {
    flavors: Vec<String>,
    /// Each team's name, parent and min runtime ([`s::min_runtime`]).
    teams: Vec<(String, Option<usize>, Option<u32>)>,
    clusters: Vec<(ClusterId, String)>,
    /// The inventory (the same object while its version stays: [`Arc::ptr_eq`]).
    nodes: Arc<Vec<(ClusterId, ClusterNode)>>,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.flavors == other.flavors
            && self.teams == other.teams
            && self.clusters == other.clusters
            && Arc::ptr_eq(&self.nodes, &other.nodes)
    }
}

/// One workload as the snapshot sees it.
#[derive(Clone)]
enum Derived {
    /// Its team (or, holding GPUs, its cluster or flavor) is gone.
    Left,
    Running(s::Running),
    Pending(s::Pending),
    Unschedulable(PendingReason),
    /// In a snapshot, not given back.
    Lent,
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
    /// How many workloads were derived anew (not as the last build did).
    pub derived: usize,
    /// Which build of the world's [`Derivations`] it was.
    build: u64,
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

    let teams = s::Team::tree(&world.teams, &world.flavors, world.now);
    // What min runtime each team allows its work (most allow none).
    let allowed: Vec<u32> = (0..teams.len()).map(|t| s::min_runtime(&teams, t, None)).collect();
    let clusters = world
        .clusters
        .iter()
        .map(|c| s::Cluster {
            name: c.metadata.name.clone(),
            kind: c.spec.kind,
            labels: c.placement_labels(),
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
    let mut running_ix = Vec::with_capacity(world.workloads.len());
    let mut pending_ix = Vec::new();
    let mut unschedulable = Vec::new();
    let inventory = nodes.len();
    let mut derive = |i: usize| {
        let w: &Workload = &world.workloads[i];
        let Some(&team) = w.metadata.team.as_deref().and_then(|t| team_ix.get(t)) else { return Derived::Left };
        let tasks = Resources::of(&w.spec);
        let phase = w.status.phase;
        if phase.holds_gpus() {
            let Some(a) = &w.status.admission else { return Derived::Left };
            let (Some(&cluster), Some(&flavor)) =
                (cluster_ix.get(a.cluster.as_str()), flavor_ix.get(a.flavor.as_str()))
            else {
                return Derived::Left;
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
            Derived::Running(s::Running {
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
            })
        } else if phase == Phase::Pending && !w.stopping() {
            let flavors: Vec<usize> =
                w.spec.tasks.resources.flavors.iter().filter_map(|f| flavor_ix.get(f.as_str()).copied()).collect();
            if tasks.gpus > MAX_GPUS_PER_NODE * ONE_GPU || flavors.is_empty() {
                return Derived::Unschedulable(PendingReason {
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
                });
            }
            let submitted_at = seconds(w.status.submitted_at.unwrap_or(w.metadata.creation_timestamp));
            Derived::Pending(s::Pending::of(w.metadata.uid.to_string(), team, flavors, &w.spec, submitted_at))
        } else {
            Derived::Left
        }
    };
    let key = Key {
        flavors: world.flavors.clone(),
        teams: teams.iter().map(|t| (t.name.clone(), t.parent, t.min_runtime_seconds)).collect(),
        clusters: world.clusters.iter().map(|c| (ClusterId(c.metadata.uid), c.metadata.name.clone())).collect(),
        nodes: world.nodes.clone(),
    };
    let mut kept = world.derived.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut last = std::mem::take(&mut kept.entries);
    // What no longer holds: freed after.
    let mut stale = Vec::new();
    if kept.key.as_ref() != Some(&key) {
        stale = std::mem::take(&mut last);
    }
    // Both by uid: one walk through the two (a world in another order only derives more).
    let mut before = last.drain(..).peekable();
    let mut entries = std::mem::take(&mut kept.spare);
    entries.reserve(world.workloads.len());
    let mut running = std::mem::take(&mut kept.spare_running);
    running.reserve(world.workloads.len());
    let mut pending = std::mem::take(&mut kept.spare_pending);
    let mut derived = 0;
    for (i, w) in world.workloads.iter().enumerate() {
        let same =
            |(_, was, made): &(Uuid, Arc<Workload>, Derived)| Arc::ptr_eq(was, w) && !matches!(made, Derived::Lent);
        let mut entry = match before.next_if(same) {
            Some(entry) => entry,
            None => {
                // Past the workloads gone since (which come before it by uid).
                let uid = w.metadata.uid;
                while let Some(gone) = before.next_if(|(was, ..)| *was < uid) {
                    stale.push(gone);
                }
                match before.next_if(same) {
                    Some(entry) => entry,
                    None => {
                        stale.extend(before.next_if(|(was, ..)| *was == uid));
                        derived += 1;
                        (uid, w.clone(), derive(i))
                    }
                }
            }
        };
        let made = match &entry.2 {
            Derived::Running(_) | Derived::Pending(_) => std::mem::replace(&mut entry.2, Derived::Lent),
            other => other.clone(),
        };
        entries.push(entry);
        match made {
            Derived::Left => {}
            Derived::Running(r) => {
                running_ix.push(i);
                running.push(r);
            }
            Derived::Pending(p) => {
                pending_ix.push(i);
                pending.push(p);
            }
            Derived::Unschedulable(reason) => unschedulable.push((i, reason)),
            Derived::Lent => unreachable!("a lent entry is made again"),
        }
    }
    // A stand-in node is numbered by the order it was first needed in: derived again
    // next time (rare: a node the inventory no longer lists).
    kept.key = (nodes.len() == inventory).then_some(key);
    kept.entries = entries;
    stale.extend(before);
    kept.spare = last;
    kept.builds += 1;
    let build = kept.builds;
    drop(kept);
    // After a full read every workload is a new object: freeing the 100,000 replaced ones
    // takes tens of milliseconds, not in the cycle.
    if stale.len() > 10_000 {
        std::thread::spawn(move || drop(stale));
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
    snapshot.settle_borrowed();
    Built { snapshot, running: running_ix, pending: pending_ix, unschedulable, derived, build }
}

/// Returns what `built` (of `world`) borrowed of the world's [`Derivations`], unless another
/// build came after it.
pub fn give_back(world: &World, built: Built) {
    let mut kept = world.derived.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept.builds != built.build || kept.entries.len() != world.workloads.len() {
        return;
    }
    let Built {
        snapshot: s::Snapshot { mut running, mut pending, .. }, running: running_ix, pending: pending_ix, ..
    } = built;
    for (r, i) in running.drain(..).zip(running_ix) {
        kept.entries[i].2 = Derived::Running(r);
    }
    for (mut p, i) in pending.drain(..).zip(pending_ix) {
        // Linked anew by each build.
        p.preempted_for = None;
        kept.entries[i].2 = Derived::Pending(p);
    }
    kept.spare_running = running;
    kept.spare_pending = pending;
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn meta(name: &str, team: Option<&str>, uid: u128) -> Value {
        json!({"name": name, "team": team, "uid": Uuid::from_u128(uid), "generation": 1, "resource_version": "1",
               "creation_timestamp": "2026-11-01T00:00:00Z", "update_timestamp": "2026-11-01T00:00:00Z"})
    }

    fn team(name: &str, uid: u128, min_runtime: Option<u32>) -> Team {
        let preemption = min_runtime.map(|m| json!({"min_runtime_seconds": m}));
        serde_json::from_value(json!({"metadata": meta(name, None, uid),
            "spec": {"quotas": [{"flavor": "h100", "guaranteed": 8}], "preemption": preemption}, "status": {}}))
        .unwrap()
    }

    fn workload(uid: u128, team: &str, gpus: u32, status: Value) -> Arc<Workload> {
        let spec = json!({"kind": "training", "preemption": {"min_runtime_seconds": 600},
            "tasks": {"count": 2, "resources": {"flavors": ["h100"], "gpus": gpus}}});
        Arc::new(
            serde_json::from_value(json!({"metadata": meta(&format!("w{uid}"), Some(team), uid), "spec": spec,
                "status": status}))
            .unwrap(),
        )
    }

    fn running(node: &str) -> Value {
        json!({"phase": "Running", "started_at": "2026-11-01T00:00:00Z",
               "admission": {"cluster": "c", "flavor": "h100", "borrowed": false,
                             "placement": [{"node": node}, {"node": "n1"}]}})
    }

    fn node(name: &str) -> (ClusterId, ClusterNode) {
        let node = ClusterNode {
            name: name.into(),
            flavor: Some("h100".into()),
            gpus: 8,
            unavailable_gpus: 0,
            cpus: 64,
            memory_mib: 1 << 20,
            block: None,
            schedulable: true,
        };
        (ClusterId(Uuid::from_u128(100)), node)
    }

    fn world() -> World {
        let cluster = serde_json::from_value(json!({"metadata": meta("c", None, 100),
            "spec": {"kind": "sim", "sim": {"node_groups": []}}, "status": {"health": "Healthy"}}))
        .unwrap();
        World {
            now: "2026-11-02T00:00:00Z".parse().unwrap(),
            flavors: vec!["h100".into()],
            teams: vec![team("a", 1, Some(3600)), team("b", 2, None)],
            clusters: vec![cluster],
            nodes: Arc::new(vec![node("n0"), node("n1")]),
            workloads: vec![
                workload(10, "a", 1, running("n0")),
                workload(11, "b", 2, running("n0")),
                workload(12, "b", 1, json!({"phase": "Pending"})),
                workload(13, "a", 64, json!({"phase": "Pending"})),
            ],
            derived: Arc::default(),
        }
    }

    /// What `world` builds with what the builds before derived (given back after), what
    /// it builds anew, and how many workloads the first made anew.
    fn both(world: &World) -> (s::Snapshot, s::Snapshot, usize) {
        let kept = build(world, 60);
        let anew = build(&World { derived: Arc::default(), ..world.clone() }, 60);
        assert_eq!(
            (&kept.running, &kept.pending, &kept.unschedulable),
            (&anew.running, &anew.pending, &anew.unschedulable)
        );
        let (snapshot, derived) = (kept.snapshot.clone(), kept.derived);
        give_back(world, kept);
        (snapshot, anew.snapshot, derived)
    }

    #[test]
    fn a_build_that_reuses_the_last_ones_derivations_equals_one_anew() {
        let mut w = world();
        // Not given back: its running and pending entries are made again.
        assert_eq!(build(&w, 60).derived, 4);
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!(derived, 3);
        assert_eq!((kept.running.len(), kept.pending.len()), (2, 1), "w13 asks for more GPUs than a node has");
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!(derived, 0);

        // A workload written since: it is derived again (it now runs on n1 only).
        w.workloads[1] = workload(11, "b", 2, running("n1"));
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!((derived, kept.running[1].placement[0].node), (1, 1));

        // The teams in another order (a team's index changes), a team's min runtime, the
        // inventory (a node gone: a stand-in): each makes every entry derived again.
        w.teams.swap(0, 1);
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!((derived, kept.running[0].team), (4, 1));
        w.teams[1] = team("a", 1, Some(60));
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!((derived, kept.running[0].protected_until), (4, kept.running[0].started_at + 60));
        w.nodes = Arc::new(vec![node("n1")]);
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!((derived, kept.nodes.len()), (4, 2), "n0 is a stand-in");
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!(derived, 4, "a stand-in's number is not kept");

        // A workload gone, and one new.
        w.nodes = Arc::new(vec![node("n0"), node("n1")]);
        both(&w);
        w.workloads.remove(0);
        w.workloads.push(workload(14, "a", 1, json!({"phase": "Pending"})));
        let (kept, anew, derived) = both(&w);
        assert_eq!(kept, anew);
        assert_eq!((derived, kept.running.len(), kept.pending.len()), (1, 1, 2));

        // A requeued victim's link to its preemptor is made by each build, not kept.
        let victim = |by: Option<u128>| {
            let by = by.map(Uuid::from_u128);
            workload(15, "b", 1, json!({"phase": "Pending", "preempted_for": by}))
        };
        w.workloads.push(victim(Some(12)));
        let (kept, anew, _) = both(&w);
        assert_eq!(kept, anew);
        assert!(kept.pending.iter().any(|p| p.preempted_for.is_some()));
        *w.workloads.last_mut().unwrap() = victim(None);
        w.workloads[1] = workload(12, "b", 1, json!({"phase": "Pending"}));
        let (kept, anew, _) = both(&w);
        assert_eq!(kept, anew);
    }
}
