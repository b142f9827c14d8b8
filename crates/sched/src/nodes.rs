//! Node-level bookkeeping and gang bin packing.
//!
//! Whole-GPU tasks take a number of a node's GPUs (which ones is the backend's business).
//! Fractional tasks share one GPU, named by its index, with other fractional tasks up to
//! 100 hundredths; a shared GPU takes no whole-GPU task. Placement is best fit: each task
//! goes where it leaves the least room unused, so work packs onto busy nodes and whole
//! nodes stay free for large gangs (or, on a cluster with `packing: fragmentation`, where
//! it leaves the least room the work in sight could not use: [`crate::fragmentation`]).

use crate::fragmentation::Shapes;
use crate::snapshot::{MAX_GPUS_PER_NODE, Node, ONE_GPU, Resources, Snapshot};

const DEVICES: usize = MAX_GPUS_PER_NODE as usize;

/// What is free on one node. Small and `Copy`, so trial placements work on copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    /// Free hundredths of each shared GPU (meaningless for GPUs not shared).
    shared_free: [u8; DEVICES],
    /// GPUs Berth may use (bit per GPU).
    usable: u32,
    /// GPUs holding fractional tasks (bit per GPU).
    shared: u32,
    /// Usable GPUs neither shared nor taken by whole-GPU tasks.
    whole_free: u32,
    cpus_free: u32,
    memory_free: u64,
}

impl NodeState {
    pub fn new(node: &Node) -> Self {
        let usable_count = node.gpus - node.unavailable_gpus;
        Self {
            shared_free: [0; DEVICES],
            usable: if usable_count == 32 { u32::MAX } else { (1 << usable_count) - 1 },
            shared: 0,
            whole_free: usable_count,
            cpus_free: node.cpus_milli,
            memory_free: node.memory_mib,
        }
    }

    /// Free GPU capacity, in hundredths.
    pub fn free_gpus(&self) -> u32 {
        self.whole_free * ONE_GPU + self.shared_devices().map(|d| u32::from(self.shared_free[d])).sum::<u32>()
    }

    pub fn whole_free(&self) -> u32 {
        self.whole_free
    }

    /// GPUs Berth may use on the node.
    pub fn usable_gpus(&self) -> u32 {
        self.usable.count_ones()
    }

