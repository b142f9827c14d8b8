//! One test per scheduling rule, on hand-built snapshots; each comment works out the
//! expected outcome. Every plan is also run through the invariant checker and scheduled
//! twice (see `support::World::plan`).

mod support;

use berth_core::cluster::{ClusterKind, Packing};
use berth_core::workload::{TopologyPolicy, WorkloadKind};
use berth_sched::check::violations;
use berth_sched::feasible::Impossible;
use berth_sched::plan::{Miss, PreemptionCause, Reason, Waiting};
use berth_sched::snapshot::{BudgetStop, Quota};
use berth_sched::what_if::{Change, what_if};
use support::{GPU, World, admitted, preempted, reason};

/// Teams a and b, guaranteed 8 and 8 H100s, on one cluster of two 8-GPU nodes.
fn two_owners() -> (World, Vec<usize>) {
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    w.team("b", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 2, 8, None);
    (w, nodes)
}

#[test]
fn an_idle_owners_quota_is_lent_and_exactly_the_borrowed_work_is_reclaimed() {
    // a is idle; b submits two 8-GPU jobs: the first runs in b's guarantee, the second on
    // a's idle 8, borrowed.
    let (mut w, _) = two_owners();
    w.submit("b1", "b", 1, 8 * GPU, &["h100"]);
    w.submit("b2", "b", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["b1", "b2"]);
    assert_eq!(plan.admissions.iter().map(|a| a.borrowed).collect::<Vec<_>>(), [false, true]);
    w.carry_out(&plan);

    // The owner a submits 8: b2, the borrowed job, is preempted (b1 is in b's quota), and
    // a waits for it on the node it frees.
    let a1 = w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["b2"]);
    let team_a = w.team_ix("a");
    assert_eq!(plan.preemptions[0].cause, PreemptionCause::Reclaim { team: team_a, workload: a1 });
    assert!(matches!(reason(&w, &plan, "a1"), Reason::WaitingForReclaim { victims, .. } if victims.len() == 1));
    let b2_node = w.s.running[plan.preemptions[0].victim].placement[0].node;
    assert_eq!(plan.waiting[0].reserved_nodes, [b2_node]);
    w.carry_out(&plan);

    // While b2 stops, nothing more is preempted: a1 counts on the stopping job.
    let plan = w.plan();
    assert!(plan.preemptions.is_empty());
    assert!(matches!(reason(&w, &plan, "a1"), Reason::WaitingForReclaim { .. }));

    // Once b2 is gone (and requeued), a1 runs in-quota and b2 waits: the flavor is full
    // (b also holds its fair share, but capacity is named first), and borrowed work never
    // preempts, so there is no ping-pong.
    w.finish_stopping(true);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["a1"]);
    assert!(!plan.admissions[0].borrowed);
    assert!(plan.preemptions.is_empty());
    assert!(matches!(reason(&w, &plan, "b2"), Reason::NoClusterFits { attempts }
        if attempts[0].clusters[0].miss == Miss::NotEnoughGpus { free: 0.0, needed: 8.0 }));
    w.carry_out(&plan);
    assert!(w.plan().preemptions.is_empty());
}

