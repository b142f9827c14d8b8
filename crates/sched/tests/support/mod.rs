//! A small builder for hand-made snapshots.
#![allow(dead_code)]

pub mod arbitrary;
pub mod rng;

use std::collections::BTreeMap;

use berth_core::cluster::{ClusterKind, Packing};
use berth_core::workload::{TopologyPolicy, WorkloadKind};
use berth_sched::check::violations;
use berth_sched::nodes::{node_states, place};
use berth_sched::plan::{Plan, Reason};
use berth_sched::schedule;
use berth_sched::snapshot::{
    Cluster, Node, ONE_GPU, Pending, PendingIx, Quota, Resources, Running, RunningIx, Snapshot, TaskPlacement,
};

pub struct World {
    pub s: Snapshot,
    /// A preempted workload's id → the id of the workload it was preempted for (as the
    /// controllers keep it in the victim's status).
    pub preemptor_of: std::collections::HashMap<String, String>,
}

impl World {
    pub fn new(flavors: &[&str]) -> Self {
        let s = Snapshot {
            now: 10_000,
            starvation_after_seconds: 3_600,
            flavors: flavors.iter().map(|f| (*f).to_string()).collect(),
            ..Snapshot::default()
        };
        Self { s, preemptor_of: Default::default() }
    }

    /// A world starting from `s`.
    pub fn from(s: Snapshot) -> Self {
        Self { s, preemptor_of: Default::default() }
    }

    fn flavor(&self, name: &str) -> usize {
        self.s.flavors.iter().position(|f| f == name).expect("known flavor")
    }

    pub fn team_ix(&self, name: &str) -> usize {
        self.s.teams.iter().position(|t| t.name == name).expect("known team")
    }

    /// A team with `(flavor, guaranteed, limit, weight)` quotas.
    pub fn team(&mut self, name: &str, parent: Option<&str>, quotas: &[(&str, u32, Option<u32>, u32)]) -> usize {
        let mut q = vec![Quota::default(); self.s.flavors.len()];
        for &(f, guaranteed, limit, weight) in quotas {
            q[self.flavor(f)] = Quota { guaranteed, limit, weight };
        }
        let parent = parent.map(|p| self.team_ix(p));
        self.s.teams.push(berth_sched::snapshot::Team {
            name: name.into(),
            parent,
            quotas: q,
            budget_stops: Vec::new(),
            recent_usage: None,
            min_runtime_seconds: None,
        });
        self.s.teams.len() - 1
    }

    pub fn cluster(&mut self, name: &str, kind: ClusterKind, labels: &[(&str, &str)]) -> usize {
        self.s.clusters.push(Cluster {
            name: name.into(),
            kind,
            labels: labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            cordoned: false,
            fractional_gpus: None,
            packing: Packing::BestFit,
        });
        self.s.clusters.len() - 1
    }

    /// `count` nodes of `gpus` GPUs each, in `block` if given.
    pub fn nodes(&mut self, cluster: usize, flavor: &str, count: usize, gpus: u32, block: Option<&str>) -> Vec<usize> {
        let f = self.flavor(flavor);
        (0..count)
            .map(|_| {
                let i = self.s.nodes.len();
                self.s.nodes.push(Node {
                    name: format!("n{i}"),
                    cluster,
                    flavor: f,
                    gpus,
                    unavailable_gpus: 0,
                    cpus_milli: 128_000,
                    memory_mib: 1 << 20,
                    block: block.map(Into::into),
                    cordoned: false,
                });
                i
            })
            .collect()
    }