    fn shared_devices(&self) -> impl Iterator<Item = usize> + use<> {
        let mut bits = self.shared;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let d = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                d
            })
        })
    }

    /// How many more of `r`'s tasks fit here counting GPUs alone, GPUs and CPUs, and GPUs
    /// and memory: which of them stops a gang that has GPUs enough.
    pub fn room_for(&self, r: &Resources) -> (u32, u32, u32) {
        let by_gpu = if r.gpus == 0 {
            u32::MAX
        } else if r.is_fractional() {
            self.free_gpus() / r.gpus
        } else {
            self.whole_free / (r.gpus / ONE_GPU)
        };
        let by_cpu = self.cpus_free.checked_div(r.cpus_milli).unwrap_or(u32::MAX);
        let by_memory =
            self.memory_free.checked_div(r.memory_mib).map_or(u32::MAX, |m| m.min(u64::from(u32::MAX)) as u32);
        (by_gpu, by_gpu.min(by_cpu), by_gpu.min(by_memory))
    }

    pub fn cpus_free(&self) -> u32 {
        self.cpus_free
    }

    pub fn memory_free(&self) -> u64 {
        self.memory_free
    }

    /// How many of `r`'s tasks an empty node like this one could hold.
    pub fn capacity_when_empty(&self, r: &Resources, node: &Node) -> u32 {
        let by_gpu = if r.gpus == 0 {
            u32::MAX
        } else if r.is_fractional() {
            self.usable_gpus() * (ONE_GPU / r.gpus)
        } else {
            self.usable_gpus() / (r.gpus / ONE_GPU)
        };
        let by_cpu = node.cpus_milli.checked_div(r.cpus_milli).unwrap_or(u32::MAX);
        let by_memory =
            node.memory_mib.checked_div(r.memory_mib).map_or(u32::MAX, |m| m.min(u64::from(u32::MAX)) as u32);
        by_gpu.min(by_cpu).min(by_memory)
    }

    /// Room one task of `r` would leave unused on the node (lower packs better), or `None`
    /// when it does not fit.
    pub fn fit_cost(&self, r: &Resources) -> Option<u32> {
        if self.cpus_free < r.cpus_milli || self.memory_free < r.memory_mib {
            return None;
        }
        if !r.is_fractional() {
            let want = r.gpus / ONE_GPU;
            return (self.whole_free >= want).then(|| (self.whole_free - want) * ONE_GPU);
        }
        let shared_fit = self.best_shared(r.gpus).map(|d| u32::from(self.shared_free[d]) - r.gpus);
        // Opening a fresh GPU for a fraction costs more than filling one already shared.
        shared_fit.or_else(|| (self.whole_free > 0).then(|| self.whole_free * ONE_GPU - r.gpus + ONE_GPU))
    }

    /// Hundredths of GPU free here that a task of shape `m` could not use (the fragment
    /// measure of fragmentation gradient descent): everything free when `m` fits nowhere
    /// on the node (GPUs, CPU or memory), else what is free on shared GPUs too full for it.
    pub(crate) fn fragment(&self, m: &Resources) -> u32 {
        if self.cpus_free < m.cpus_milli || self.memory_free < m.memory_mib {
            return self.free_gpus();
        }
        let (fits, unusable) = if m.is_fractional() {
            let fits = self.whole_free > 0 || self.best_shared(m.gpus).is_some();
            (fits, self.shared_devices().map(|d| u32::from(self.shared_free[d])).filter(|&f| f < m.gpus).sum())
        } else {
            // Shared GPUs take no whole-GPU task.
            (self.whole_free >= m.gpus / ONE_GPU, self.shared_devices().map(|d| u32::from(self.shared_free[d])).sum())
        };
        if fits { unusable } else { self.free_gpus() }
    }

    /// Where on this node a task of `r` could go: for a fraction of a GPU, each shared GPU
    /// with room (fullest first) and the first whole free one; for whole GPUs, `None` (any
    /// of them).
    pub(crate) fn choices(&self, r: &Resources) -> Vec<Option<u8>> {
        if self.fit_cost(r).is_none() {
            return Vec::new();
        }
        if !r.is_fractional() {
            return vec![None];
        }
        let mut shared: Vec<usize> =
            self.shared_devices().filter(|&d| u32::from(self.shared_free[d]) >= r.gpus).collect();
        shared.sort_by_key(|&d| self.shared_free[d]);
        let mut out: Vec<Option<u8>> = shared.into_iter().map(|d| Some(d as u8)).collect();
        if self.whole_free > 0 {
            out.push(Some(self.first_unshared() as u8));
        }
        out
    }

    /// Takes one task of `r` at `choice` (one of [`Self::choices`]).
    pub(crate) fn take_choice(&mut self, r: &Resources, choice: Option<u8>) {
        match choice {
            Some(d) => self.take_at(r, d).expect("a choice has room"),
            None => {
                self.take(r);
            }
        }
    }

    /// The shared GPU with the least room that still holds `gpus` hundredths.
    fn best_shared(&self, gpus: u32) -> Option<usize> {
        self.shared_devices().filter(|&d| u32::from(self.shared_free[d]) >= gpus).min_by_key(|&d| self.shared_free[d])
    }

    /// Takes one task of `r`; returns the GPU a fractional task shares. Call only when
    /// [`Self::fit_cost`] says it fits.
    pub fn take(&mut self, r: &Resources) -> Option<u8> {
        debug_assert!(self.fit_cost(r).is_some(), "take() called for a task that does not fit");
        self.cpus_free -= r.cpus_milli;
        self.memory_free -= r.memory_mib;
        if !r.is_fractional() {
            self.whole_free -= r.gpus / ONE_GPU;
            return None;
        }
        let d = self.best_shared(r.gpus).unwrap_or_else(|| self.first_unshared());
        self.take_share(d, r.gpus);
        Some(d as u8)
    }

    fn first_unshared(&self) -> usize {
        (0..DEVICES).find(|&d| (self.usable & !self.shared) & (1 << d) != 0).expect("a whole GPU is free")
    }

    /// Takes one task of `r` sharing GPU `device` (a fractional task whose GPU is known).
    pub fn take_at(&mut self, r: &Resources, device: u8) -> Result<(), String> {
        let d = usize::from(device);
        let room = if self.shared & (1 << d) != 0 {
            u32::from(self.shared_free[d]) >= r.gpus
        } else {
            self.usable & (1 << d) != 0 && self.whole_free > 0
        };
        if !room || self.cpus_free < r.cpus_milli || self.memory_free < r.memory_mib {
            return Err(format!("GPU {d} has no room for {} hundredths", r.gpus));
        }
        self.cpus_free -= r.cpus_milli;
        self.memory_free -= r.memory_mib;
        self.take_share(d, r.gpus);
        Ok(())
    }

    fn take_share(&mut self, d: usize, gpus: u32) {
        if self.shared & (1 << d) == 0 {
            self.whole_free -= 1;
            self.shared |= 1 << d;
            self.shared_free[d] = ONE_GPU as u8;
        }
        self.shared_free[d] -= gpus as u8;
    }

    /// The node with nothing free: what work on it gives back ([`Self::give`]) is all
    /// there is to take.
    pub fn drained(mut self) -> Self {
        for d in self.shared_devices() {
            self.shared_free[d] = 0;
        }
        self.whole_free = 0;
        self.cpus_free = 0;
        self.memory_free = 0;
        self
    }

    /// What is free on the node now (`self`) and still free `after` work planned on it
    /// runs there (its victims gone): whole GPUs, CPU and memory (shared GPUs' free room
    /// is left out). The work takes what its victims free first, so this is the lesser
    /// of the two.
    pub fn left_free(self, after: NodeState) -> Self {
        let mut left = after.drained();
        left.whole_free = self.whole_free.min(after.whole_free);
        left.cpus_free = self.cpus_free.min(after.cpus_free);
        left.memory_free = self.memory_free.min(after.memory_free);
        left
    }

    /// Gives back one task of `r` (`device`: the GPU a fractional task shared).
    pub fn give(&mut self, r: &Resources, device: Option<u8>) {
        self.cpus_free += r.cpus_milli;
        self.memory_free += r.memory_mib;
        match device {
            Some(d) => {
                let d = usize::from(d);
                self.shared_free[d] += r.gpus as u8;
                if u32::from(self.shared_free[d]) == ONE_GPU {
                    self.shared &= !(1 << d);
                    self.shared_free[d] = 0;
                    self.whole_free += 1;
                }
            }
            None => self.whole_free += r.gpus / ONE_GPU,
        }
    }
}

