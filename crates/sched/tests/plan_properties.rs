//! Properties of every plan over random snapshots: the invariants of `check::violations`
//! (no node over-committed, no team above its limit, non-preemptible work only in-quota,
//! gangs whole or absent, no in-quota workload left waiting while reclaiming borrowed work
//! would let it fit, every waiting workload with a reason and a position), determinism,
//! and, over many cycles, no preemption ping-pong.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use berth_core::cluster::ClusterKind;
use berth_core::workload::{TopologyPolicy, WorkloadKind};
use berth_sched::check::violations;
use berth_sched::nodes::{node_states, place};
use berth_sched::plan::PreemptionCause;
use berth_sched::schedule;
use berth_sched::snapshot::{
    Cluster, Node, ONE_GPU, Pending, Quota, Resources, Running, Snapshot, TaskPlacement, Team,
};
use proptest::prelude::*;
use support::World;
use support::rng::Rng;

fn snapshot(seed: u64) -> Snapshot {
    let mut rng = Rng(seed);
    let flavors = 1 + rng.below(2) as usize;
    let mut s = Snapshot {
        now: 100_000,
        starvation_after_seconds: 3_600,
        flavors: (0..flavors).map(|f| format!("f{f}")).collect(),
        ..Snapshot::default()
    };
    for t in 0..1 + rng.below(6) as usize {
        let quotas = (0..flavors)
            .map(|_| {
                let guaranteed = rng.pick(&[0, 0, 2, 4, 8, 16]);
                let limit = rng.chance(30).then(|| guaranteed + rng.below(17) as u32);
                Quota { guaranteed, limit, weight: rng.below(4) as u32 }
            })
            .collect();
        let parent = (t > 0 && rng.chance(40)).then(|| rng.below(t as u64) as usize);
        s.teams.push(Team { name: format!("t{t}"), parent, quotas });
    }
    for c in 0..1 + rng.below(3) as usize {
        let mut labels = BTreeMap::new();
        if rng.chance(70) {
            labels.insert("tier".to_string(), rng.pick(&["reservation", "on-demand", "spot"]).to_string());
        }
        let kind = rng.pick(&[ClusterKind::Slurm, ClusterKind::Kubernetes, ClusterKind::Sim]);
        s.clusters.push(Cluster { name: format!("c{c}"), kind, labels, cordoned: rng.chance(10) });
        for _ in 0..1 + rng.below(6) {
            let gpus = rng.pick(&[1, 2, 4, 8, 8]);
            s.nodes.push(Node {
                name: format!("n{}", s.nodes.len()),
                cluster: c,
                flavor: rng.below(flavors as u64) as usize,
                gpus,
                unavailable_gpus: u32::from(rng.chance(10)),
                cpus_milli: 64_000,
                memory_mib: 1 << 19,
                block: rng.pick(&[None, Some("x"), Some("y")]).map(Into::into),
                cordoned: rng.chance(5),
            });
        }
    }
    let mut states = node_states(&s).unwrap();
    for i in 0..rng.below(14) {
        let team = rng.below(s.teams.len() as u64) as usize;
        let tasks = resources(&mut rng);
        let node = rng.below(s.nodes.len() as u64) as usize;
        let (cluster, flavor) = (s.nodes[node].cluster, s.nodes[node].flavor);
        let pool: Vec<usize> =
            (0..s.nodes.len()).filter(|&n| s.nodes[n].cluster == cluster && s.nodes[n].flavor == flavor).collect();
        let Some(placed) = place(&mut states, &pool, &tasks) else { continue };
        s.running.push(Running {
            id: format!("r{i}"),
            team,
            priority: rng.below(5) as i32 - 2,
            preemptible: rng.chance(80),
            borrowed: rng.chance(50),
            started_at: s.now - rng.below(10_000) as i64,
            preempting: rng.chance(10),
            cluster,
            flavor,
            tasks,
            placement: placed.tasks.iter().map(|&(node, device)| TaskPlacement { node, device }).collect(),
        });
    }
    for i in 0..rng.below(16) {
        let mut wanted: Vec<usize> = (0..flavors).filter(|_| rng.chance(60)).collect();
        if wanted.is_empty() {
            wanted.push(rng.below(flavors as u64) as usize);
        }
        if rng.chance(50) {
            wanted.reverse();
        }
        let mut cluster_selector = BTreeMap::new();
        if rng.chance(15) {
            cluster_selector.insert("tier".into(), rng.pick(&["reservation", "spot"]).into());
        }
        let backend_kinds =
            if rng.chance(15) { vec![rng.pick(&[ClusterKind::Slurm, ClusterKind::Sim])] } else { vec![] };
        s.pending.push(Pending {
            id: format!("p{i}"),
            team: rng.below(s.teams.len() as u64) as usize,
            kind: rng.pick(&[WorkloadKind::Training, WorkloadKind::Batch, WorkloadKind::Inference]),
            priority: rng.below(5) as i32 - 2,
            preemptible: rng.chance(80),
            submitted_at: s.now - rng.below(7_200) as i64,
            flavors: wanted,
            tasks: resources(&mut rng),
            topology: rng.pick(&[TopologyPolicy::None, TopologyPolicy::Preferred, TopologyPolicy::Required]),
            cluster_selector,
            backend_kinds,
            has_image: rng.chance(80),
        });
    }
    s
}

