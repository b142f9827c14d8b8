//! The scheduler's output: what to admit where, whom to preempt and why, and for every
//! workload left waiting, why and where it stands in the queue.

use serde::Serialize;

use crate::snapshot::{ClusterIx, FlavorIx, NodeIx, PendingIx, RunningIx, TaskPlacement, TeamIx};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub admissions: Vec<Admission>,
    pub preemptions: Vec<Preemption>,
    /// Every pending workload not admitted, in queue order (position 1 first).
    pub waiting: Vec<Waiting>,
    /// Per team and flavor, for the flavors the team has quota for, uses or wants.
    pub shares: Vec<TeamShare>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Admission {
    pub workload: PendingIx,
    pub cluster: ClusterIx,
    pub flavor: FlavorIx,
    /// Beyond the team's guarantee: reclaimable by the owners of the capacity.
    pub borrowed: bool,
    /// One entry per task.
    pub placement: Vec<TaskPlacement>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preemption {
    pub victim: RunningIx,
    pub cause: PreemptionCause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PreemptionCause {
    /// `team` takes back its guaranteed capacity for `workload`.
    Reclaim { team: TeamIx, workload: PendingIx },
    /// A higher-priority `workload` of the victim's own team.
    Priority { workload: PendingIx },
}

impl PreemptionCause {
    pub fn workload(self) -> PendingIx {
        match self {
            Self::Reclaim { workload, .. } | Self::Priority { workload } => workload,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Waiting {
    pub workload: PendingIx,
    pub reason: Reason,
    /// 1 is next, across all teams.
    pub position: u32,
    /// 1 is next within the workload's team.
    pub team_position: u32,
    /// Nodes held for this workload: it is starving, or waits for victims to stop.
    pub reserved_nodes: Vec<NodeIx>,
}

/// Why a workload is not admitted. GPU amounts are in GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// Admitting it would take `team` (the workload's team or an ancestor) over its limit.
    QuotaLimitReached { team: TeamIx, flavor: FlavorIx, used: f64, limit: f64, requested: f64 },
    /// A budget of `team` (the workload's team or an ancestor) is used up: it stops new
    /// work (`stop_new`) or new borrowing until `resets_at`.
    BudgetExhausted { team: TeamIx, flavor: FlavorIx, budget: String, stop_new: bool, resets_at: i64 },
    /// A non-preemptible workload may only run within its team's guarantee.
    GuaranteeExceeded { team: TeamIx, flavor: FlavorIx, used: f64, guaranteed: f64, requested: f64 },
    /// It would borrow beyond the team's fair share, and what was still free once every
    /// workload had its turn (lent past the shares) went to other work or does not fit it.
    FairShareReached { team: TeamIx, flavor: FlavorIx, used: f64, fair_share: f64, requested: f64 },
    /// It would borrow, or take a team above past its guarantee, while `workload`, of its
    /// team (or that team above), waits for reclaim to run in-quota, or starves with nodes
    /// held for it: running now would use up the quota that workload counts on.
    BorrowingPaused { flavor: FlavorIx, workload: PendingIx },
    /// It was preempted for `workload`, which still waits: it comes back after that one
    /// starts (before, it would only take what that one needs and be preempted again).
    WaitingForPreemptor { workload: PendingIx },
    /// Quota allows it, but no allowed cluster has room; why, per flavor and cluster.
    NoClusterFits { attempts: Vec<FlavorAttempt> },
    /// Victims were preempted (or are stopping) to make room; it starts when they are gone.
    WaitingForReclaim { cluster: ClusterIx, flavor: FlavorIx, victims: Vec<RunningIx> },
    /// Only preempting `victims`, still within their min runtime, would make room for it;
    /// the last of them may be preempted from `until` ([`crate::Snapshot::now`]'s clock).
    WaitingForMinRuntime { cluster: ClusterIx, flavor: FlavorIx, victims: Vec<RunningIx>, until: i64 },
    /// There is room, but on no single topology block as the workload requires.
    TopologyUnsatisfiable { flavor: FlavorIx },
    /// Every cluster the placement allows is cordoned.
    ClustersCordoned,
    /// No cluster satisfies the placement constraints and has nodes of an acceptable flavor.
    PlacementMatchesNoCluster,
    /// It can never run as submitted, in any acceptable flavor, whatever else runs: why,
    /// per flavor. It claims no fair share until something changes (quotas, clusters).
    Unschedulable { why: Vec<crate::feasible::Impossible> },
}

impl Reason {
    /// The machine-readable code, as serialized.
    pub fn code(&self) -> &'static str {
        match self {
            Self::QuotaLimitReached { .. } => "quota_limit_reached",
            Self::BudgetExhausted { .. } => "budget_exhausted",
            Self::GuaranteeExceeded { .. } => "guarantee_exceeded",
            Self::FairShareReached { .. } => "fair_share_reached",
            Self::BorrowingPaused { .. } => "borrowing_paused",
            Self::WaitingForPreemptor { .. } => "waiting_for_preemptor",
            Self::NoClusterFits { .. } => "no_cluster_fits",
            Self::WaitingForReclaim { .. } => "waiting_for_reclaim",
            Self::WaitingForMinRuntime { .. } => "waiting_for_min_runtime",
            Self::TopologyUnsatisfiable { .. } => "topology_unsatisfiable",
            Self::ClustersCordoned => "clusters_cordoned",
            Self::PlacementMatchesNoCluster => "placement_matches_no_cluster",
            Self::Unschedulable { .. } => "unschedulable",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlavorAttempt {
    pub flavor: FlavorIx,
    pub clusters: Vec<ClusterMiss>,
    /// Set when quota allowed it here only as borrowed work (beyond its team's own
    /// guarantee), which preempts no one to make room: a workload within the guarantee
    /// would.
    pub borrowing: Option<Borrowing>,
}

/// Where a workload would borrow: its team's own work uses `used` of its own guarantee
/// (`guaranteed`: the team's guarantee less its child teams'), and it asks `requested` more
/// (GPUs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Borrowing {
    pub team: TeamIx,
    pub used: f64,
    pub guaranteed: f64,
    pub requested: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterMiss {
    pub cluster: ClusterIx,
    pub miss: Miss,
}

/// Why one cluster could not take the workload in one flavor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Miss {
    Cordoned,
    /// Fewer GPUs free than the gang needs (GPUs).
    NotEnoughGpus {
        free: f64,
        needed: f64,
    },
    /// Enough GPUs in total, but not on nodes that each hold whole tasks.
    Fragmented,
    /// The nodes with GPUs free lack the CPU cores the tasks need (cores).
    InsufficientCpu {
        free: f64,
        needed: f64,
    },
    /// The nodes with GPUs free lack the memory the tasks need (MiB).
    InsufficientMemory {
        free: u64,
        needed: u64,
    },
    /// It would fit, but not within one topology block.
    Topology,
    /// The room it could use is held for a starving or reclaiming workload.
    Reserved,
}

/// A team's fair share of one flavor, next to what it holds and wants (GPUs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamShare {
    pub team: TeamIx,
    pub flavor: FlavorIx,
    pub guaranteed: f64,
    pub limit: Option<f64>,
    /// What the team's own workloads should hold.
    pub fair_share: f64,
    /// What they hold after this plan: running (and stopping, until it has stopped) plus
    /// admitted.
    pub used: f64,
    /// What they want: running plus pending.
    pub demand: f64,
}