/// Every node's state with the snapshot's running work on it.
///
/// # Errors
/// When running work does not fit its nodes (the snapshot over-commits a node).
pub fn node_states(s: &Snapshot) -> Result<Vec<NodeState>, String> {
    let mut states: Vec<NodeState> = s.nodes.iter().map(NodeState::new).collect();
    // Fractional tasks first: they name their GPU; whole ones then take any free GPUs.
    for fractional in [true, false] {
        for (i, r) in s.running.iter().enumerate().filter(|(_, r)| r.tasks.is_fractional() == fractional) {
            for p in &r.placement {
                let state = &mut states[p.node];
                let placed = match p.device {
                    Some(d) => state.take_at(&r.tasks, d),
                    None if state.fit_cost(&r.tasks).is_some() => {
                        state.take(&r.tasks);
                        Ok(())
                    }
                    None => Err("no room".into()),
                };
                placed.map_err(|e| format!("running {i} over-commits node {}: {e}", p.node))?;
            }
        }
    }
    Ok(states)
}

/// A gang placed on a set of nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Per task: the position (in the candidate set's state slice) and the shared GPU.
    pub tasks: Vec<(usize, Option<u8>)>,
    /// Room left unused on the nodes the gang touches, in hundredths; lower packs better.
    pub leftover: u32,
    /// How much it grows the expected fragment of the nodes it takes
    /// ([`crate::fragmentation`]), in thousandths of a hundredth of a GPU (negative: it
    /// shrinks); 0 when placed by best fit.
    pub growth: i64,
}

/// Places all `r.count` tasks on the nodes at `candidates` (positions into `states`), task
/// by task, updating `states`; on failure `states` is left as it was. Best fit, or with
/// `shapes` (a cluster that packs against fragmentation) by [`crate::fragmentation`],
/// falling back to best fit for a gang that does not fit that way, so the two agree on
/// whether a gang fits.
pub fn place(states: &mut [NodeState], candidates: &[usize], r: &Resources, shapes: Option<&Shapes>) -> Option<Placed> {
    let (tasks, growth) = match shapes.and_then(|shapes| crate::fragmentation::place(states, candidates, r, shapes)) {
        Some(placed) => placed,
        None => (best_fit(states, candidates, r)?, 0),
    };
    let mut touched: Vec<usize> = tasks.iter().map(|&(p, _)| p).collect();
    touched.sort_unstable();
    touched.dedup();
    let leftover = touched.iter().map(|&p| states[p].free_gpus()).sum();
    Some(Placed { tasks, leftover, growth })
}

/// Takes the tasks of a placement that [`place`] found on `states` as they are.
pub fn take_placed(states: &mut [NodeState], r: &Resources, tasks: &[(usize, Option<u8>)]) {
    for &(p, device) in tasks {
        match device {
            Some(d) => states[p].take_at(r, d).expect("the placement still fits"),
            None => {
                assert!(states[p].fit_cost(r).is_some(), "the placement still fits");
                states[p].take(r);
            }
        }
    }
}