fn resources(rng: &mut Rng) -> Resources {
    Resources {
        count: 1 + rng.below(3) as u32,
        gpus: rng.pick(&[25, 50, ONE_GPU, ONE_GPU, 2 * ONE_GPU, 4 * ONE_GPU, 8 * ONE_GPU]),
        cpus_milli: 1000,
        memory_mib: 1024,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn every_plan_holds_the_invariants_and_is_deterministic(seed in any::<u64>()) {
        let s = snapshot(seed);
        s.validate().unwrap();
        let plan = schedule(&s).unwrap();
        prop_assert_eq!(violations(&s, &plan), Vec::<String>::new());
        prop_assert_eq!(schedule(&s).unwrap(), plan);
    }

    #[test]
    fn cycles_carried_out_never_ping_pong(seed in any::<u64>()) {
        closed_system(seed, false)?;
    }
}

/// The seed CI found preempting forever (`cycles_carried_out_never_ping_pong`): seed
/// 9042032229544198028. Every other cycle p2 preempts r4 (team t0, priority 2 over 1); the
/// next cycle, with r4 gone, the starving p1 (ahead of p2) is within quota again and gets
/// nodes reserved that p2 needs, so p2 cannot start and r4 is admitted again behind the
/// reservation — which takes p1 back above its guarantee, so it loses the reservation and
/// p2 preempts r4 once more. Ignored until the scheduler is fixed; run with
/// `cargo test -p berth-sched --release --test plan_properties -- --ignored --nocapture`.
#[test]
#[ignore = "seed 9042032229544198028 still ping-pongs (r4 preempted for p2 every other cycle)"]
fn the_seed_that_kept_preempting_settles() {
    closed_system(9_042_032_229_544_198_028, true).unwrap();
}

/// A closed system (no arrivals, no completions) built from `seed`, over 16 cycles: plans
/// are carried out, stopped work is requeued. Every cycle's plan holds the invariants, no
/// two workloads ever preempt each other, and preemption dies out. With `trace`, prints
/// each cycle's preemptions and admissions.
fn closed_system(seed: u64, trace: bool) -> Result<(), TestCaseError> {
    let mut w = World { s: snapshot(seed) };
    let mut pairs = BTreeSet::new();
    let mut quiet = 0;
    for cycle in 0..16 {
        let plan = schedule(&w.s).unwrap();
        if trace {
            println!("cycle {cycle}:");
            for p in &plan.preemptions {
                let cause = match p.cause {
                    PreemptionCause::Reclaim { team, .. } => format!("reclaim by t{team}"),
                    PreemptionCause::Priority { .. } => "priority".to_string(),
                };
                let (v, c) = (&w.s.running[p.victim], &w.s.pending[p.cause.workload()]);
                println!(
                    "  preempt {} (t{}, prio {}) for {} (t{}, prio {}): {cause}",
                    v.id, v.team, v.priority, c.id, c.team, c.priority
                );
            }
            for a in &plan.admissions {
                let p = &w.s.pending[a.workload];
                println!(
                    "  admit {} (t{}) on c{} f{}{}",
                    p.id,
                    p.team,
                    a.cluster,
                    a.flavor,
                    if a.borrowed { " borrowed" } else { "" }
                );
            }
        }
        prop_assert_eq!(violations(&w.s, &plan), Vec::<String>::new());
        for p in &plan.preemptions {
            let victim = w.s.running[p.victim].id.clone();
            let cause = w.s.pending[p.cause.workload()].id.clone();
            prop_assert!(!pairs.contains(&(cause.clone(), victim.clone())), "{victim} and {cause} preempt each other");
            pairs.insert((victim, cause));
        }
        quiet = if plan.preemptions.is_empty() { quiet + 1 } else { 0 };
        w.carry_out(&plan);
        w.finish_stopping(true);
    }
    prop_assert!(quiet >= 4, "still preempting after 12 cycles");
    Ok(())
}