    /// Running work of `count` × `gpus` (hundredths) placed best-fit on `nodes`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        id: &str,
        team: &str,
        nodes: &[usize],
        count: u32,
        gpus: u32,
        borrowed: bool,
        priority: i32,
        started_at: i64,
    ) -> RunningIx {
        let node = &self.s.nodes[nodes[0]];
        let (cluster, flavor) = (node.cluster, node.flavor);
        let tasks = Resources { count, gpus, cpus_milli: 1000, memory_mib: 1024 };
        let mut states = node_states(&self.s).unwrap();
        let placed = place(&mut states, nodes, &tasks, None).expect("running work fits where the test puts it");
        self.s.running.push(Running {
            id: id.into(),
            team: self.team_ix(team),
            priority,
            preemptible: true,
            borrowed,
            started_at,
            protected_until: 0,
            preempting: false,
            cluster,
            flavor,
            tasks,
            placement: placed.tasks.iter().map(|&(node, device)| TaskPlacement { node, device }).collect(),
        });
        self.s.running.len() - 1
    }

    /// A pending workload of `count` × `gpus` (hundredths) wanting `flavors`.
    pub fn submit(&mut self, id: &str, team: &str, count: u32, gpus: u32, flavors: &[&str]) -> PendingIx {
        let flavors = flavors.iter().map(|f| self.flavor(f)).collect();
        let submitted_at = self.s.now - 60 + self.s.pending.len() as i64;
        self.s.pending.push(Pending {
            id: id.into(),
            team: self.team_ix(team),
            kind: WorkloadKind::Training,
            priority: 0,
            preemptible: true,
            submitted_at,
            flavors,
            tasks: Resources { count, gpus, cpus_milli: 1000, memory_mib: 1024 },
            topology: TopologyPolicy::None,
            cluster_selector: BTreeMap::new(),
            backend_kinds: Vec::new(),
            flavor_policy: Default::default(),
            has_image: true,
            has_command: true,
            preempted_for: None,
        });
        self.s.pending.len() - 1
    }

    pub fn pending(&mut self, w: PendingIx) -> &mut Pending {
        &mut self.s.pending[w]
    }

    /// Schedules, checks every invariant, and checks the plan is the same a second time.
    pub fn plan(&self) -> Plan {
        let plan = schedule(&self.s).expect("valid snapshot");
        assert_eq!(violations(&self.s, &plan), Vec::<String>::new());
        assert_eq!(schedule(&self.s).unwrap(), plan, "the same snapshot gives the same plan");
        plan
    }

    /// Applies a plan as the controllers would once it is carried out: admitted work runs,
    /// preempted work is stopping (call [`Self::finish_stopping`] to let it go).
    pub fn carry_out(&mut self, plan: &Plan) {
        for p in &plan.preemptions {
            self.s.running[p.victim].preempting = true;
            let by = self.s.pending[p.cause.workload()].id.clone();
            self.preemptor_of.insert(self.s.running[p.victim].id.clone(), by);
        }
        let mut admitted: Vec<usize> = plan.admissions.iter().map(|a| a.workload).collect();
        for a in &plan.admissions {
            let p = &self.s.pending[a.workload];
            self.s.running.push(Running {
                id: p.id.clone(),
                team: p.team,
                priority: p.priority,
                preemptible: p.preemptible,
                borrowed: a.borrowed,
                started_at: self.s.now,
                protected_until: 0,
                preempting: false,
                cluster: a.cluster,
                flavor: a.flavor,
                tasks: p.tasks,
                placement: a.placement.clone(),
            });
        }
        admitted.sort_unstable();
        for w in admitted.into_iter().rev() {
            let p = self.s.pending.remove(w);
            self.preemptor_of.remove(&p.id);
        }
        self.s.link_preemptors(&self.preemptor_of);
        self.s.now += 60;
    }

    /// Stopping work is gone; with `requeue`, it comes back as pending.
    pub fn finish_stopping(&mut self, requeue: bool) {
        self.finish_stopping_where(|_| true, requeue);
    }

    /// [`Self::finish_stopping`] for the stopping work `done` picks; the rest keeps running
    /// out its grace period.
    pub fn finish_stopping_where(&mut self, done: impl Fn(&Running) -> bool, requeue: bool) {
        let (stopped, running): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut self.s.running).into_iter().partition(|r| r.preempting && done(r));
        self.s.running = running;
        if requeue {
            for r in stopped {
                let f = r.flavor;
                self.s.pending.push(Pending {
                    id: r.id,
                    team: r.team,
                    kind: WorkloadKind::Training,
                    priority: r.priority,
                    preemptible: r.preemptible,
                    submitted_at: r.started_at,
                    flavors: vec![f],
                    tasks: r.tasks,
                    topology: TopologyPolicy::None,
                    cluster_selector: BTreeMap::new(),
                    backend_kinds: Vec::new(),
                    flavor_policy: Default::default(),
                    has_image: true,
                    has_command: true,
                    preempted_for: None,
                });
            }
        }
        self.s.link_preemptors(&self.preemptor_of);
    }
}

pub const GPU: u32 = ONE_GPU;

/// Ids of the admitted workloads.
pub fn admitted(w: &World, plan: &Plan) -> Vec<String> {
    plan.admissions.iter().map(|a| w.s.pending[a.workload].id.clone()).collect()
}

/// Ids of the preempted workloads.
pub fn preempted(w: &World, plan: &Plan) -> Vec<String> {
    plan.preemptions.iter().map(|p| w.s.running[p.victim].id.clone()).collect()
}

/// The reason a pending workload (by id) waits.
pub fn reason<'p>(w: &World, plan: &'p Plan, id: &str) -> &'p Reason {
    &plan.waiting.iter().find(|x| w.s.pending[x.workload].id == id).expect("waiting").reason
}