/// Each task where it leaves the least room unused; `None` (and nothing taken) when the
/// gang does not fit so.
fn best_fit(states: &mut [NodeState], candidates: &[usize], r: &Resources) -> Option<Vec<(usize, Option<u8>)>> {
    if r.is_fractional() { best_fit_each(states, candidates, r) } else { best_fit_whole(states, candidates, r) }
}

/// [`best_fit`] task by task, each with a pass over the candidates.
fn best_fit_each(states: &mut [NodeState], candidates: &[usize], r: &Resources) -> Option<Vec<(usize, Option<u8>)>> {
    let mut tasks: Vec<(usize, Option<u8>)> = Vec::with_capacity(r.count as usize);
    for _ in 0..r.count {
        let mut best: Option<(u32, usize)> = None;
        for &p in candidates {
            if let Some(cost) = states[p].fit_cost(r)
                && best.is_none_or(|b| (cost, p) < b)
            {
                best = Some((cost, p));
                if cost == 0 {
                    break; // Nothing packs better.
                }
            }
        }
        let Some((_, p)) = best else {
            for &(p, d) in tasks.iter().rev() {
                states[p].give(r, d);
            }
            return None;
        };
        tasks.push((p, states[p].take(r)));
    }
    Some(tasks)
}

/// [`best_fit_each`] of whole GPUs in one pass over the candidates instead of one per task.
/// Task by task, best fit takes the node of least cost (room left), the lowest-numbered
/// of equals, or the first in `candidates` that leaves none. A node taken costs less
/// after (whole GPUs) and the others stay as they were, so it is taken again while a task
/// fits: the gang fills the nodes in the order of that choice, and the first `count` of
/// them are enough.
fn best_fit_whole(states: &mut [NodeState], candidates: &[usize], r: &Resources) -> Option<Vec<(usize, Option<u8>)>> {
    let count = r.count as usize;
    if count == 0 {
        return Some(Vec::new());
    }
    // By (cost, node), or for no cost (cost, position in candidates); best first.
    let mut best: Vec<((u32, usize), usize)> = Vec::with_capacity(count + 1);
    for (at, &p) in candidates.iter().enumerate() {
        let Some(cost) = states[p].fit_cost(r) else { continue };
        let key = (cost, if cost == 0 { at } else { p });
        if best.len() == count && best[count - 1].0 <= key {
            continue;
        }
        let i = best.partition_point(|&(k, _)| k < key);
        best.insert(i, (key, p));
        best.truncate(count);
        if best.len() == count && best[count - 1].0.0 == 0 {
            break; // Nothing later packs better.
        }
    }
    let mut tasks: Vec<(usize, Option<u8>)> = Vec::with_capacity(count);
    for &(_, p) in &best {
        while tasks.len() < count && states[p].fit_cost(r).is_some() {
            tasks.push((p, states[p].take(r)));
        }
    }
    if tasks.len() < count {
        for &(p, d) in tasks.iter().rev() {
            states[p].give(r, d);
        }
        return None;
    }
    Some(tasks)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn node(gpus: u32) -> Node {
        Node {
            name: "n".into(),
            cluster: 0,
            flavor: 0,
            gpus,
            unavailable_gpus: 0,
            cpus_milli: 64_000,
            memory_mib: 512 * 1024,
            block: None,
            cordoned: false,
        }
    }

    fn tasks(count: u32, gpus: u32) -> Resources {
        Resources { count, gpus, cpus_milli: 1000, memory_mib: 1024 }
    }

    #[test]
    fn the_fragment_is_what_a_task_shape_cannot_use() {
        // 2 GPUs, one shared with 0.6 free, one whole.
        let mut n = NodeState::new(&node(2));
        n.take(&tasks(1, 40));
        assert_eq!(n.fragment(&tasks(1, 50)), 0, "0.5 fits on either GPU");
        assert_eq!(n.fragment(&tasks(1, 70)), 60, "0.7 fits only the whole GPU");
        assert_eq!(n.fragment(&tasks(1, 100)), 60, "a whole GPU cannot use a shared one");
        assert_eq!(n.fragment(&tasks(1, 200)), 160, "two whole GPUs do not fit: all of it");
        let hungry = Resources { count: 1, gpus: 50, cpus_milli: 65_000, memory_mib: 1024 };
        assert_eq!(n.fragment(&hungry), 160, "short of CPU: all of it");
        assert_eq!(n.choices(&tasks(1, 50)), [Some(0), Some(1)]);
        assert_eq!(n.choices(&tasks(1, 100)), [None]);
    }

    #[test]
    fn fractions_share_one_gpu_up_to_a_whole() {
        // 0.5 + 0.3 share GPU 0; 0.3 more does not fit there (1.1), so it opens GPU 1.
        let mut n = NodeState::new(&node(2));
        assert_eq!(n.take(&tasks(1, 50)), Some(0));
        assert_eq!(n.take(&tasks(1, 30)), Some(0));
        assert_eq!(n.take(&tasks(1, 30)), Some(1));
        assert_eq!(n.whole_free(), 0);
        assert_eq!(n.free_gpus(), 20 + 70);
        // A whole GPU no longer fits; giving the fractions back frees both GPUs whole.
        assert_eq!(n.fit_cost(&tasks(1, 100)), None);
        n.give(&tasks(1, 30), Some(1));
        assert_eq!(n.whole_free(), 1);
        n.give(&tasks(1, 50), Some(0));
        n.give(&tasks(1, 30), Some(0));
        assert_eq!(n, NodeState::new(&node(2)));
    }

    #[test]
    fn whole_tasks_never_take_a_shared_gpu() {
        // GPU 0 carries a 0.2 task; a 2-GPU task takes GPUs 1 and 2, and giving it back
        // leaves GPU 0 shared.
        let mut n = NodeState::new(&node(3));
        n.take(&tasks(1, 20));
        assert_eq!(n.fit_cost(&tasks(1, 300)), None);
        assert_eq!(n.fit_cost(&tasks(1, 200)), Some(0));
        n.take(&tasks(1, 200));
        n.give(&tasks(1, 200), None);
        assert_eq!(n.whole_free(), 2);
        assert_eq!(n.free_gpus(), 280);
    }

    #[test]
    fn best_fit_packs_the_busiest_node_that_fits() {
        // Nodes with 2, 8 and 4 free GPUs; a 2-GPU task goes to the first (nothing left
        // over), the next to the one with 4 free, keeping the 8-GPU node whole.
        let mut states = vec![NodeState::new(&node(2)), NodeState::new(&node(8)), NodeState::new(&node(4))];
        let placed = place(&mut states, &[0, 1, 2], &tasks(2, 200), None).unwrap();
        assert_eq!(placed.tasks, [(0, None), (2, None)]);
        assert_eq!(placed.leftover, 200);
        assert_eq!(states[1].whole_free(), 8);
    }

    #[test]
    fn a_gang_that_does_not_fit_leaves_nothing_behind() {
        // Two 4-GPU tasks on 4 + 3 free GPUs: the first fits, the second does not, and the
        // first is given back.
        let mut states = vec![NodeState::new(&node(4)), NodeState::new(&node(3))];
        let before = states.clone();
        assert_eq!(place(&mut states, &[0, 1], &tasks(2, 400), None), None);
        assert_eq!(states, before);
    }

    proptest::proptest! {
        /// The one-pass best fit of whole GPUs places every gang where task-by-task best
        /// fit does, on any nodes (partly taken, short of CPU or memory) in any order.
        #[test]
        fn whole_gpus_fit_in_one_pass_as_task_by_task(
            nodes in proptest::collection::vec((1..=8u32, 0..=8u32, 1..=8u32, 1..=8u64), 1..24),
            order in proptest::collection::vec(proptest::num::usize::ANY, 0..24),
            count in 0..8u32,
            gpus in 0..=4u32,
            cpus in 0..=3u32,
            memory in 0..=3u64,
        ) {
            let mut states: Vec<NodeState> = nodes
                .iter()
                .map(|&(g, taken, c, m)| {
                    let mut s = NodeState::new(&Node { cpus_milli: c * 1000, memory_mib: m * 1024, ..node(g) });
                    let one_gpu = Resources { cpus_milli: 0, memory_mib: 0, ..tasks(1, 100) };
                    for _ in 0..taken.min(g) {
                        s.take(&one_gpu);
                    }
                    s
                })
                .collect();
            let mut candidates: Vec<usize> =
                order.iter().map(|o| o % states.len()).collect::<BTreeSet<_>>().into_iter().collect();
            let turn = order.first().map_or(0, |o| o % candidates.len().max(1));
            candidates.rotate_left(turn);
            let r = Resources { count, gpus: gpus * ONE_GPU, cpus_milli: cpus * 1000, memory_mib: memory * 1024 };
            let mut each = states.clone();
            let expected = best_fit_each(&mut each, &candidates, &r);
            let got = best_fit_whole(&mut states, &candidates, &r);
            proptest::prop_assert_eq!(got, expected);
            proptest::prop_assert_eq!(states, each);
        }
    }
}
