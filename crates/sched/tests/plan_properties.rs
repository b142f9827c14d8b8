//! Properties of every plan over random snapshots: the invariants of `check::violations`
//! (no node over-committed, no team above its limit, non-preemptible work only in-quota,
//! gangs whole or absent, no in-quota workload left waiting while reclaiming borrowed work
//! would let it fit, every waiting workload with a reason and a position), determinism,
//! and, over many cycles, no preemption ping-pong.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use berth_sched::check::violations;
use berth_sched::plan::{Plan, PreemptionCause};
use berth_sched::schedule;
use berth_sched::snapshot::Snapshot;
use proptest::prelude::*;
use support::World;
use support::arbitrary::snapshots;

/// 1,024 cases, or `PROPTEST_CASES` (a sweep: `PROPTEST_CASES=1000000 cargo test --release
/// -p berth-sched --test plan_properties`).
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 1024;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_plan_holds_the_invariants_and_is_deterministic(s in snapshots()) {
        s.validate().unwrap();
        let plan = schedule(&s).unwrap();
        prop_assert_eq!(violations(&s, &plan), Vec::<String>::new(), "{:?}", plan);
        prop_assert_eq!(schedule(&s).unwrap(), plan);
    }

    #[test]
    fn cycles_carried_out_never_ping_pong(s in snapshots(), grace in 0..3i64) {
        closed_system(s, grace)?;
    }
}

/// A closed system (no arrivals, no completions) starting from `s`, over 16 × (grace + 1)
/// cycles a minute apart: plans are carried out, preempted work stops `grace` cycles later (it runs
/// out its grace period meanwhile) and is requeued. Every cycle's plan holds the
/// invariants, no two workloads preempt each other, and preemption dies out (none in the
/// last 4 cycles). A workload that would start to starve during those minutes
/// starves from the start, and running work whose min runtime would end during them is
/// unprotected from the start: those are events from outside, like an arrival. A failure
/// comes with each cycle's preemptions, admissions and reasons.
fn closed_system(mut s: Snapshot, grace: i64) -> Result<(), TestCaseError> {
    // Victims stop `grace` cycles late, so each preemption takes that much longer to play
    // out: the window grows with it.
    let cycles = 16 * (grace + 1);
    for p in &mut s.pending {
        let waited = s.now - p.submitted_at;
        if waited < s.starvation_after_seconds && waited + cycles * 60 >= s.starvation_after_seconds {
            p.submitted_at = s.now - s.starvation_after_seconds;
        }
    }
    for r in &mut s.running {
        if r.protected_until > s.now && r.protected_until <= s.now + cycles * 60 {
            r.protected_until = s.now;
        }
    }
    let mut w = World::from(s);
    let mut pairs = BTreeSet::new();
    let mut quiet = 0;
    let mut preempted_in: BTreeMap<String, i64> = BTreeMap::new();
    let mut log = String::new();
    for cycle in 0..cycles {
        // As the controllers' snapshot is made each cycle: what runs borrows as the
        // guarantees stand.
        w.s.settle_borrowed();
        let plan = schedule(&w.s).unwrap();
        log += &trace(&w, &plan, cycle);
        let wrong = violations(&w.s, &plan);
        prop_assert!(wrong.is_empty(), "{wrong:?}\n{log}");
        for p in &plan.preemptions {
            let victim = w.s.running[p.victim].id.clone();
            let cause = w.s.pending[p.cause.workload()].id.clone();
            prop_assert!(
                !pairs.contains(&(cause.clone(), victim.clone())),
                "{victim} and {cause} preempt each other\n{log}"
            );
            preempted_in.insert(victim.clone(), cycle);
            pairs.insert((victim, cause));
        }
        quiet = if plan.preemptions.is_empty() { quiet + 1 } else { 0 };
        w.carry_out(&plan);
        w.finish_stopping_where(|r| preempted_in.get(&r.id).is_none_or(|&at| cycle - at >= grace), true);
    }
    prop_assert!(quiet >= 4, "still preempting after {} cycles\n{log}", cycles - 4);
    Ok(())
}

/// One cycle's preemptions, admissions and waiting reasons, a line each.
fn trace(w: &World, plan: &Plan, cycle: i64) -> String {
    let mut out = format!("cycle {cycle}:\n");
    for p in &plan.preemptions {
        let cause = match p.cause {
            PreemptionCause::Reclaim { team, .. } => format!("reclaim by t{team}"),
            PreemptionCause::Priority { .. } => "priority".to_string(),
        };
        let (v, c) = (&w.s.running[p.victim], &w.s.pending[p.cause.workload()]);
        out += &format!(
            "  preempt {} (t{}, prio {}) for {} (t{}, prio {}): {cause}\n",
            v.id, v.team, v.priority, c.id, c.team, c.priority
        );
    }
    for a in &plan.admissions {
        let p = &w.s.pending[a.workload];
        out += &format!(
            "  admit {} (t{}) on c{} f{}{}\n",
            p.id,
            p.team,
            a.cluster,
            a.flavor,
            if a.borrowed { " borrowed" } else { "" }
        );
    }
    for x in &plan.waiting {
        let p = &w.s.pending[x.workload];
        out += &format!("  wait {} (t{}): {:?} holding {:?}\n", p.id, p.team, x.reason, x.reserved_nodes);
    }
    out
}

/// The closed systems in which sweeps found a ping-pong, kept as snapshots with the grace
/// period their victims took (a proptest seed names a different case once the strategies
/// change): each still settles.
#[test]
fn closed_systems_that_once_ping_ponged_settle() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ping_pongs");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let s: Snapshot = serde_json::from_value(case["snapshot"].clone()).unwrap();
        s.validate().unwrap();
        if let Err(e) = closed_system(s, case["grace"].as_i64().unwrap()) {
            panic!("{}: {e}", path.display());
        }
        replayed += 1;
    }
    assert!(replayed > 0, "no snapshots in {}", dir.display());
}
