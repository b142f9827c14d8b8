//! Fragmentation-aware packing, for clusters with `packing: fragmentation`: fragmentation
//! gradient descent (Weng et al., "Beware of Fragmentation", USENIX ATC'23). Each task
//! goes to the node and GPU whose choice grows the node's *expected fragment* least: the
//! GPU capacity left there that a task drawn from the work in sight could not use
//! ([`NodeState::fragment`]), weighted by how often each task shape occurs; the node left
//! with the least free breaks ties. It costs about the number of shapes times best fit's work per task,
//! which is why it is a cluster's choice and not the default.

use std::collections::BTreeMap;

use crate::nodes::NodeState;
use crate::snapshot::{Resources, Snapshot};

/// How many of the most frequent task shapes stand for the work in sight.
pub const SHAPES: usize = 16;

/// Task shapes (one task each) with their frequency, summing to 1.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shapes(Vec<(Resources, f64)>);

impl Shapes {
    /// The [`SHAPES`] most frequent task shapes (GPUs, CPU, memory per task) of the GPU work
    /// in the snapshot, running, pending and its recent demand, each task counted once.
    /// Running work alone would not do: shapes that fit badly would count too little (the
    /// openb replay: from placed pods only, FGD gains 9 % where it gains 46 %).
    pub fn of(s: &Snapshot) -> Self {
        let mut counts: BTreeMap<(u32, u32, u64), u64> = BTreeMap::new();
        let tasks =
            s.running.iter().map(|r| &r.tasks).chain(s.pending.iter().map(|p| &p.tasks)).chain(&s.recent_demand);
        for r in tasks.filter(|r| r.gpus > 0) {
            *counts.entry((r.gpus, r.cpus_milli, r.memory_mib)).or_default() += u64::from(r.count);
        }
        let mut top: Vec<((u32, u32, u64), u64)> = counts.into_iter().collect();
        // Most frequent first; equal counts in key order, so the choice is deterministic.
        top.sort_by_key(|&(key, n)| (std::cmp::Reverse(n), key));
        top.truncate(SHAPES);
        let total: u64 = top.iter().map(|(_, n)| n).sum();
        Self(
            top.into_iter()
                .map(|((gpus, cpus_milli, memory_mib), n)| {
                    (Resources { count: 1, gpus, cpus_milli, memory_mib }, n as f64 / total as f64)
                })
                .collect(),
        )
    }

    /// The node's fragment for a task drawn from these shapes, in hundredths of a GPU.
    pub fn expected_fragment(&self, node: &NodeState) -> f64 {
        self.0.iter().map(|(m, p)| p * f64::from(node.fragment(m))).sum()
    }
}

/// Each task's node and, for a fraction of a GPU, its GPU.
type Tasks = Vec<(usize, Option<u8>)>;

/// Places the gang task by task where the expected fragment grows least (then on the node
/// left with the least free, then in candidate order), taking what it places from `states`; with how much it grew
/// in all, in thousandths of a hundredth of a GPU. `None`, with nothing taken, when it does
/// not fit this way.
pub(crate) fn place(
    states: &mut [NodeState],
    candidates: &[usize],
    r: &Resources,
    shapes: &Shapes,
) -> Option<(Tasks, i64)> {
    let mut tasks: Tasks = Vec::with_capacity(r.count as usize);
    let mut grown = 0.0;
    for _ in 0..r.count {
        // (growth, free GPUs left on the node, candidate, choice); the first of equals wins.
        let mut best: Option<(f64, u32, usize, Option<u8>)> = None;
        for (k, &n) in candidates.iter().enumerate() {
            let choices = states[n].choices(r);
            if choices.is_empty() {
                continue;
            }
            let before = shapes.expected_fragment(&states[n]);
            for choice in choices {
                let mut after = states[n];
                after.take_choice(r, choice);
                let growth = shapes.expected_fragment(&after) - before;
                let cost = after.free_gpus();
                let better = best.is_none_or(|(g, c, _, _)| growth < g - 1e-9 || (growth <= g + 1e-9 && cost < c));
                if better {
                    best = Some((growth, cost, k, choice));
                }
            }
        }
        let Some((growth, _, k, choice)) = best else {
            for &(n, d) in tasks.iter().rev() {
                states[n].give(r, d);
            }
            return None;
        };
        let n = candidates[k];
        states[n].take_choice(r, choice);
        tasks.push((n, choice));
        grown += growth;
    }
    Some((tasks, (grown * 1000.0).round() as i64))
}