#[test]
fn the_limit_caps_what_a_team_holds_and_the_reason_says_by_how_much() {
    // b may hold 12: running 8, an 8-GPU job would make 16 > 12.
    let (mut w, nodes) = two_owners();
    w.s.teams[1].quotas[0].limit = Some(12);
    w.run("b0", "b", &nodes, 1, 8 * GPU, false, 0, 0);
    w.submit("b1", "b", 1, 8 * GPU, &["h100"]);
    w.submit("b2", "b", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    // b2 (4) fits under the limit (8 + 4 = 12), b1 does not.
    assert_eq!(admitted(&w, &plan), ["b2"]);
    let team_b = w.team_ix("b");
    assert_eq!(
        reason(&w, &plan, "b1"),
        &Reason::QuotaLimitReached { team: team_b, flavor: 0, used: 8.0, limit: 12.0, requested: 8.0 }
    );
}

#[test]
fn a_used_up_budget_is_named_before_a_limit_that_also_binds() {
    // b holds its limit of 8 and its budget of `stop_new` is used up: a GPU freeing would
    // not start b1, so the reason is the budget and when it resets, not the limit.
    let (mut w, nodes) = two_owners();
    w.s.teams[1].quotas[0].limit = Some(8);
    w.run("b0", "b", &nodes, 1, 8 * GPU, false, 0, 0);
    w.submit("b1", "b", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(matches!(reason(&w, &plan, "b1"), Reason::QuotaLimitReached { .. }));
    let resets_at = w.s.now + 3_600;
    let stop = BudgetStop { budget: "10 GPU-hours per week".into(), flavor: None, stop_new: true, resets_at };
    w.s.teams[1].budget_stops.push(stop);
    let plan = w.plan();
    let team_b = w.team_ix("b");
    assert_eq!(
        reason(&w, &plan, "b1"),
        &Reason::BudgetExhausted {
            team: team_b,
            flavor: 0,
            budget: "10 GPU-hours per week".into(),
            stop_new: true,
            resets_at
        }
    );
}

#[test]
fn a_parents_limit_binds_its_children() {
    // Department d (limit 8) with child team t (no limit of its own): t's 12-GPU job
    // would take d to 12 > 8.
    let mut w = World::new(&["h100"]);
    let d = w.team("d", None, &[("h100", 0, Some(8), 1)]);
    w.team("t", Some("d"), &[]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    w.nodes(c, "h100", 2, 8, None);
    w.submit("t1", "t", 2, 6 * GPU, &["h100"]);
    // 12 > 8 whatever else runs: it can never run as submitted, and says so.
    let plan = w.plan();
    assert_eq!(
        reason(&w, &plan, "t1"),
        &Reason::Unschedulable {
            why: vec![Impossible::AboveLimit { flavor: 0, team: d, limit: 8.0, requested: 12.0 }]
        }
    );
    // Within the limit but above what is left of it: it waits for the limit.
    w.run("t0", "t", &[0], 1, 4 * GPU, false, 0, 0);
    w.submit("t2", "t", 1, 6 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(
        matches!(reason(&w, &plan, "t2"), Reason::QuotaLimitReached { team, limit, .. } if *team == d && *limit == 8.0)
    );
}

#[test]
fn non_preemptible_work_runs_only_in_quota() {
    // a is guaranteed 8; a non-preemptible 8 fits in it, a second would borrow: refused.
    let (mut w, _) = two_owners();
    let x = w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let y = w.submit("a2", "a", 1, 8 * GPU, &["h100"]);
    w.pending(x).preemptible = false;
    w.pending(y).preemptible = false;
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["a1"]);
    assert!(!plan.admissions[0].borrowed);
    assert!(
        matches!(reason(&w, &plan, "a2"), Reason::GuaranteeExceeded { used, guaranteed, .. } if *used == 8.0 && *guaranteed == 8.0)
    );
}

#[test]
fn in_quota_non_preemptible_work_is_never_preempted() {
    // b runs 16, all non-preemptible though 8 of it is... in-quota only: b0 (8) in-quota
    // non-preemptible, b1 (8) borrowed but also non-preemptible (admitted before a rule
    // change). a's claim may only take preemptible borrowed work: nothing, so a1 waits.
    let (mut w, nodes) = two_owners();
    let b0 = w.run("b0", "b", &nodes, 1, 8 * GPU, false, 0, 0);
    let b1 = w.run("b1", "b", &nodes, 1, 8 * GPU, true, 0, 0);
    w.s.running[b0].preemptible = false;
    w.s.running[b1].preemptible = false;
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(plan.preemptions.is_empty());
    assert!(matches!(reason(&w, &plan, "a1"), Reason::NoClusterFits { .. }));
}

#[test]
fn borrowed_work_never_preempts() {
    // a has no guarantee; b's borrowed job fills the cluster. a's job would be borrowed,
    // so it waits rather than take b's place.
    let (mut w, nodes) = two_owners();
    w.s.teams[0].quotas[0].guaranteed = 0;
    w.run("b0", "b", &nodes, 1, 8 * GPU, false, 0, 0);
    w.run("b1", "b", &nodes, 1, 8 * GPU, true, 0, 0);
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(plan.preemptions.is_empty());
}

#[test]
fn reclaim_takes_the_cheapest_victim_lowest_priority_then_most_recent() {
    // c is idle with guarantee 8 of 24. a and b each run one borrowed 8-GPU job besides
    // their in-quota ones: a's at priority 5, b's at priority 1. c's claim preempts only
    // b's (lower priority). With equal priorities the one started last goes.
    let mut w = World::new(&["h100"]);
    for t in ["a", "b", "c"] {
        w.team(t, None, &[("h100", 8, None, 1)]);
    }
    let cl = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(cl, "h100", 3, 8, None);
    w.run("a-in", "a", &nodes[0..1], 1, 4 * GPU, false, 0, 0);
    w.run("b-in", "b", &nodes[0..1], 1, 4 * GPU, false, 0, 0);
    w.run("a-borrowed", "a", &nodes[1..2], 1, 8 * GPU, true, 5, 100);
    w.run("b-borrowed", "b", &nodes[2..3], 1, 8 * GPU, true, 1, 50);
    w.submit("c1", "c", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["b-borrowed"]);

    w.s.running[3].priority = 5;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["a-borrowed"], "equal priority: the most recently started goes");
}

#[test]
fn reclaim_preempts_only_as_many_as_needed() {
    // c needs 4 GPUs on one node; b runs four borrowed 2-GPU jobs on a full node. Two of
    // them (the cheapest: lowest priority) are enough.
    let mut w = World::new(&["h100"]);
    w.team("b", None, &[("h100", 0, None, 1)]);
    w.team("c", None, &[("h100", 8, None, 1)]);
    let cl = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(cl, "h100", 1, 8, None);
    for (i, prio) in [3, 1, 2, 4].iter().enumerate() {
        w.run(&format!("b{i}"), "b", &nodes, 1, 2 * GPU, true, *prio, 0);
    }
    w.submit("c1", "c", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    let mut victims = preempted(&w, &plan);
    victims.sort();
    assert_eq!(victims, ["b1", "b2"]);
}

#[test]
fn higher_priority_preempts_lower_priority_work_of_the_same_team() {
    // a is guaranteed 8 and runs a low-priority job on all of it; a's urgent job (priority
    // 100) preempts it (cause: priority) and will run in-quota. A non-preemptible
    // low-priority job would be left alone.
    let (mut w, nodes) = two_owners();
    w.run("b0", "b", &nodes[1..], 1, 8 * GPU, false, 0, 0);
    let low = w.run("a-low", "a", &nodes[..1], 1, 8 * GPU, false, -5, 0);
    let urgent = w.submit("a-urgent", "a", 1, 8 * GPU, &["h100"]);
    w.pending(urgent).priority = 100;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["a-low"]);
    assert_eq!(plan.preemptions[0].cause, PreemptionCause::Priority { workload: urgent });

    w.s.running[low].preemptible = false;
    let plan = w.plan();
    assert!(plan.preemptions.is_empty());
}

#[test]
fn gangs_start_whole_or_not_at_all() {
    // Two 8-GPU nodes with 4 GPUs busy on each: 8 free in total. A gang of 2 × 4 fits
    // (one task per node); a gang of 3 × 4 does not, and nothing of it is placed. (a is
    // guaranteed 16 here, so quota is not what stops it.)
    let (mut w, nodes) = two_owners();
    w.s.teams[0].quotas[0].guaranteed = 16;
    w.run("x", "b", &nodes[..1], 1, 4 * GPU, false, 0, 0);
    w.run("y", "b", &nodes[1..], 1, 4 * GPU, false, 0, 0);
    w.submit("big", "a", 3, 4 * GPU, &["h100"]);
    w.submit("fits", "a", 2, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["fits"]);
    assert_eq!(plan.admissions[0].placement.len(), 2);
    assert!(matches!(
        reason(&w, &plan, "big"),
        Reason::NoClusterFits { attempts } if attempts[0].clusters[0].miss == Miss::NotEnoughGpus { free: 8.0, needed: 12.0 }
    ));
}

#[test]
fn a_gang_needs_whole_tasks_per_node() {
    // 8 GPUs free, but 4 + 4 on two nodes: one 8-GPU task does not fit (fragmented).
    let (mut w, nodes) = two_owners();
    w.run("x", "b", &nodes[..1], 1, 4 * GPU, false, 0, 0);
    w.run("y", "b", &nodes[1..], 1, 4 * GPU, false, 0, 0);
    w.submit("one8", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(
        matches!(reason(&w, &plan, "one8"), Reason::NoClusterFits { attempts } if attempts[0].clusters[0].miss == Miss::Fragmented)
    );
}

#[test]
fn fractional_tasks_share_a_gpu_and_pack() {
    // One node with 2 GPUs. Three 0.5-GPU jobs: the first two share GPU 0, the third opens
    // GPU 1; a whole-GPU job then finds no free GPU.
    let mut w = World::new(&["l4"]);
    w.team("a", None, &[("l4", 4, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    w.nodes(c, "l4", 1, 2, None);
    for i in 0..3 {
        w.submit(&format!("half{i}"), "a", 1, GPU / 2, &["l4"]);
    }
    w.submit("whole", "a", 1, GPU, &["l4"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["half0", "half1", "half2"]);
    let devices: Vec<Option<u8>> = plan.admissions.iter().map(|a| a.placement[0].device).collect();
    assert_eq!(devices, [Some(0), Some(0), Some(1)]);
    assert!(matches!(reason(&w, &plan, "whole"), Reason::NoClusterFits { .. }));
}

#[test]
fn packing_against_fragmentation_keeps_room_the_work_in_sight_can_use() {
    // Four 1-GPU nodes. n0's GPU holds a 0.4 task (0.6 free); n1 is free; n2 and n3 each
    // hold two 0.5 tasks. A 0.3 task: best fit puts it on n0's shared GPU (least room left,
    // 0.3), where the 0.3 left is of no use to the 0.5 and 0.4 tasks that make up most of
    // the work in sight. With `packing: fragmentation` it goes to n1, whose 0.7 left still
    // takes any of them.
    let plan_on = |packing: Packing| {
        let mut w = World::new(&["l4"]);
        w.team("a", None, &[("l4", 4, None, 1)]);
        let c = w.cluster("c1", ClusterKind::Sim, &[]);
        w.s.clusters[c].packing = packing;
        let n = w.nodes(c, "l4", 4, 1, None);
        w.run("r0", "a", &n[0..1], 1, 40, false, 0, 0);
        w.run("r2", "a", &n[2..3], 2, GPU / 2, false, 0, 0);
        w.run("r3", "a", &n[3..4], 2, GPU / 2, false, 0, 0);
        w.submit("small", "a", 1, 30, &["l4"]);
        let plan = w.plan();
        assert_eq!(admitted(&w, &plan), ["small"]);
        (plan.admissions[0].placement[0].node, n)
    };
    let (node, n) = plan_on(Packing::BestFit);
    assert_eq!(node, n[0]);
    let (node, n) = plan_on(Packing::Fragmentation);
    assert_eq!(node, n[1]);
}

#[test]
fn best_fit_packs_onto_busy_nodes_to_keep_whole_nodes_free() {
    // Node 0 has 2 GPUs busy (6 free), node 1 is empty. A 4-GPU job goes to node 0, so an
    // 8-GPU job still fits on node 1.
    let (mut w, nodes) = two_owners();
    w.run("x", "b", &nodes[..1], 1, 2 * GPU, false, 0, 0);
    w.submit("four", "a", 1, 4 * GPU, &["h100"]);
    w.submit("eight", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["four", "eight"]);
    assert_eq!(plan.admissions[0].placement[0].node, nodes[0]);
    assert_eq!(plan.admissions[1].placement[0].node, nodes[1]);
}

#[test]
fn topology_required_keeps_a_gang_in_one_block_and_preferred_falls_back() {
    // Block x: 2 nodes, one of them busy; block y: 2 empty nodes. A 2 × 8 gang requiring one
    // block goes to y. A 3 × 8 gang requiring one block can never be placed (no block has 3
    // nodes); once one has, it waits while a node of it is busy (topology unsatisfiable).
    // Preferred instead, it spans blocks.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 32, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Slurm, &[]);
    let x = w.nodes(c, "h100", 2, 8, Some("x"));
    let y = w.nodes(c, "h100", 2, 8, Some("y"));
    w.run("busy", "a", &x[..1], 1, 8 * GPU, false, 0, 0);
    let pair = w.submit("pair", "a", 2, 8 * GPU, &["h100"]);
    w.pending(pair).topology = TopologyPolicy::Required;
    let plan = w.plan();
    let used: Vec<usize> = plan.admissions[0].placement.iter().map(|t| t.node).collect();
    assert_eq!(used, y);

    w.s.pending.clear();
    let three = w.submit("three", "a", 3, 8 * GPU, &["h100"]);
    w.pending(three).topology = TopologyPolicy::Required;
    let plan = w.plan();
    // No block has three nodes at all: it can never run as submitted, and says why.
    let never = Impossible::NoClusterHolds { flavor: 0, tasks: 3, task_gpus: 8.0, most_tasks: 2, largest_node_gpus: 8 };
    assert_eq!(reason(&w, &plan, "three"), &Reason::Unschedulable { why: vec![never] });
    // With a third node in block x (one of x's nodes busy) it could: it waits for room.
    w.nodes(c, "h100", 1, 8, Some("x"));
    let plan = w.plan();
    assert_eq!(reason(&w, &plan, "three"), &Reason::TopologyUnsatisfiable { flavor: 0 });
    w.pending(three).topology = TopologyPolicy::Preferred;
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["three"]);

    // Preferred, a gang may span all five nodes of both blocks: five tasks wait for the
    // busy node, and six can never run (counted over every block, not one).
    w.s.pending.clear();
    for (name, count) in [("five", 5), ("six", 6)] {
        let gang = w.submit(name, "a", count, 8 * GPU, &["h100"]);
        w.pending(gang).topology = TopologyPolicy::Preferred;
    }
    let plan = w.plan();
    assert!(!matches!(reason(&w, &plan, "five"), Reason::Unschedulable { .. }), "{plan:?}");
    let never = Impossible::NoClusterHolds { flavor: 0, tasks: 6, task_gpus: 8.0, most_tasks: 5, largest_node_gpus: 8 };
    assert_eq!(reason(&w, &plan, "six"), &Reason::Unschedulable { why: vec![never] });
}

#[test]
fn flavors_are_tried_in_the_workloads_order() {
    // The H100s are full, so a job accepting H100 then A100 lands on A100; one accepting
    // only H100 waits.
    let mut w = World::new(&["h100", "a100"]);
    w.team("a", None, &[("h100", 8, None, 1), ("a100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let h = w.nodes(c, "h100", 1, 8, None);
    w.nodes(c, "a100", 1, 8, None);
    w.run("busy", "a", &h, 1, 8 * GPU, false, 0, 0);
    w.submit("either", "a", 1, 4 * GPU, &["h100", "a100"]);
    w.submit("h100-only", "a", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["either"]);
    assert_eq!(plan.admissions[0].flavor, 1);
}

#[test]
fn cluster_choice_packs_first_then_prefers_the_cheaper_tier_then_the_suitable_backend() {
    // Two empty identical clusters, spot and reservation: the reservation one wins.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 32, None, 1)]);
    let spot = w.cluster("spot", ClusterKind::Kubernetes, &[("tier", "spot")]);
    let reserved = w.cluster("reserved", ClusterKind::Kubernetes, &[("tier", "reservation")]);
    let spot_nodes = w.nodes(spot, "h100", 1, 8, None);
    w.nodes(reserved, "h100", 1, 8, None);
    w.submit("job", "a", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(plan.admissions[0].cluster, reserved);

    // With 4 GPUs busy on the spot cluster, the job fills it exactly: packing wins over tier.
    w.run("busy", "a", &spot_nodes, 1, 4 * GPU, false, 0, 0);
    let plan = w.plan();
    assert_eq!(plan.admissions[0].cluster, spot);

    // Same tier and fit: training prefers Slurm, inference Kubernetes.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 32, None, 1)]);
    let k8s = w.cluster("k8s", ClusterKind::Kubernetes, &[]);
    let slurm = w.cluster("slurm", ClusterKind::Slurm, &[]);
    w.nodes(k8s, "h100", 1, 8, None);
    w.nodes(slurm, "h100", 1, 8, None);
    w.submit("train", "a", 1, 4 * GPU, &["h100"]);
    assert_eq!(w.plan().admissions[0].cluster, slurm);
    w.pending(0).kind = WorkloadKind::Inference;
    assert_eq!(w.plan().admissions[0].cluster, k8s);
}

#[test]
fn placement_constraints_and_cordons_explain_themselves() {
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[("region", "us")]);
    w.nodes(c, "h100", 1, 8, None);
    let eu = w.submit("eu", "a", 1, GPU, &["h100"]);
    w.pending(eu).cluster_selector.insert("region".into(), "eu".into());
    let slurm_only = w.submit("slurm-only", "a", 1, GPU, &["h100"]);
    w.pending(slurm_only).backend_kinds = vec![ClusterKind::Slurm];
    let plan = w.plan();
    assert_eq!(reason(&w, &plan, "eu"), &Reason::PlacementMatchesNoCluster);
    assert_eq!(reason(&w, &plan, "slurm-only"), &Reason::PlacementMatchesNoCluster);

    w.s.pending.clear();
    w.submit("any", "a", 1, GPU, &["h100"]);
    w.s.clusters[c].cordoned = true;
    let plan = w.plan();
    assert_eq!(reason(&w, &plan, "any"), &Reason::ClustersCordoned);
}

#[test]
fn teams_furthest_below_their_fair_share_go_first_then_priority_then_submission() {
    // 8 GPUs, a and b with equal weight and no guarantees: fair shares 4 and 4 (both want
    // more). a already runs 4, b nothing: b goes first and takes the last 4; a waits.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[]);
    w.team("b", None, &[]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 1, 8, None);
    w.run("a0", "a", &nodes, 1, 4 * GPU, true, 0, 0);
    w.submit("a1", "a", 1, 4 * GPU, &["h100"]);
    w.submit("b1", "b", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["b1"]);

    // Inside a team: higher priority first, then earlier submission. Only 4 GPUs free: two
    // 2-GPU jobs run, the later low-priority one waits at team position 1.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 1, 8, None);
    w.run("a0", "a", &nodes, 1, 4 * GPU, true, 0, 0);
    w.submit("early-low", "a", 1, 2 * GPU, &["h100"]);
    w.submit("late-low", "a", 1, 2 * GPU, &["h100"]);
    let high = w.submit("late-high", "a", 1, 2 * GPU, &["h100"]);
    w.pending(high).priority = 10;
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["late-high", "early-low"]);
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!((plan.waiting[0].position, plan.waiting[0].team_position), (1, 1));
}

#[test]
fn a_gang_that_cannot_fit_does_not_block_smaller_work_behind_it() {
    // 8 free GPUs; the first job in line wants 16, the one behind it 4: the 4 runs.
    let (mut w, _) = two_owners();
    w.s.nodes.truncate(1);
    w.submit("huge", "a", 2, 8 * GPU, &["h100"]);
    w.submit("small", "a", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["small"]);
}

#[test]
fn a_starving_gang_gets_nodes_reserved_and_only_work_elsewhere_backfills() {
    // Two 8-GPU nodes, 4 GPUs busy on each. A 2 × 8 gang has waited past the starvation
    // time: both nodes are reserved for it (it needs both once empty). A 2-GPU job behind
    // it may not use them, so it waits with the reservation as the per-cluster reason.
    // (a is guaranteed 16 here, so both run in-quota.)
    let (mut w, nodes) = two_owners();
    w.s.teams[0].quotas[0].guaranteed = 16;
    w.run("x", "b", &nodes[..1], 1, 4 * GPU, false, 0, 0);
    w.run("y", "b", &nodes[1..], 1, 4 * GPU, false, 0, 0);
    let gang = w.submit("gang", "a", 2, 8 * GPU, &["h100"]);
    w.pending(gang).submitted_at = w.s.now - 7_200;
    w.submit("small", "a", 1, 2 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(plan.admissions.is_empty());
    let gang_wait = plan.waiting.iter().find(|x| x.workload == gang).unwrap();
    assert_eq!(gang_wait.reserved_nodes, nodes);
    assert!(
        matches!(reason(&w, &plan, "small"), Reason::NoClusterFits { attempts } if attempts[0].clusters[0].miss == Miss::Reserved)
    );

    // Not starving yet: the small job backfills.
    w.pending(gang).submitted_at = w.s.now - 60;
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["small"]);
}

#[test]
fn every_waiting_workload_has_a_global_and_a_team_position() {
    let (mut w, _) = two_owners();
    w.s.nodes.clear();
    w.s.nodes.extend(World::new(&["h100"]).s.nodes);
    let c = 0;
    w.nodes(c, "h100", 1, 8, None);
    for i in 0..3 {
        w.submit(&format!("a{i}"), "a", 1, 8 * GPU, &["h100"]);
        w.submit(&format!("b{i}"), "b", 1, 8 * GPU, &["h100"]);
    }
    let plan = w.plan();
    assert_eq!(plan.admissions.len(), 1);
    let positions: Vec<(u32, u32)> = plan.waiting.iter().map(|x| (x.position, x.team_position)).collect();
    assert_eq!(positions.len(), 5);
    assert_eq!(positions.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    let mut per_team: Vec<u32> = positions.iter().map(|p| p.1).collect();
    per_team.sort_unstable();
    assert_eq!(per_team, [1, 1, 2, 2, 3]);
}

#[test]
fn fair_shares_are_reported_per_team_and_flavor() {
    // a guaranteed 8, wants 16; b guaranteed 8, idle: a's fair share is 16, b's 0.
    let (mut w, _) = two_owners();
    w.submit("a1", "a", 2, 8 * GPU, &["h100"]);
    let plan = w.plan();
    let a = plan.shares.iter().find(|s| s.team == 0).unwrap();
    assert_eq!((a.fair_share, a.used, a.demand, a.guaranteed), (16.0, 16.0, 16.0, 8.0));
    let b = plan.shares.iter().find(|s| s.team == 1).unwrap();
    assert_eq!((b.fair_share, b.used), (0.0, 0.0));
}

#[test]
fn what_if_shows_the_effect_of_a_quota_change_and_of_a_cluster() {
    // b borrows a's idle 8. What if a's guarantee rose to 16 and a submitted 8? b's
    // borrowed job would be preempted. What if the cluster were removed? Everything running
    // there is displaced and requeued.
    let (mut w, nodes) = two_owners();
    w.run("b0", "b", &nodes[..1], 1, 8 * GPU, false, 0, 0);
    w.run("b1", "b", &nodes[1..], 1, 8 * GPU, true, 0, 0);
    let mut job = w.s.pending.clone();
    let a1 = w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    job.push(w.s.pending.remove(a1));
    let quota = Quota { guaranteed: 16, limit: None, weight: 1 };
    let changes =
        [Change::SetQuota { team: "a".into(), flavor: "h100".into(), quota }, Change::AddWorkloads { workloads: job }];
    let result = what_if(&w.s, &changes).unwrap();
    assert_eq!(result.diff.preempted, ["b1"]);
    assert!(
        result
            .diff
            .shares
            .iter()
            .any(|(t, f, before, after)| t == "a" && f == "h100" && *before == 0.0 && *after == 8.0)
    );

    // An added cluster lets the waiting job run at once, preempting nobody.
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let mut extra = w.s.clone();
    let c2 = extra.clusters.len();
    let more = {
        let mut x = World::from(std::mem::take(&mut extra));
        x.cluster("c2", ClusterKind::Sim, &[]);
        x.nodes(c2, "h100", 1, 8, None);
        (x.s.clusters[c2].clone(), x.s.nodes[x.s.nodes.len() - 1].clone())
    };
    let result = what_if(&w.s, &[Change::AddCluster { cluster: more.0, nodes: vec![more.1] }]).unwrap();
    assert_eq!(result.diff.admitted, ["a1"]);
    assert!(result.diff.preempted.is_empty() && result.before.preemptions.len() == 1);
    assert_eq!(result.diff.no_longer_preempted, ["b1"]);

    let result = what_if(&w.s, &[Change::RemoveCluster { cluster: "c1".into() }]).unwrap();
    assert_eq!(result.diff.displaced, ["b0", "b1"]);
    assert!(result.after.admissions.is_empty());
    assert_eq!(result.after.waiting.len(), 3);
}

#[test]
fn what_no_team_can_use_within_its_share_is_lent_past_it_and_reclaimed_by_a_guarantee() {
    // 24 GPUs, a and b without guarantees and equal weights, both wanting 16: shares 12
    // and 12. Each team's first 8-GPU job runs within its share; the second would take its
    // team to 16, above it. The last node would stay idle beside them: it is lent past the
    // share, to b (both teams are equally far below their shares, and b2 was submitted
    // before a2), and a's second waits at its share.
    let (mut w, _) = two_owners();
    w.nodes(0, "h100", 1, 8, None);
    w.s.teams[0].quotas[0].guaranteed = 0;
    w.s.teams[1].quotas[0].guaranteed = 0;
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let a2 = w.submit("a2", "a", 1, 8 * GPU, &["h100"]);
    w.pending(a2).submitted_at += 10;
    w.submit("b1", "b", 1, 8 * GPU, &["h100"]);
    w.submit("b2", "b", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["a1", "b1", "b2"]);
    assert!(plan.admissions[2].borrowed);
    assert!(matches!(
        reason(&w, &plan, "a2"),
        Reason::FairShareReached { used: 8.0, fair_share: 12.0, requested: 8.0, .. }
    ));
    w.carry_out(&plan);
    // Neither team may take the loan back: b is not within a guarantee.
    for _ in 0..3 {
        let plan = w.plan();
        assert!(plan.admissions.is_empty() && plan.preemptions.is_empty(), "{plan:?}");
        w.carry_out(&plan);
    }

    // c, guaranteed 8, asks for its 8: b is now above its share (16 of 8), and c takes back
    // one of b's jobs (both borrowed, as b has no guarantee); a's, at its share, stays.
    w.team("c", None, &[("h100", 8, None, 1)]);
    w.submit("c1", "c", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(plan.preemptions.len(), 1);
    assert_eq!(w.s.running[plan.preemptions[0].victim].team, w.team_ix("b"));
    assert!(admitted(&w, &plan).is_empty());
}

#[test]
fn while_a_workload_waits_for_reclaim_its_team_does_not_borrow_the_guarantee_away() {
    // a is guaranteed 8 and runs a low-priority 8-GPU job on node 0; node 1 is free. a's
    // urgent non-preemptible job needs 8 in-quota, so it preempts the low one. a's
    // low-priority 4-GPU job behind it would fit on node 1, but only borrowed: admitting it
    // would use up the guarantee the urgent job counts on (and get it preempted in turn
    // next cycle), so it waits, borrowing paused.
    let (mut w, nodes) = two_owners();
    w.s.teams[0].quotas[0].limit = None;
    w.run("a-low", "a", &nodes[..1], 1, 8 * GPU, false, -5, 0);
    let urgent = w.submit("urgent", "a", 1, 8 * GPU, &["h100"]);
    w.pending(urgent).priority = 100;
    w.pending(urgent).preemptible = false;
    let later = w.submit("later", "a", 1, 4 * GPU, &["h100"]);
    w.pending(later).priority = -10;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["a-low"]);
    assert_eq!(reason(&w, &plan, "later"), &Reason::BorrowingPaused { flavor: 0, workload: urgent });
}

#[test]
fn a_department_and_its_child_team_each_reclaim_their_own_part_of_the_guarantee() {
    // dept is guaranteed 8, its child mini 4 of those: dept's own work runs in the other 4.
    // other runs 8 GPUs marked borrowed (it was borrowing when they started). dept's 4-GPU
    // job and mini's 4-GPU job are each within their own part: one starts on the free
    // 4-GPU node, the other reclaims other's work, and once it has stopped both run
    // in-quota, and nothing is preempted back. (Before, dept's own work counted against
    // dept's whole guarantee, and mini was kept waiting while dept's job waited, lest it
    // take dept past its guarantee and dept's job be reclaimed in turn.)
    let mut w = World::new(&["h100"]);
    w.team("dept", None, &[("h100", 8, None, 1)]);
    w.team("mini", Some("dept"), &[("h100", 4, None, 1)]);
    w.team("other", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let big = w.nodes(c, "h100", 1, 8, None);
    w.nodes(c, "h100", 1, 4, None);
    w.run("o", "other", &big, 1, 8 * GPU, true, 0, 0);
    w.submit("d", "dept", 1, 4 * GPU, &["h100"]);
    w.submit("m", "mini", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["o"]);
    assert_eq!(admitted(&w, &plan).len(), 1, "{plan:?}");
    w.carry_out(&plan);
    w.finish_stopping(true);

    let plan = w.plan();
    assert_eq!(admitted(&w, &plan).len(), 1, "{plan:?}");
    w.carry_out(&plan);
    assert!(w.s.running.iter().filter(|r| r.team != w.team_ix("other")).all(|r| !r.borrowed), "{:?}", w.s.running);
    // Nothing dept runs is borrowed: other waits, and nothing is preempted back.
    for _ in 0..3 {
        w.s.settle_borrowed();
        let plan = w.plan();
        assert!(plan.preemptions.is_empty() && plan.admissions.is_empty(), "{plan:?}");
        w.carry_out(&plan);
    }
}

#[test]
fn a_team_within_its_guarantee_reclaims_under_a_parent_whose_limit_equals_its_guarantee() {
    // The review's department: mini guarantees 8 and may use 8 (limit = guarantee); its
    // children ma and mb are each guaranteed 4. mb borrows ma's idle 4 and holds all 8.
    // ma then asks for its own 4: mini is at its limit, and the only way under it is to
    // take back mb's borrowed work, which frees the department's usage as well as nodes.
    let mut w = World::new(&["h100"]);
    w.team("mini", None, &[("h100", 8, Some(8), 1)]);
    w.team("ma", Some("mini"), &[("h100", 4, None, 1)]);
    w.team("mb", Some("mini"), &[("h100", 4, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    w.nodes(c, "h100", 2, 8, None);
    for i in 0..8 {
        w.submit(&format!("mb{i}"), "mb", 1, GPU, &["h100"]);
    }
    let plan = w.plan();
    assert_eq!(plan.admissions.len(), 8, "mb borrows ma's idle guarantee");
    w.carry_out(&plan);

    let ma1 = w.submit("ma1", "ma", 1, 4 * GPU, &["h100"]);
    let plan = w.plan();
    // Four of mb's borrowed GPUs stop for ma (the cluster has room: it is the limit that
    // binds, and the victims lower it).
    let victims = preempted(&w, &plan);
    assert_eq!(victims.len(), 4, "{victims:?}");
    assert!(victims.iter().all(|v| v.starts_with("mb")));
    let team_ma = w.team_ix("ma");
    assert!(plan.preemptions.iter().all(|p| p.cause == PreemptionCause::Reclaim { team: team_ma, workload: ma1 }));
    w.carry_out(&plan);
    w.finish_stopping(true);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["ma1"]);
    assert!(!plan.admissions[0].borrowed);
}

#[test]
fn work_that_can_never_run_claims_no_fair_share_so_no_gpu_idles_for_it() {
    // The review's case: ma (guaranteed 4) submits a non-preemptible 6-GPU job, which may
    // only run within ma's guarantee, so never; mb submits 8 × 1 GPU on the 8-GPU cluster.
    // Before, the impossible job's demand held half the department's fair share and 4 of
    // mb's jobs waited with FairShareReached beside 4 idle GPUs.
    let mut w = World::new(&["h100"]);
    w.team("mini", None, &[("h100", 8, None, 1)]);
    let ma = w.team("ma", Some("mini"), &[("h100", 4, None, 1)]);
    w.team("mb", Some("mini"), &[("h100", 4, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    w.nodes(c, "h100", 1, 8, None);
    let never = w.submit("never", "ma", 1, 6 * GPU, &["h100"]);
    w.pending(never).preemptible = false;
    for i in 0..8 {
        w.submit(&format!("mb{i}"), "mb", 1, GPU, &["h100"]);
    }
    let plan = w.plan();
    assert_eq!(plan.admissions.len(), 8, "every runnable GPU is used");
    let why = Impossible::AboveGuarantee { flavor: 0, team: ma, guaranteed: 4.0, requested: 6.0 };
    assert_eq!(reason(&w, &plan, "never"), &Reason::Unschedulable { why: vec![why] });
    let share = plan.shares.iter().find(|s| s.team == ma).expect("ma's share");
    assert_eq!(share.demand, 0.0, "the impossible job is no demand");
}

#[test]
fn a_task_larger_than_every_node_says_so_instead_of_waiting_for_room() {
    // 8-GPU nodes; a 16-GPU task fits on none, however empty: unschedulable, not "no room".
    let (mut w, _) = two_owners();
    w.submit("huge", "a", 1, 16 * GPU, &["h100"]);
    w.submit("gang", "a", 3, 8 * GPU, &["h100"]);
    let plan = w.plan();
    let huge = Impossible::NoClusterHolds { flavor: 0, tasks: 1, task_gpus: 16.0, most_tasks: 0, largest_node_gpus: 8 };
    assert_eq!(reason(&w, &plan, "huge"), &Reason::Unschedulable { why: vec![huge] });
    // Three 8-GPU tasks on a cluster of two 8-GPU nodes: never, too.
    let gang = Impossible::NoClusterHolds { flavor: 0, tasks: 3, task_gpus: 8.0, most_tasks: 2, largest_node_gpus: 8 };
    assert_eq!(reason(&w, &plan, "gang"), &Reason::Unschedulable { why: vec![gang.clone()] });
    assert!(gang.describe(&w.s).contains(": 3 tasks of 8 GPUs, but even empty"), "{}", gang.describe(&w.s));
    let ones =
        Impossible::NoClusterHolds { flavor: 0, tasks: 17, task_gpus: 1.0, most_tasks: 16, largest_node_gpus: 8 };
    assert!(ones.describe(&w.s).contains(": 17 tasks of 1 GPU, but even empty"), "{}", ones.describe(&w.s));
}

#[test]
fn cpu_or_memory_that_binds_is_the_reason_not_fragmentation() {
    // Two 8-GPU nodes of 128 cores and 1 TiB each; node 1 is full, and on node 0 a job holds
    // one GPU and 120 cores: 7 GPUs free beside 8 cores. A 4-GPU task asking 16 cores has
    // its GPUs but not its cores; one asking nearly a TiB has its GPUs but not its memory
    // (the busy job holds 1 GiB of it). Before, both read "free GPUs are spread over too
    // many nodes".
    let (mut w, nodes) = two_owners();
    w.run("big", "b", &nodes[1..], 1, 8 * GPU, false, 0, 0);
    let hog = w.run("hog", "b", &nodes[..1], 1, GPU, false, 0, 0);
    w.s.running[hog].tasks.cpus_milli = 120_000;
    let cpu = w.submit("cpu", "a", 1, 4 * GPU, &["h100"]);
    w.pending(cpu).tasks.cpus_milli = 16_000;
    let plan = w.plan();
    let Reason::NoClusterFits { attempts } = reason(&w, &plan, "cpu") else { panic!("{plan:?}") };
    assert_eq!(attempts[0].clusters[0].miss, Miss::InsufficientCpu { free: 8.0, needed: 16.0 });

    w.s.pending.clear();
    let mem = w.submit("mem", "a", 1, 4 * GPU, &["h100"]);
    w.pending(mem).tasks.memory_mib = 2 << 20;
    let plan = w.plan();
    // More memory than any node has is no temporary shortage: it can never run.
    assert!(matches!(reason(&w, &plan, "mem"), Reason::Unschedulable { .. }));
    w.pending(mem).tasks.memory_mib = (1 << 20) - 512;
    let plan = w.plan();
    let Reason::NoClusterFits { attempts } = reason(&w, &plan, "mem") else { panic!("{plan:?}") };
    assert!(matches!(attempts[0].clusters[0].miss, Miss::InsufficientMemory { .. }), "{attempts:?}");
}

#[test]
fn a_fraction_of_a_gpu_goes_only_where_the_backend_shares_gpus() {
    // The review's 0.5-GPU inference workload went to Kubernetes (which suits inference
    // best but gives whole devices) and failed BackendRejected, while a sim cluster had
    // room. Now only clusters that can run fractions are considered.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    let k8s = w.cluster("k8s", ClusterKind::Kubernetes, &[]);
    w.nodes(k8s, "h100", 1, 8, None);
    let sim = w.cluster("sim", ClusterKind::Sim, &[]);
    w.nodes(sim, "h100", 1, 8, None);
    let half = w.submit("half", "a", 1, GPU / 2, &["h100"]);
    w.pending(half).kind = WorkloadKind::Inference;
    let plan = w.plan();
    let cluster_of = |id: &str| {
        let a = plan.admissions.iter().find(|a| w.s.pending[a.workload].id == id).expect("admitted");
        a.cluster
    };
    assert_eq!(cluster_of("half"), sim);

    // With the sim cluster gone, the fraction can never run, and the reason says why.
    let mut w2 = World::new(&["h100"]);
    w2.team("a", None, &[("h100", 8, None, 1)]);
    let k8s = w2.cluster("k8s", ClusterKind::Kubernetes, &[]);
    w2.nodes(k8s, "h100", 1, 8, None);
    w2.submit("half", "a", 1, GPU / 2, &["h100"]);
    let no_image = w2.submit("no-image", "a", 1, GPU, &["h100"]);
    w2.pending(no_image).has_image = false;
    let plan = w2.plan();
    let missing =
        |what: &str| Reason::Unschedulable { why: vec![Impossible::NotCapable { flavor: 0, missing: what.into() }] };
    assert_eq!(reason(&w2, &plan, "half"), &missing("cannot share a GPU, and it asks for a fraction of one"));
    assert_eq!(reason(&w2, &plan, "no-image"), &missing("run only containers, and it names no image (spec.run.image)"));

    // A Slurm cluster shares GPUs only where its partitions have shards.
    let mut w3 = World::new(&["h100"]);
    w3.team("a", None, &[("h100", 8, None, 1)]);
    let slurm = w3.cluster("slurm", ClusterKind::Slurm, &[]);
    w3.nodes(slurm, "h100", 1, 8, None);
    w3.submit("half", "a", 1, GPU / 2, &["h100"]);
    let plan = w3.plan();
    assert_eq!(reason(&w3, &plan, "half"), &missing("cannot share a GPU, and it asks for a fraction of one"));
    w3.s.clusters[slurm].fractional_gpus = Some(true);
    let plan = w3.plan();
    assert_eq!(plan.admissions.iter().map(|a| a.cluster).collect::<Vec<_>>(), [slurm], "{plan:?}");
}

#[test]
fn a_full_flavor_says_so_even_where_a_limit_binds_too() {
    // Finding 4: a's limit equals the flavor's 16 GPUs and a runs all 16. Its next job
    // waited with "quota limit reached", as if raising the limit would help; the flavor
    // is full, and that is named first.
    let (mut w, nodes) = two_owners();
    w.s.teams[0].quotas[0].limit = Some(16);
    w.run("a0", "a", &nodes, 2, 8 * GPU, false, 0, 0);
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(
        matches!(reason(&w, &plan, "a1"), Reason::NoClusterFits { attempts }
            if attempts[0].clusters[0].miss == Miss::NotEnoughGpus { free: 0.0, needed: 8.0 }),
        "{:?}",
        reason(&w, &plan, "a1")
    );
    // With room, the limit is the reason.
    w.nodes(0, "h100", 1, 8, None);
    let plan = w.plan();
    assert!(matches!(reason(&w, &plan, "a1"), Reason::QuotaLimitReached { limit: 16.0, .. }));
}

#[test]
fn borrowing_work_on_a_cordoned_cluster_says_cordoned_not_fair_share() {
    // Finding 4: b has no guarantee, so it would borrow; with the only cluster cordoned
    // its fair share is 0, and it said "would borrow beyond its fair share … fair share 0".
    let (mut w, _) = two_owners();
    w.s.teams[1].quotas[0].guaranteed = 0;
    w.submit("b1", "b", 1, GPU, &["h100"]);
    w.s.clusters[0].cordoned = true;
    let plan = w.plan();
    assert_eq!(reason(&w, &plan, "b1"), &Reason::ClustersCordoned);
}

#[test]
fn a_starving_workload_holds_the_quota_it_needs_as_well_as_nodes() {
    // Finding 7 (the preemption ping-pong): department d may hold 6, its team t is
    // guaranteed 8. u (t, 2 GPUs) runs on n1; o (another team, in its own guarantee) fills
    // n0. s (t, 4 GPUs) starves: it is within every quota but no node has 4 free, so n1 is
    // reserved for it. l (t, 2 GPUs, behind s) fits on n2. Admitting it took d to 4, so s
    // (4 more) was above d's limit next cycle, lost its reservation, and — when it could
    // preempt — preempted l, which came back behind it, every other cycle. The
    // reservation now holds s's 4 GPUs of quota too: l waits for the limit.
    let mut w = World::new(&["h100"]);
    let d = w.team("d", None, &[("h100", 8, Some(6), 1)]);
    w.team("t", Some("d"), &[("h100", 8, None, 1)]);
    w.team("o", None, &[("h100", 4, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let n0 = w.nodes(c, "h100", 1, 4, None);
    let n1 = w.nodes(c, "h100", 1, 4, None);
    w.nodes(c, "h100", 1, 2, None);
    w.run("o0", "o", &n0, 1, 4 * GPU, false, 0, 0);
    w.run("u", "t", &n1, 1, 2 * GPU, false, 0, 0);
    let s = w.submit("s", "t", 1, 4 * GPU, &["h100"]);
    w.pending(s).submitted_at = 0;
    w.submit("l", "t", 1, 2 * GPU, &["h100"]);
    for _ in 0..3 {
        let plan = w.plan();
        assert!(plan.admissions.is_empty() && plan.preemptions.is_empty(), "{plan:?}");
        let held = &plan.waiting.iter().find(|x| w.s.pending[x.workload].id == "s").unwrap().reserved_nodes;
        assert_eq!(held, &n1);
        assert!(
            matches!(reason(&w, &plan, "l"), Reason::QuotaLimitReached { team, used: 6.0, limit: 6.0, .. } if *team == d),
            "{:?}",
            reason(&w, &plan, "l")
        );
        w.carry_out(&plan);
    }
    // u ends: s runs on the node held for it, and l beside it (d at 6 of 6).
    w.s.running.retain(|r| r.id != "u");
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["s", "l"]);
    assert_eq!(plan.admissions[0].placement[0].node, n1[0]);
}

#[test]
fn the_checker_notices_idle_gpus_and_reasons_the_snapshot_does_not_bear_out() {
    // The invariants the property tests rely on can fail: a plan that leaves a runnable
    // workload waiting beside free GPUs, with a made-up reason, is caught.
    let (mut w, _) = two_owners();
    w.submit("a1", "a", 1, GPU, &["h100"]);
    let mut plan = w.plan();
    let a = plan.admissions.pop().expect("admitted");
    plan.waiting.push(Waiting {
        workload: a.workload,
        reason: Reason::QuotaLimitReached { team: 0, flavor: 0, used: 0.0, limit: 8.0, requested: 1.0 },
        position: 1,
        team_position: 1,
        reserved_nodes: Vec::new(),
    });
    let wrong = violations(&w.s, &plan);
    assert!(wrong.iter().any(|v| v.contains("could run now")), "{wrong:?}");
    assert!(wrong.iter().any(|v| v.contains("does not bear out")), "{wrong:?}");
}

#[test]
fn a_starving_workload_pauses_its_teams_borrowing() {
    // The second ping-pong the sweep found: t is guaranteed 8 and runs 5.5 GPUs. s (t,
    // non-preemptible, 2 GPUs and 16 cores) starves: only n1 has the cores, and n1 is
    // full, so n1 and 2 GPUs of t's quota are held for it. lo (t, 1 GPU, behind it) would
    // borrow. Admitted, it took t to 8.5 with s's quota released next cycle, so s was
    // above the guarantee, lost its reservation, and another of t's workloads preempted lo,
    // which came back when s reserved again — every other cycle. Now t borrows nothing
    // while s starves with nodes held, and the reason names s.
    let mut w = World::new(&["h100"]);
    w.team("t", None, &[("h100", 8, None, 1)]);
    let c0 = w.cluster("c0", ClusterKind::Sim, &[]);
    let c1 = w.cluster("c1", ClusterKind::Sim, &[]);
    let n0 = w.nodes(c0, "h100", 1, 8, None);
    let n1 = w.nodes(c1, "h100", 1, 4, None);
    w.s.nodes[n0[0]].cpus_milli = 8_000;
    w.run("half", "t", &n0, 3, GPU / 2, false, 0, 0);
    w.run("full", "t", &n1, 4, GPU, false, 0, 0);
    let s = w.submit("s", "t", 1, 2 * GPU, &["h100"]);
    w.pending(s).preemptible = false;
    w.pending(s).submitted_at = 0;
    w.pending(s).tasks.cpus_milli = 16_000;
    let lo = w.submit("lo", "t", 1, GPU, &["h100"]);
    w.pending(lo).priority = -1;
    for _ in 0..3 {
        let plan = w.plan();
        assert!(plan.admissions.is_empty() && plan.preemptions.is_empty(), "{plan:?}");
        let held = &plan.waiting.iter().find(|x| w.s.pending[x.workload].id == "s").unwrap().reserved_nodes;
        assert_eq!(held, &n1);
        assert!(
            matches!(reason(&w, &plan, "lo"), Reason::BorrowingPaused { workload, .. } if w.s.pending[*workload].id == "s"),
            "{:?}",
            reason(&w, &plan, "lo")
        );
        w.carry_out(&plan);
    }
}

#[test]
fn a_starving_parent_workload_does_not_reserve_what_its_child_team_is_guaranteed() {
    // The third ping-pong the sweep found. Department d (guaranteed 16) runs 1 GPU of its
    // own; its child t (guaranteed 8) runs 6 and wants 3 more. p1 (t, priority 1, 2 GPUs,
    // 48 cores: only n0 has them) preempts t's own r2 to run within t's guarantee. With r2
    // gone, d's starving 8-GPU s looked within d's guarantee (1 + 6 + 8 <= 16) and took n0
    // for its reservation; p1 could not start, r2 came back (t's own guarantee), s was
    // above d's guarantee again, and p1 preempted r2 again, every other cycle. What t
    // waits for within its guarantee is t's: s reserves nothing, and p1 runs.
    let mut w = World::new(&["h100"]);
    w.team("d", None, &[("h100", 16, None, 1)]);
    w.team("t", Some("d"), &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let n0 = w.nodes(c, "h100", 1, 8, None);
    let n2 = w.nodes(c, "h100", 1, 8, None);
    w.s.nodes[n2[0]].cpus_milli = 32_000;
    w.run("r3a", "t", &n0, 1, 2 * GPU, false, 0, 0);
    w.run("r3b", "t", &n2, 1, 4 * GPU, false, 0, 0);
    w.run("r2", "t", &n2, 1, GPU, false, 0, 0);
    w.run("r0", "d", &n2, 1, GPU, false, 0, 0);
    for r in &mut w.s.running {
        r.preemptible = r.id == "r2";
    }
    let s = w.submit("s", "d", 1, 8 * GPU, &["h100"]);
    w.pending(s).preemptible = false;
    w.pending(s).submitted_at = 0;
    let p1 = w.submit("p1", "t", 1, 2 * GPU, &["h100"]);
    w.pending(p1).priority = 1;
    w.pending(p1).preemptible = false;
    w.pending(p1).tasks.cpus_milli = 48_000;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["r2"]);
    w.carry_out(&plan);
    w.finish_stopping(true);
    let plan = w.plan();
    // r2 comes back beside it, lent n2's free GPU past t's fair share (no other work can
    // use it), and is not preempted again below.
    assert_eq!(admitted(&w, &plan), ["p1", "r2"]);
    assert_eq!(plan.admissions[0].placement[0].node, n0[0]);
    let held = &plan.waiting.iter().find(|x| w.s.pending[x.workload].id == "s").unwrap().reserved_nodes;
    assert!(held.is_empty(), "{held:?}");
    w.carry_out(&plan);
    for _ in 0..3 {
        let plan = w.plan();
        assert!(plan.preemptions.is_empty(), "{plan:?}");
        w.carry_out(&plan);
    }
}

#[test]
fn a_starving_workload_holding_quota_within_the_guarantee_pauses_its_teams_borrowing() {
    // The fourth ping-pong the sweep found (replayed whole by plan_properties from
    // tests/ping_pongs): t's non-preemptible np preempted t's low-priority v to run within
    // t's guarantee; next cycle t's starving, preemptible s held spot nodes and quota
    // within the guarantee, so np was above it and waited, and the requeued v came back
    // borrowed beside s's hold. With v running, s was beyond the guarantee, lost its hold
    // to another team's starving work, np preempted v again — every other cycle. Here: t
    // is guaranteed 8 and runs 4 (non-preemptible) on the spot node s needs; s holds that
    // node and 4 GPUs of quota (8 of 8), np waits for the guarantee, and v may not borrow
    // while s holds quota within it, though n1 has room.
    let mut w = World::new(&["h100"]);
    w.team("t", None, &[("h100", 8, None, 1)]);
    w.team("o", None, &[("h100", 8, None, 1)]);
    let spot = w.cluster("spot", ClusterKind::Sim, &[("tier", "spot")]);
    let c1 = w.cluster("c1", ClusterKind::Sim, &[]);
    let n0 = w.nodes(spot, "h100", 1, 4, None);
    w.nodes(c1, "h100", 1, 8, None);
    w.run("busy", "t", &n0, 1, 4 * GPU, false, 0, 0);
    w.s.running[0].preemptible = false;
    let s = w.submit("s", "t", 1, 4 * GPU, &["h100"]);
    w.pending(s).submitted_at = 0;
    w.pending(s).cluster_selector.insert("tier".into(), "spot".into());
    let np = w.submit("np", "t", 1, 3 * GPU, &["h100"]);
    w.pending(np).preemptible = false;
    let v = w.submit("v", "t", 1, 3 * GPU, &["h100"]);
    w.pending(v).priority = -2;
    for _ in 0..3 {
        let plan = w.plan();
        assert!(plan.admissions.is_empty() && plan.preemptions.is_empty(), "{plan:?}");
        let held = &plan.waiting.iter().find(|x| x.workload == s).unwrap().reserved_nodes;
        assert_eq!(held, &n0);
        assert!(
            matches!(reason(&w, &plan, "np"), Reason::GuaranteeExceeded { used: 8.0, guaranteed: 8.0, .. }),
            "{:?}",
            reason(&w, &plan, "np")
        );
        assert_eq!(reason(&w, &plan, "v"), &Reason::BorrowingPaused { flavor: 0, workload: s });
        w.carry_out(&plan);
    }
    // The busy work ends: s runs on its node, np within the guarantee (7 of 8), and v,
    // no longer kept from borrowing, beyond it.
    w.s.running.retain(|r| r.id != "busy");
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["s", "np", "v"]);
    assert_eq!(plan.admissions.iter().map(|a| a.borrowed).collect::<Vec<_>>(), [false, false, true]);
}

#[test]
fn work_being_preempted_holds_its_quota_until_it_has_stopped() {
    // The fault-injection finding: department d may hold 16 (its guarantee); mb borrows
    // ma's idle 8 and runs 16. ma asks for its 8: mb's borrowed job is preempted, and
    // while it runs out its grace period it still holds 8 of d's 16 — so neither ma's job
    // nor mb's next one may start until the backend says it stopped (before, both could:
    // d ran 24 GPUs for the whole grace period).
    let mut w = World::new(&["h100"]);
    w.team("d", None, &[("h100", 16, Some(16), 1)]);
    w.team("ma", Some("d"), &[("h100", 8, None, 1)]);
    w.team("mb", Some("d"), &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 4, 8, None);
    w.run("mb0", "mb", &nodes[..1], 1, 8 * GPU, false, 0, 0);
    w.run("mb1", "mb", &nodes[1..2], 1, 8 * GPU, true, 0, 0);
    let ma = w.submit("ma", "ma", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["mb1"]);
    w.carry_out(&plan);
    w.submit("mb2", "mb", 1, 4 * GPU, &["h100"]);
    for _ in 0..3 {
        // mb1 is still stopping: two nodes are free, but d's 16 are all held.
        let plan = w.plan();
        assert!(plan.admissions.is_empty() && plan.preemptions.is_empty(), "{plan:?}");
        let mb1 = w.s.running.iter().position(|r| r.id == "mb1").unwrap();
        assert!(
            matches!(reason(&w, &plan, "ma"), Reason::WaitingForReclaim { victims, .. } if victims == &[mb1]),
            "{:?}",
            reason(&w, &plan, "ma")
        );
        assert!(
            matches!(reason(&w, &plan, "mb2"), Reason::QuotaLimitReached { used, limit: 16.0, .. } if *used > 16.0),
            "{:?}",
            reason(&w, &plan, "mb2")
        );
        w.carry_out(&plan);
    }
    w.finish_stopping(false);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["ma"]);
    assert_eq!(plan.admissions[0].workload, ma);
}

#[test]
fn a_preempted_workload_comes_back_only_after_its_preemptor_has_started() {
    // The sixth ping-pong the sweep found, made small: t may hold 8 and runs other (2,
    // non-preemptible) and lo (2). hi (priority 1, 5 GPUs) needs lo gone to stay within 8
    // and preempts it. When lo has stopped, t's starving top (priority 2) holds 2 GPUs of
    // quota for a full spot node, so hi no longer fits (2 + 2 + 5 > 8) — but lo would
    // (2 + 2 + 2). Admitted, lo made top's hold come and go with it, and hi preempted lo
    // every other cycle. Now lo waits for hi, naming it, until hi has started.
    let mut w = World::new(&["h100"]);
    w.team("t", None, &[("h100", 8, Some(8), 1)]);
    w.team("o", None, &[("h100", 2, None, 1)]);
    let spot = w.cluster("spot", ClusterKind::Sim, &[("tier", "spot")]);
    let c1 = w.cluster("c1", ClusterKind::Sim, &[]);
    let full = w.nodes(spot, "h100", 1, 2, None);
    let n1 = w.nodes(c1, "h100", 1, 8, None);
    w.run("other", "t", &n1, 1, 2 * GPU, false, 0, 0);
    w.s.running[0].preemptible = false;
    w.run("lo", "t", &n1, 1, 2 * GPU, false, 0, 0);
    w.run("outside", "o", &full, 1, 2 * GPU, false, 0, 0);
    let hi = w.submit("hi", "t", 1, 5 * GPU, &["h100"]);
    w.pending(hi).priority = 1;
    w.pending(hi).preemptible = false;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["lo"]);
    w.carry_out(&plan);
    w.finish_stopping(true);
    let top = w.submit("top", "t", 1, 2 * GPU, &["h100"]);
    w.pending(top).priority = 2;
    w.pending(top).submitted_at = 0;
    w.pending(top).cluster_selector.insert("tier".into(), "spot".into());
    for _ in 0..3 {
        let plan = w.plan();
        assert!(plan.admissions.is_empty() && plan.preemptions.is_empty(), "{plan:?}");
        assert!(
            matches!(reason(&w, &plan, "hi"), Reason::QuotaLimitReached { used: 4.0, limit: 8.0, .. }),
            "{:?}",
            reason(&w, &plan, "hi")
        );
        let hi = w.s.pending.iter().position(|p| p.id == "hi").unwrap();
        assert_eq!(reason(&w, &plan, "lo"), &Reason::WaitingForPreemptor { workload: hi });
        w.carry_out(&plan);
    }
    // top's node frees up: top runs, and with 4 of 8 left hi cannot, so lo is still kept
    // out only while hi waits; hi is deleted, and lo runs.
    w.s.running.retain(|r| r.id != "outside");
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["top"]);
    w.carry_out(&plan);
    let hi = w.s.pending.iter().position(|p| p.id == "hi").unwrap();
    w.s.pending.remove(hi);
    w.s.link_preemptors(&w.preemptor_of);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["lo"]);
}

#[test]
fn work_without_a_script_or_command_never_goes_to_slurm() {
    // Slurm suits training best, but a Slurm job is a batch script: a workload that gives
    // neither script nor command was admitted there and failed BackendRejected. It goes
    // where it can run; with Slurm alone it can never run, and says why.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    let slurm = w.cluster("slurm", ClusterKind::Slurm, &[]);
    w.nodes(slurm, "h100", 1, 8, None);
    let sim = w.cluster("sim", ClusterKind::Sim, &[]);
    w.nodes(sim, "h100", 1, 8, None);
    let script = w.submit("script", "a", 1, GPU, &["h100"]);
    let bare = w.submit("bare", "a", 1, GPU, &["h100"]);
    w.pending(bare).has_command = false;
    let plan = w.plan();
    let cluster_of =
        |w: &World, id: &str| plan.admissions.iter().find(|a| w.s.pending[a.workload].id == id).unwrap().cluster;
    assert_eq!((cluster_of(&w, "script"), cluster_of(&w, "bare")), (slurm, sim));

    w.s.clusters[sim].kind = ClusterKind::Slurm;
    w.pending(script).has_command = false;
    let plan = w.plan();
    let missing = "run only batch scripts, and it gives no script or command (spec.run.script, spec.run.command)";
    assert_eq!(
        reason(&w, &plan, "bare"),
        &Reason::Unschedulable { why: vec![Impossible::NotCapable { flavor: 0, missing: missing.into() }] }
    );
}

#[test]
fn work_within_its_min_runtime_is_not_reclaimed_and_the_owner_is_told_until_when() {
    // b borrows a's idle 8 with a job protected for 30 minutes from its start (now − 600);
    // a's own job waits, naming the protected job and when its protection ends; from then
    // on the job is reclaimed as any borrowed work.
    let (mut w, nodes) = two_owners();
    let now = w.s.now;
    w.run("b-own", "b", &nodes[1..], 1, 8 * GPU, false, 0, now - 600);
    let borrowed = w.run("b-borrowed", "b", &nodes[..1], 1, 8 * GPU, true, 0, now - 600);
    w.s.running[borrowed].protected_until = now - 600 + 1800;
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(plan.preemptions.is_empty());
    let until = now + 1200;
    assert!(
        matches!(reason(&w, &plan, "a1"), Reason::WaitingForMinRuntime { victims, until: u, .. }
            if victims == &[borrowed] && *u == until),
        "{:?}",
        reason(&w, &plan, "a1")
    );

    w.s.now = until;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["b-borrowed"]);
}

#[test]
fn a_second_workload_of_the_team_is_not_told_it_preempts_the_same_protected_work() {
    // As above, and a submits two 8-GPU jobs: a1 waits for b's protected borrowed job and
    // holds a's guarantee; a2 would be beyond it, so it is not told it preempts that job
    // once it may (a2 waited on after a1 had taken it).
    let (mut w, nodes) = two_owners();
    let now = w.s.now;
    w.run("b-own", "b", &nodes[1..], 1, 8 * GPU, false, 0, now - 600);
    let borrowed = w.run("b-borrowed", "b", &nodes[..1], 1, 8 * GPU, true, 0, now - 600);
    w.s.running[borrowed].protected_until = now + 1200;
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    w.submit("a2", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(matches!(reason(&w, &plan, "a1"), Reason::WaitingForMinRuntime { victims, .. } if victims == &[borrowed]));
    assert!(!matches!(reason(&w, &plan, "a2"), Reason::WaitingForMinRuntime { .. }), "{:?}", reason(&w, &plan, "a2"));
}

#[test]
fn two_teams_are_not_told_they_preempt_the_same_protected_work() {
    // Found from outside: a and c (guaranteed 8 each) both waited for b's x, whose
    // protection ends first, and were both told they would preempt it; once it could be,
    // a took it and c waited on, told nothing true. c is told of y, protected longer.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    w.team("c", None, &[("h100", 8, None, 1)]);
    w.team("b", None, &[("h100", 0, None, 1)]);
    let cl = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(cl, "h100", 2, 8, None);
    let now = w.s.now;
    let x = w.run("x", "b", &nodes[..1], 1, 8 * GPU, true, 0, now - 600);
    let y = w.run("y", "b", &nodes[1..], 1, 8 * GPU, true, 0, now - 300);
    w.s.running[x].protected_until = now + 300;
    w.s.running[y].protected_until = now + 900;
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    w.submit("c1", "c", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    let told = |id: &str| match reason(&w, &plan, id) {
        Reason::WaitingForMinRuntime { victims, until, .. } => (victims.clone(), *until),
        other => panic!("{id}: {other:?}"),
    };
    let (first, second) = (told("a1"), told("c1"));
    assert_ne!(first.0, second.0, "{first:?} {second:?}");
    let mut named = [first.0[0], second.0[0]];
    named.sort_unstable();
    assert_eq!(named, [x, y]);
    for (victims, until) in [first, second] {
        assert_eq!(until, w.s.running[victims[0]].protected_until);
    }
}

#[test]
fn a_workload_waiting_for_protected_work_names_what_is_freed_first_and_when() {
    // b borrows 16 beside its own 8: x3 and x4 (4 each, on one node, protected 100 and
    // 150 s more) and x5 (8, started last, protected 500 s more). a's 8 waits: it named x5
    // (the cheapest victim) and 500 s, and was admitted 150 s on, on x3's and x4's node.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    w.team("b", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 3, 8, None);
    let now = w.s.now;
    w.run("b-own", "b", &nodes[2..], 1, 8 * GPU, false, 0, now - 900);
    let x3 = w.run("x3", "b", &nodes[..1], 1, 4 * GPU, true, 0, now - 500);
    let x4 = w.run("x4", "b", &nodes[..1], 1, 4 * GPU, true, 0, now - 450);
    let x5 = w.run("x5", "b", &nodes[1..2], 1, 8 * GPU, true, 0, now - 100);
    for (r, until) in [(x3, now + 100), (x4, now + 150), (x5, now + 500)] {
        w.s.running[r].protected_until = until;
    }
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert!(
        matches!(reason(&w, &plan, "a1"), Reason::WaitingForMinRuntime { victims, until, .. }
            if victims == &[x3, x4] && *until == now + 150),
        "{:?}",
        reason(&w, &plan, "a1")
    );
    w.s.now += 150;
    let mut taken = preempted(&w, &w.plan());
    taken.sort_unstable();
    assert_eq!(taken, ["x3", "x4"]);
}

#[test]
fn running_work_borrows_as_the_guarantees_stand_now() {
    // a's guarantee was taken (8 → 0) while x1 ran in it, and b's raised to 16: b's second
    // job is within b's guarantee, and x1 is beyond a's now, so it is reclaimed. Before,
    // x1 kept the in-quota of its admission and b2 waited until x1 ended.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    w.team("b", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 2, 8, None);
    let x1 = w.run("x1", "a", &nodes[..1], 1, 8 * GPU, false, 0, 0);
    w.run("b1", "b", &nodes[1..], 1, 8 * GPU, false, 0, 0);
    w.submit("b2", "b", 1, 8 * GPU, &["h100"]);
    // The quota preview says so (it said "nothing would change").
    let moved = [("a", 0), ("b", 16)].map(|(team, guaranteed)| Change::SetQuota {
        team: team.into(),
        flavor: "h100".into(),
        quota: Quota { guaranteed, limit: None, weight: 1 },
    });
    assert_eq!(what_if(&w.s, &moved).unwrap().diff.preempted, ["x1"]);
    w.s.teams[0].quotas[0].guaranteed = 0;
    w.s.teams[1].quotas[0].guaranteed = 16;
    assert!(w.plan().preemptions.is_empty(), "as admitted, x1 is in-quota");
    w.s.settle_borrowed();
    assert!(w.s.running[x1].borrowed);
    assert_eq!(preempted(&w, &w.plan()), ["x1"]);

    // The other way: a2 was admitted beyond a's guarantee beside a1, which has ended; alone
    // it is within it now, and b (guaranteed 8 too, on 8 GPUs) may not take it back.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    w.team("b", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 1, 8, None);
    let a2 = w.run("a2", "a", &nodes, 1, 8 * GPU, true, 0, 0);
    w.submit("b1", "b", 1, 8 * GPU, &["h100"]);
    assert_eq!(preempted(&w, &w.plan()), ["a2"], "as admitted, a2 is borrowed");
    w.s.settle_borrowed();
    assert!(!w.s.running[a2].borrowed);
    assert!(w.plan().preemptions.is_empty());
}

#[test]
fn a_departments_own_work_runs_in_what_its_teams_guarantees_leave_and_a_child_takes_the_rest_back() {
    // Found from outside (a platform engineer, limits equal to guarantees): department d
    // (guaranteed 16, limit 16) ran 16 GPUs of its own while its child c (guaranteed 16)
    // was idle; c's job then waited with nothing, as d's work counted in-quota. c's
    // guarantee is c's: d's own work runs in d's guarantee less c's (0 here), so it is
    // borrowed, and c takes it back.
    let mut w = World::new(&["h100"]);
    w.team("d", None, &[("h100", 16, Some(16), 1)]);
    w.team("c", Some("d"), &[("h100", 16, None, 1)]);
    let cl = w.cluster("c1", ClusterKind::Sim, &[]);
    w.nodes(cl, "h100", 2, 8, None);
    w.submit("d1", "d", 1, 8 * GPU, &["h100"]);
    w.submit("d2", "d", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["d1", "d2"]);
    assert!(plan.admissions.iter().all(|a| a.borrowed), "{plan:?}");
    w.carry_out(&plan);
    let c1 = w.submit("c1", "c", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    let victims = preempted(&w, &plan);
    assert_eq!(victims.len(), 1, "{victims:?}");
    assert!(
        plan.preemptions.iter().all(|p| p.cause == PreemptionCause::Reclaim { team: w.team_ix("c"), workload: c1 })
    );
    w.carry_out(&plan);
    w.finish_stopping(true);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["c1"]);
    assert!(!plan.admissions[0].borrowed);

    // Work d ran in-quota as its guarantee stood before c was placed under it is settled
    // borrowed, and d's non-preemptible work, which may run only in-quota, can never run:
    // refused, saying why.
    let mut w = World::new(&["h100"]);
    w.team("d", None, &[("h100", 16, Some(16), 1)]);
    w.team("c", Some("d"), &[("h100", 12, None, 1)]);
    let cl = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes_d = w.nodes(cl, "h100", 2, 8, None);
    let r = w.run("d-old", "d", &nodes_d[..1], 1, 8 * GPU, false, 0, 0);
    w.s.settle_borrowed();
    assert!(w.s.running[r].borrowed, "d's own guarantee is 4 of its 16");
    let np = w.submit("np", "d", 1, 8 * GPU, &["h100"]);
    w.pending(np).preemptible = false;
    let plan = w.plan();
    match reason(&w, &plan, "np") {
        Reason::Unschedulable { why } => {
            assert!(matches!(why[0], Impossible::AboveGuarantee { guaranteed, .. } if guaranteed == 4.0), "{why:?}");
            assert!(
                why[0].describe(&w.s).contains("team d's own work (its guarantee less its teams') is guaranteed 4")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_preview_of_a_moved_guarantee_names_protected_and_non_preemptible_work() {
    // Found from outside: vision's guarantee given to speech while vision's x1 ran in it
    // within its min runtime, or non-preemptible. The preview said nothing would change;
    // x1 was preempted 10 minutes later, or ran on while speech waited.
    let moved = [("a", 0), ("b", 16)].map(|(team, guaranteed)| Change::SetQuota {
        team: team.into(),
        flavor: "h100".into(),
        quota: Quota { guaranteed, limit: None, weight: 1 },
    });
    for protected in [true, false] {
        let mut w = World::new(&["h100"]);
        w.team("a", None, &[("h100", 8, None, 1)]);
        w.team("b", None, &[("h100", 8, None, 1)]);
        let c = w.cluster("c1", ClusterKind::Sim, &[]);
        let nodes = w.nodes(c, "h100", 2, 8, None);
        let x1 = w.run("x1", "a", &nodes[..1], 1, 8 * GPU, false, 0, 0);
        if protected {
            w.s.running[x1].protected_until = w.s.now + 600;
        } else {
            w.s.running[x1].preemptible = false;
        }
        w.run("b1", "b", &nodes[1..], 1, 8 * GPU, false, 0, 0);
        w.submit("b2", "b", 1, 8 * GPU, &["h100"]);
        w.s.settle_borrowed();
        let diff = what_if(&w.s, &moved).unwrap().diff;
        assert!(diff.preempted.is_empty(), "{diff:?}");
        if protected {
            assert_eq!(diff.preempted_once_protected_ends, ["x1"]);
            assert!(diff.kept_beyond_guarantee.is_empty());
        } else {
            assert_eq!(diff.kept_beyond_guarantee, ["x1"]);
            assert!(diff.preempted_once_protected_ends.is_empty());
        }
    }
}

#[test]
fn min_runtime_holds_off_priority_preemption_and_unprotected_work_is_taken_first() {
    // a runs two low-priority 4-GPU jobs on its guarantee: the cheaper victim (started
    // last) is protected, so an urgent 4-GPU job of a preempts the other one; with both
    // protected it preempts nothing and says why.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 1, 8, None);
    let now = w.s.now;
    let older = w.run("a-older", "a", &nodes, 1, 4 * GPU, false, -5, now - 7200);
    let newer = w.run("a-newer", "a", &nodes, 1, 4 * GPU, false, -5, now - 60);
    w.s.running[newer].protected_until = now + 540;
    let urgent = w.submit("a-urgent", "a", 1, 4 * GPU, &["h100"]);
    w.pending(urgent).priority = 100;
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["a-older"]);

    w.s.running[older].protected_until = now + 60;
    let plan = w.plan();
    assert!(plan.preemptions.is_empty());
    // Either job alone makes room: the one whose protection ends first is named, as it is
    // the one preempted then (the cheaper one, started last, was named, with 540 s).
    assert!(
        matches!(reason(&w, &plan, "a-urgent"), Reason::WaitingForMinRuntime { victims, until, .. }
            if victims == &[older] && *until == now + 60),
        "{:?}",
        reason(&w, &plan, "a-urgent")
    );
    w.s.now += 60;
    assert_eq!(preempted(&w, &w.plan()), ["a-older"]);
}

#[test]
fn the_checker_refuses_a_plan_that_preempts_work_within_its_min_runtime() {
    let (mut w, nodes) = two_owners();
    let now = w.s.now;
    w.run("b-own", "b", &nodes[1..], 1, 8 * GPU, false, 0, now - 600);
    let borrowed = w.run("b-borrowed", "b", &nodes[..1], 1, 8 * GPU, true, 0, now - 600);
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    let plan = berth_sched::schedule(&w.s).unwrap();
    assert_eq!(preempted(&w, &plan), ["b-borrowed"]);
    w.s.running[borrowed].protected_until = now + 1;
    assert!(
        violations(&w.s, &plan).iter().any(|v| v.contains("within its min runtime")),
        "{:?}",
        violations(&w.s, &plan)
    );
}

#[test]
fn a_teams_min_runtime_covers_its_subtree_which_may_only_lower_it_as_may_a_workload() {
    use berth_sched::snapshot::min_runtime;
    let mut w = World::new(&["h100"]);
    let dept = w.team("dept", None, &[]);
    let team = w.team("team", Some("dept"), &[]);
    let sub = w.team("sub", Some("team"), &[]);
    let greedy = w.team("greedy", Some("dept"), &[]);
    let other = w.team("other", None, &[]);
    let shielded = w.team("shielded", Some("other"), &[]);
    w.s.teams[dept].min_runtime_seconds = Some(3600);
    w.s.teams[team].min_runtime_seconds = Some(600);
    w.s.teams[greedy].min_runtime_seconds = Some(86_400);
    w.s.teams[shielded].min_runtime_seconds = Some(86_400);
    let teams = &w.s.teams;
    // The lowest set on the way up; a team that sets none allows what its parent does.
    assert_eq!(min_runtime(teams, sub, None), 600);
    assert_eq!(min_runtime(teams, dept, None), 3600);
    // A sub-team's admin cannot grant more than the department was granted…
    assert_eq!(min_runtime(teams, greedy, None), 3600);
    // …nor any where the top-level team grants none.
    assert_eq!(min_runtime(teams, other, None), 0);
    assert_eq!(min_runtime(teams, shielded, None), 0);
    // A workload may ask for less, never more.
    assert_eq!(min_runtime(teams, sub, Some(60)), 60);
    assert_eq!(min_runtime(teams, sub, Some(7200)), 600);
    assert_eq!(min_runtime(teams, other, Some(60)), 0);
}

/// A workload that accepts several flavors takes the first in its list with room by
/// default. With `best_fit` it takes the one where it leaves the least room unused, so the
/// whole 8-GPU node stays free for the 8-GPU job behind it. Best fit still prefers the
/// team's guarantee to borrowing.
#[test]
fn best_fit_flavors_leave_whole_nodes_to_big_work_and_still_prefer_the_guarantee() {
    use berth_core::workload::FlavorPolicy;
    let world = || {
        let mut w = World::new(&["h100", "l4"]);
        w.team("t", None, &[("h100", 8, None, 1), ("l4", 2, None, 1)]);
        let c = w.cluster("c", ClusterKind::Sim, &[]);
        w.nodes(c, "h100", 1, 8, None);
        w.nodes(c, "l4", 1, 2, None);
        w
    };
    for (policy, admitted_ids, small_on) in
        [(FlavorPolicy::Ordered, vec!["small"], "h100"), (FlavorPolicy::BestFit, vec!["small", "big"], "l4")]
    {
        let mut w = world();
        let small = w.submit("small", "t", 1, GPU, &["h100", "l4"]);
        w.pending(small).flavor_policy = policy;
        w.submit("big", "t", 1, 8 * GPU, &["h100"]);
        let plan = w.plan();
        assert_eq!(admitted(&w, &plan), admitted_ids, "{policy:?}");
        assert_eq!(w.s.flavors[plan.admissions[0].flavor], small_on, "{policy:?}");
    }

    // The l4 guarantee is used up (by running work): best fit borrows nothing while the
    // h100 guarantee has room, though l4 would leave less unused.
    let mut w = world();
    let l4 = w.s.nodes.iter().position(|n| w.s.flavors[n.flavor] == "l4").unwrap();
    w.run("l4-job", "t", &[l4], 1, GPU, false, 0, w.s.now - 60);
    w.s.teams[0].quotas[1].guaranteed = 1;
    let small = w.submit("small", "t", 1, GPU, &["l4", "h100"]);
    w.pending(small).flavor_policy = FlavorPolicy::BestFit;
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["small"]);
    assert_eq!(w.s.flavors[plan.admissions[0].flavor], "h100");
    assert!(!plan.admissions[0].borrowed);
}

/// research is guaranteed 8 with a limit of 8; its child nlp has no guarantee, its child
/// vision all 8. One 8-GPU node; nlp runs four borrowed 2-GPU jobs.
fn nlp_borrows_vision_s_node() -> (World, Vec<usize>) {
    let mut w = World::new(&["h100"]);
    w.team("research", None, &[("h100", 8, Some(8), 1)]);
    w.team("nlp", Some("research"), &[("h100", 0, Some(8), 1)]);
    w.team("vision", Some("research"), &[("h100", 8, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let node = w.nodes(c, "h100", 1, 8, None);
    for i in 0..4 {
        w.run(&format!("n{i}"), "nlp", &node, 1, 2 * GPU, true, 0, 0);
    }
    (w, node)
}

#[test]
fn a_second_reclaim_shares_the_node_the_first_holds_instead_of_waiting_for_its_victims() {
    let (mut w, node) = nlp_borrows_vision_s_node();

    // vision asks for 2: one nlp job is preempted for it, and vision waits on the node.
    w.submit("reca", "vision", 1, 2 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan).len(), 1);
    assert!(matches!(reason(&w, &plan, "reca"), Reason::WaitingForReclaim { .. }));
    w.carry_out(&plan);

    // While that job stops, vision asks for 2 more. nlp still runs 6 over its fair share
    // of 4, and the node has room for both once two of nlp's jobs are gone: a second job
    // is preempted now, for recb, on the node reca holds too. (It used to wait with
    // NoClusterFits until reca's victim was gone, then preempt, and wait a second grace
    // period.)
    w.submit("recb", "vision", 1, 2 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan).len(), 1, "{plan:?}");
    assert!(matches!(reason(&w, &plan, "reca"), Reason::WaitingForReclaim { .. }));
    assert!(matches!(reason(&w, &plan, "recb"), Reason::WaitingForReclaim { .. }), "{plan:?}");
    let victims = |id: &str| match reason(&w, &plan, id) {
        Reason::WaitingForReclaim { victims, .. } => victims.clone(),
        _ => unreachable!(),
    };
    assert!(victims("reca").iter().all(|v| !victims("recb").contains(v)), "each counts on its own victim");
    for id in ["reca", "recb"] {
        let held = &plan.waiting.iter().find(|x| w.s.pending[x.workload].id == id).unwrap().reserved_nodes;
        assert_eq!(held, &node, "{id} holds the node");
    }
    w.carry_out(&plan);

    // A third ask: nlp keeps 4 running against a fair share of 2 now, so a third job goes,
    // again on the same node.
    w.submit("recc", "vision", 1, 2 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan).len(), 1, "{plan:?}");
    w.carry_out(&plan);
    // Once the three victims are gone, all three run.
    w.finish_stopping(true);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["reca", "recb", "recc"]);
}

#[test]
fn two_reclaims_in_one_cycle_each_preempt_for_themselves_on_one_node() {
    // As above, with both asks in the same cycle: two nlp jobs go at once.
    let (mut w, _) = nlp_borrows_vision_s_node();
    w.submit("reca", "vision", 1, 2 * GPU, &["h100"]);
    w.submit("recb", "vision", 1, 2 * GPU, &["h100"]);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan).len(), 2, "{plan:?}");
    for id in ["reca", "recb"] {
        assert!(matches!(reason(&w, &plan, id), Reason::WaitingForReclaim { .. }), "{id}: {plan:?}");
    }
    w.carry_out(&plan);
    w.finish_stopping(true);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["reca", "recb"]);
}

#[test]
fn a_reclaim_whose_victim_stopped_first_waits_on_the_held_node_instead_of_preempting_again() {
    // research (guaranteed 8, limit 8) holds vision (8) and nlp (0); nlp borrows node n
    // (a 6-GPU and a 2-GPU job). Team d borrows node m (4 GPUs) and is above its fair share:
    // e waits for GPUs too.
    let mut w = World::new(&["h100"]);
    w.team("research", None, &[("h100", 8, Some(8), 1)]);
    w.team("vision", Some("research"), &[("h100", 8, None, 1)]);
    w.team("nlp", Some("research"), &[("h100", 0, Some(8), 1)]);
    w.team("d", None, &[("h100", 0, None, 1)]);
    w.team("e", None, &[("h100", 0, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let n = w.nodes(c, "h100", 1, 8, None);
    let m = w.nodes(c, "h100", 1, 4, None);
    w.run("v1", "nlp", &n, 1, 6 * GPU, true, 0, 0);
    w.run("v2", "nlp", &n, 1, 2 * GPU, true, 0, 10);
    w.run("v3", "d", &m, 1, 4 * GPU, true, 0, 0);
    w.submit("e1", "e", 1, 4 * GPU, &["h100"]);
    w.submit("r1", "vision", 1, 6 * GPU, &["h100"]);
    w.submit("r2", "vision", 1, 2 * GPU, &["h100"]);
    // r1 reclaims v1 and r2 v2, both on n (d's job frees no room under research's limit).
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), ["v1", "v2"], "{plan:?}");
    w.carry_out(&plan);
    // v2 stops first. Its 2 GPUs are free on n, which r1 holds while v1 stops: r2 waits for
    // them, and d's job is not preempted for r2 a second time.
    w.finish_stopping_where(|r| r.id == "v2", false);
    let plan = w.plan();
    assert_eq!(preempted(&w, &plan), Vec::<String>::new(), "{plan:?}");
    assert!(matches!(reason(&w, &plan, "r1"), Reason::WaitingForReclaim { .. }));
    assert!(!matches!(reason(&w, &plan, "r2"), Reason::WaitingForReclaim { .. }), "{plan:?}");
    w.carry_out(&plan);
    // Once v1 is gone, both run on n.
    w.finish_stopping(false);
    let plan = w.plan();
    assert_eq!(admitted(&w, &plan), ["r1", "r2"], "{plan:?}");
}

#[test]
fn a_workload_waiting_for_protected_work_is_expected_to_start_when_the_protection_ends() {
    // Found from outside: why said a1 waits for x's min runtime, which ends in 5 minutes,
    // and that it was expected to start in an hour, when x reaches its runtime limit.
    let mut w = World::new(&["h100"]);
    w.team("a", None, &[("h100", 8, None, 1)]);
    w.team("b", None, &[("h100", 0, None, 1)]);
    let c = w.cluster("c1", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 1, 8, None);
    let now = w.s.now;
    let x = w.run("x", "b", &nodes, 1, 8 * GPU, true, 0, now - 60);
    w.s.running[x].protected_until = now + 300;
    w.submit("a1", "a", 1, 8 * GPU, &["h100"]);
    assert!(matches!(reason(&w, &w.plan(), "a1"), Reason::WaitingForMinRuntime { .. }));
    let estimates = berth_sched::estimate::start_times(&w.s, &[Some(now + 3600)], &[Some(600)], &[1.0], 50);
    let e = estimates[0].clone().expect("an estimate");
    assert_eq!((e.at, e.after), (now + 300, Some(berth_sched::estimate::After::ProtectionEnds("x".into()))));
}

/// ml (guaranteed 4) holds two 8-GPU nodes with 1-GPU jobs: 4 in its guarantee on n0, 12
/// borrowed. Its 8 newest borrowed jobs, the cheapest victims, are 4 on each node. research
/// (guaranteed 12, holding nothing) wants 8 GPUs: its demand brings ml's fair share to 8,
/// so only 8 of ml's may go, and the 8 cheapest free neither node. Found from outside:
/// research waited with "no cluster has room" for as long as nothing changed. The 8
/// borrowed on n1 are victims as good: they are preempted, and research waits for n1.
#[test]
fn a_reclaim_capped_at_the_fair_share_takes_its_victims_from_one_node() {
    let mut w = World::new(&["h100"]);
    w.team("ml", None, &[("h100", 4, Some(16), 1)]);
    w.team("research", None, &[("h100", 12, Some(28), 1)]);
    let c = w.cluster("sim", ClusterKind::Sim, &[]);
    let nodes = w.nodes(c, "h100", 2, 8, None);
    // Started at 1..=16: the later, the cheaper. n0: a1-a4 (in quota), b1-b4; n1: a9-a12, b5-b8.
    for (i, (name, node, borrowed)) in (1..=4)
        .map(|k| (format!("a{k}"), 0, false))
        .chain((9..=12).map(|k| (format!("a{k}"), 1, true)))
        .chain((1..=4).map(|k| (format!("b{k}"), 0, true)))
        .chain((5..=8).map(|k| (format!("b{k}"), 1, true)))
        .enumerate()
    {
        w.run(&name, "ml", &nodes[node..=node], 1, GPU, borrowed, 0, 1 + i as i64);
    }
    w.submit("tr4", "research", 1, 8 * GPU, &["h100"]);
    let plan = w.plan();
    let mut victims = preempted(&w, &plan);
    victims.sort();
    assert_eq!(victims, ["a10", "a11", "a12", "a9", "b5", "b6", "b7", "b8"], "{:?}", reason(&w, &plan, "tr4"));
    assert!(matches!(reason(&w, &plan, "tr4"), Reason::WaitingForReclaim { victims, .. } if victims.len() == 8));
}
