//! Workloads: the work a team declares (training, batch, inference, notebooks).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::apply::validate_meta;
use crate::cluster::ClusterKind;
use crate::error::Error;
use crate::meta::{ApplyMeta, Labels, ObjectMeta};
use crate::validation::{Validator, escape_pointer};

/// What kind of work this is; backends and placement treat kinds differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    Training,
    Batch,
    Inference,
    Notebook,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Training => "training",
            Self::Batch => "batch",
            Self::Inference => "inference",
            Self::Notebook => "notebook",
        }
    }
}

/// The life of a workload.
///
/// ```text
///  Pending ──► Admitted ──► Dispatched ──► Running ──► Succeeded
///    ▲  │          │             │           │  └────► Failed
///    │  │          └─────────────┴───────────┴──────► Cancelled / Failed
///    │  └─► Cancelled                         │
///    │                                        ▼
///    └──────────── (requeue, attempt + 1) ◄─ Preempting ──► Failed (not resumable)
///
///  Running ──► Unknown (cluster unreachable) ──► Running | Pending (requeue) | Failed
/// ```
///
/// `Succeeded`, `Failed` and `Cancelled` are final.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Phase {
    #[default]
    Pending,
    Admitted,
    Dispatched,
    Running,
    Preempting,
    Unknown,
    Succeeded,
    Failed,
    Cancelled,
}

impl Phase {
    pub const ALL: [Self; 9] = [
        Self::Pending,
        Self::Admitted,
        Self::Dispatched,
        Self::Running,
        Self::Preempting,
        Self::Unknown,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Admitted => "Admitted",
            Self::Dispatched => "Dispatched",
            Self::Running => "Running",
            Self::Preempting => "Preempting",
            Self::Unknown => "Unknown",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Cancelled => "Cancelled",
        }
    }

    /// Parses the stored or query form (`Running`).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Whether the workload is done for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }

    /// Whether the workload holds GPUs on its cluster (counted against quota and capacity):
    /// from admission until it is back to `Pending` or finished.
    pub fn holds_gpus(self) -> bool {
        self == Self::Admitted || self.reached_backend()
    }

    /// Whether a backend may hold a job for the workload.
    pub fn reached_backend(self) -> bool {
        matches!(self, Self::Dispatched | Self::Running | Self::Preempting | Self::Unknown)
    }
}

/// Whether the tasks must share one topology block (NVLink domain, IB switch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TopologyPolicy {
    #[default]
    None,
    Preferred,
    Required,
}

/// Desired state of a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "kind": "training",
    "priority": 10,
    "preemptible": true,
    "tasks": {"count": 2, "resources": {"flavors": ["h100-80gb", "a100-80gb"], "gpus": 8, "cpus": 64, "memory_mib": 512000}},
    "gang": true,
    "topology": "preferred",
    "placement": {"cluster_selector": {"region": "eu"}, "backend_kinds": ["slurm", "sim"]},
    "run": {"command": ["python", "train.py"], "image": "ghcr.io/acme/train:1.2", "env": {"EPOCHS": "3"}},
    "max_runtime_seconds": 86400,
    "resumable": true,
    "sim": {"duration_seconds": 600}
}))]
pub struct WorkloadSpec {
    pub kind: WorkloadKind,
    /// Higher runs first within the team; −1000 to 1000.
    #[serde(default)]
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: i32,
    /// Whether Berth may preempt it. Non-preemptible work only runs in-quota.
    #[serde(default = "yes")]
    pub preemptible: bool,
    pub tasks: Tasks,
    /// All tasks start together or none does.
    #[serde(default = "yes")]
    pub gang: bool,
    #[serde(default)]
    pub topology: TopologyPolicy,
    #[serde(default)]
    pub placement: Placement,
    #[serde(default)]
    pub run: Run,
    /// Seconds, 1 to 31,536,000 (a year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_536_000)]
    pub max_runtime_seconds: Option<u64>,
    /// Checkpoints and resumes: after preemption it is requeued rather than failed.
    #[serde(default)]
    pub resumable: bool,
    /// How long it may take to checkpoint when it is preempted or cancelled, at most what
    /// its cluster allows (`max_checkpoint_grace_seconds`); the server's cancel grace
    /// period when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    /// Protection from preemption once it runs, at most what its team allows (the lowest
    /// `spec.preemption` of the team and the teams above it, which also applies when this
    /// is left out; none unless the top-level team sets one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionPolicy>,
    /// Only for `inference`: replica bounds and the scaling target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<Inference>,
    /// Only for `notebook`: when an idle notebook is stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notebook: Option<Notebook>,
    /// How a simulated cluster runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimRun>,
}

fn yes() -> bool {
    true
}

/// `count` identical tasks, each needing `resources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Tasks {
    #[schema(example = 2, minimum = 1, maximum = 10_000)]
    pub count: u32,
    pub resources: TaskResources,
}

/// What one task needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskResources {
    /// Acceptable flavors, most preferred first: 1 to 16, each once.
    #[schema(min_items = 1, max_items = 16)]
    pub flavors: Vec<String>,
    /// Whole GPUs (1, 2, … 64), a fraction of one GPU (0.01 to 0.99), or 0: work that
    /// needs none and is given none (on Kubernetes, `NVIDIA_VISIBLE_DEVICES=void`).
    #[schema(example = 8, minimum = 0, maximum = 64, multiple_of = 0.01)]
    pub gpus: f64,
    /// CPU cores, 0.001 to 4,096; fractions allowed down to 0.001.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.001, maximum = 4096)]
    pub cpus: Option<f64>,
    /// 1 to 16,777,216 (16 TiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 16_777_216)]
    pub memory_mib: Option<u64>,
}

/// Where the workload may run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Only clusters carrying all these labels (every cluster also carries
    /// `berth.dev/cluster` with its name).
    #[serde(default)]
    pub cluster_selector: Labels,
    /// Only these backend kinds; empty means any.
    #[serde(default)]
    pub backend_kinds: Vec<ClusterKind>,
    /// How a workload that accepts several flavors (`tasks.resources.flavors`) picks one:
    /// `ordered` (the default) takes the first in the list that has room now, and
    /// `best_fit` takes the one where it leaves the least room unused.
    #[serde(default, skip_serializing_if = "FlavorPolicy::is_ordered")]
    pub flavor_policy: FlavorPolicy,
}

/// How a workload that accepts several flavors picks one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlavorPolicy {
    /// The first flavor in the list with room now: the list is an order of preference.
    #[default]
    Ordered,
    /// Of the flavors with room now, the one where the workload leaves the least room
    /// unused on the nodes it takes, so that small work does not split the nodes that big
    /// work needs. Work within its team's guarantee is still preferred to borrowing.
    BestFit,
}

impl FlavorPolicy {
    pub fn is_ordered(&self) -> bool {
        *self == Self::Ordered
    }
}

/// What to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// The command and its arguments: at most 256 arguments of at most 4,096 characters,
    /// 65,536 characters in all.
    #[serde(default)]
    #[schema(max_items = 256)]
    pub command: Vec<String>,
    /// A batch script, used instead of `command` where the backend runs scripts (Slurm);
    /// at most 65,536 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 65536)]
    pub script: Option<String>,
    /// Container image, where the backend runs containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 512)]
    pub image: Option<String>,
    /// Environment variables: at most 256, each value at most 32,768 characters, 131,072
    /// characters of values in all.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The most characters of all of a command's arguments together.
pub const COMMAND_MAX_TOTAL: usize = 65_536;
/// The most characters of all environment values together.
pub const ENV_MAX_TOTAL: usize = 131_072;

/// How a workload checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Seconds between being told to stop (SIGTERM; on Kubernetes the pod's termination
    /// grace) and being killed: 1 to 86,400, bounded by the cluster's maximum.
    #[schema(example = 120, minimum = 1, maximum = 86_400)]
    pub grace_seconds: u32,
}

/// How a notebook is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Notebook {
    /// Seconds without activity (`POST .../activity`, which the notebook sends while it is
    /// used) after which it is stopped and its GPUs freed: 60 to 2,592,000 (30 days).
    #[schema(example = 3600, minimum = 60, maximum = 2_592_000)]
    pub idle_timeout_seconds: u32,
}

/// How preemption treats running work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreemptionPolicy {
    /// For this long after it starts running, no preemption (reclaim or priority) takes
    /// it; 0 to 604,800 (a week).
    #[schema(example = 1800, maximum = 604_800)]
    pub min_runtime_seconds: u32,
}

/// The longest `min_runtime_seconds`.
pub const MIN_RUNTIME_MAX: u32 = 604_800;

impl PreemptionPolicy {
    pub(crate) fn validate(&self, v: &mut Validator, at: &str) {
        v.check(self.min_runtime_seconds <= MIN_RUNTIME_MAX, format!("{at}/min_runtime_seconds"), || {
            format!("must be at most {MIN_RUNTIME_MAX} (a week)")
        });
    }
}

/// Replica bounds of an inference service and what its autoscaler keeps each replica at.
///
/// With a target, the service runs `min_replicas` as the workload itself (its
/// `tasks.count`) and each replica above that as a workload of its own, named
/// `{name}-r{n}` and labelled `berth.dev/replica-of: <uid>`: admitted like any work (within
/// the team's limit and fair share, borrowing and preemptible), so a replica that cannot
/// be admitted waits with its reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Inference {
    /// At most `max_replicas`; with a target, at least 1 and equal to `tasks.count`.
    #[schema(maximum = 1000)]
    pub min_replicas: u32,
    #[schema(minimum = 1, maximum = 1000)]
    pub max_replicas: u32,
    /// GPU utilization per replica (above 0, at most 1) the autoscaler keeps: the load is
    /// the replicas' utilization summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub target_utilization: Option<f64>,
    /// Requests in flight per replica the autoscaler keeps: the load is the requests in
    /// flight of all replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0)]
    pub target_in_flight: Option<f64>,
    /// The PromQL query whose value is the service's load, asked of its cluster's
    /// Prometheus (`spec.kubernetes.prometheus_url`); on a simulated cluster the load is
    /// `spec.sim.load`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub query: Option<String>,
    /// How long the load must have asked for fewer replicas before they are removed (to
    /// the most it asked for in that time), as Kubernetes' HPA: 0 to 3,600 s, 300 when
    /// left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 3600)]
    pub scale_down_stabilization_seconds: Option<u32>,
}

impl Inference {
    /// The load one replica should carry, when the service scales.
    pub fn target(&self) -> Option<f64> {
        self.target_in_flight.or(self.target_utilization)
    }
}

/// The replicas of an autoscaled inference service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Replicas {
    /// Replicas that run (its own tasks and its replica workloads that run).
    pub current: u32,
    /// Replicas the load asks for, within the bounds.
    pub desired: u32,
    /// The load last read, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_read_at: Option<DateTime<Utc>>,
    /// Why a replica waits (the scheduler's reason for the first one that does), or why
    /// the load cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Since when the load asks for fewer replicas than it has, and the most it asked for
    /// since (the stabilization window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_since: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_max: Option<u32>,
}

/// The label a replica workload carries: the uid of the service it serves.
pub const REPLICA_OF_LABEL: &str = "berth.dev/replica-of";

/// How a simulated cluster runs the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SimRun {
    /// Run time on the simulated clock.
    #[schema(example = 600, exclusive_minimum = 0, maximum = 100_000_000)]
    pub duration_seconds: f64,
    /// An inference service's load over its run: each step holds from `after_seconds`
    /// (simulated, since it started) until the next.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 1000)]
    pub load: Vec<LoadStep>,
}

/// One step of a simulated load curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadStep {
    #[schema(minimum = 0)]
    pub after_seconds: f64,
    #[schema(minimum = 0)]
    pub value: f64,
}

/// Where the scheduler put the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Admission {
    pub cluster: String,
    pub flavor: String,
    /// True when the team runs it on borrowed quota (it may be reclaimed).
    pub borrowed: bool,
    /// One entry per task: the node it runs on.
    #[serde(default)]
    pub placement: Vec<TaskPlacement>,
}

/// Where one task of a workload runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskPlacement {
    pub node: String,
    /// For a task using a fraction of a GPU: which GPU of the node it shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u8>,
}

/// The backend's handle on the workload's job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackendRef {
    pub cluster: String,
    pub job_id: String,
    /// Where the job writes its output on the cluster (a Slurm job's standard output
    /// file), when its backend keeps one; `GET …/logs` reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Where the job's service answers (inference, notebook), when its backend serves one:
    /// on Kubernetes its Service's in-cluster URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Why a workload is still pending, as the scheduler explains it. A new `code` is written
/// at once; the same code with other numbers (GPUs free, room held for another) at once
/// within the head of the queue (see `QueuePosition`), further back within 10 s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PendingReason {
    /// Machine-readable, e.g. `QuotaLimitReached`, `NoClusterFits`.
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

/// Place in the queue; 1 is next. Within the first 100 of the whole queue or the first 10
/// of the team it is current as of the scheduler's last cycle; further back it is written
/// when the pending reason changes, and otherwise every 10 s where it is more than a tenth
/// off, at most 1,000 a time, the most off first (so it is up to a tenth off, or older when
/// more than 1,000 moved that far at once).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueuePosition {
    pub global: u32,
    pub team: u32,
}

/// Observed state of a workload, written only by Berth.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct WorkloadStatus {
    pub phase: Phase,
    /// Starts at 0; each requeue after preemption adds one.
    pub attempt: u32,
    /// When the workload was first submitted; kept across requeues for its queue order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<BackendRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<PendingReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<QueuePosition>,
    /// While pending: when it is expected to start, and on what basis; absent when that
    /// cannot be estimated (it waits for work without a runtime limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start: Option<StartEstimate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it is in its phase, machine-readable (`Preempted`, `ClusterUnreachable`,
    /// `BackendJobLost`, `JobFailed`, `TimeLimitReached` …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When Berth asked the backend to stop the job (preemption or deletion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// When the job said its checkpoint was written (`POST .../checkpointed`) after it was
    /// told to stop: its job is stopped then, without waiting out the rest of its grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_at: Option<DateTime<Utc>>,
    /// When the running notebook (or service) last reported activity (`POST .../activity`)
    /// in this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_at: Option<DateTime<Utc>>,
    /// An autoscaled inference service's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Replicas>,
    /// When the workload became `Unknown` (its cluster stopped answering), or its cluster
    /// stopped answering while it was being preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_since: Option<DateTime<Utc>>,
    /// The uid of the workload this one was last preempted for: while that one waits, this
    /// one is not admitted again (it would take what that one needs and be preempted again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_for: Option<uuid::Uuid>,
    /// Set when someone cancelled the workload (`POST .../cancel`) while it had a job: the
    /// job is stopped with the cancel grace period and the workload then ends `Cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<Cancellation>,
}

/// When a pending workload is expected to start: the scheduler run forward, assuming
/// running work ends at its `max_runtime_seconds` and nothing else arrives (work usually
/// ends earlier, so the estimate is more often late than early).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StartEstimate {
    pub at: DateTime<Utc>,
    /// What the estimate rests on, in words.
    #[schema(example = "when nlp/pretrain reaches its max_runtime_seconds; 3 workloads start before it")]
    pub basis: String,
}

/// Who cancelled a workload, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Cancellation {
    pub requested_at: DateTime<Utc>,
    /// The subject who asked.
    #[schema(example = "alice")]
    pub by: String,
}

impl Workload {
    /// Whether the workload is on its way out: its deletion or cancellation was requested,
    /// so it neither waits for admission nor keeps what it holds.
    pub fn stopping(&self) -> bool {
        self.metadata.deletion_timestamp.is_some() || self.status.cancellation.is_some()
    }
}

/// Pending workloads in queue order (`GET /api/v1/queue`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Queue {
    /// Pending workloads in all (of the teams the caller can see).
    pub total: i64,
    /// Their GPUs in all.
    pub gpus: f64,
    /// The first of them, in the order the scheduler will consider them: within a team
    /// exactly (priority, then submission), between teams as of the global positions last
    /// written (see `QueuePosition`). Each one's `queue_position` is its place in this order.
    pub items: Vec<Workload>,
}

/// Where a running service or notebook answers, and what opens it
/// (`GET .../workloads/{name}/endpoint`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Endpoint {
    /// On Kubernetes its Service's in-cluster URL; on a simulated cluster a placeholder.
    pub url: String,
    /// A notebook's access token (`?token=` or Jupyter's login form), for this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// When it last reported activity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_at: Option<DateTime<Utc>>,
    /// When it is stopped unless it reports activity (notebooks with an idle timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_stop_at: Option<DateTime<Utc>>,
}

impl Workload {
    /// When an idle notebook is stopped: its idle timeout after its last activity (or its
    /// start); `None` for what has no idle timeout or has not started.
    pub fn idle_stop_at(&self) -> Option<DateTime<Utc>> {
        let timeout = self.spec.notebook?.idle_timeout_seconds;
        let since = self.status.last_activity_at.max(self.status.started_at)?;
        Some(since + chrono::TimeDelta::seconds(i64::from(timeout)))
    }
}

/// Workloads per phase (`GET /api/v1/workloads/summary`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkloadSummary {
    /// Every phase, in lifecycle order, with how many workloads are in it and their GPUs.
    pub phases: Vec<PhaseCount>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PhaseCount {
    pub phase: Phase,
    pub workloads: i64,
    pub gpus: f64,
}

/// A workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Workload {
    pub metadata: ObjectMeta,
    pub spec: WorkloadSpec,
    pub status: WorkloadStatus,
}

/// The body of `PUT /api/v1/teams/{team}/workloads/{name}`. `status` is accepted and
/// ignored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadApply {
    #[serde(default)]
    pub metadata: ApplyMeta,
    pub spec: WorkloadSpec,
    /// Ignored: status is written only by Berth.
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}

/// The body of `POST /api/v1/teams/{team}/workloads`: new workloads of one team, created
/// together or not at all. Each names itself in `metadata.name`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadBatch {
    /// 1 to 1,000 workloads (`MAX_ITEMS`), each as `PUT` takes it.
    pub items: Vec<WorkloadApply>,
}

impl WorkloadBatch {
    /// The most workloads one batch may hold.
    pub const MAX_ITEMS: usize = 1000;
}

/// The workloads a batch created, in the order they were given.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkloadBatchCreated {
    pub items: Vec<Workload>,
}

const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;

impl WorkloadApply {
    /// Checks everything that needs no other object.
    ///
    /// # Errors
    /// [`Error::Invalid`] listing every broken rule.
    pub fn validate(&self, team: &str, name: &str) -> Result<(), Error> {
        let mut v = Validator::new();
        validate_meta(&mut v, &self.metadata, name);
        if let Some(t) = &self.metadata.team {
            v.check(t == team, "/metadata/team", || {
                format!("must match the team in the path ({team:?}) or be omitted")
            });
        }
        // Which service a workload's pods answer for is Berth's to say: a workload that
        // named another's would take its traffic.
        let replica_of = self.metadata.labels.as_ref().is_some_and(|l| l.contains_key(REPLICA_OF_LABEL));
        v.check(!replica_of, "/metadata/labels/berth.dev~1replica-of", || {
            "is set by Berth on the replicas an autoscaler adds, not by a workload's author".into()
        });
        let s = &self.spec;
        v.check(PRIORITY_RANGE.contains(&s.priority), "/spec/priority", || "must be between -1000 and 1000".into());
        validate_tasks(&mut v, &s.tasks);
        v.labels("/spec/placement/cluster_selector", &s.placement.cluster_selector);
        let kinds = &s.placement.backend_kinds;
        for (i, k) in kinds.iter().enumerate() {
            v.check(!kinds[..i].contains(k), format!("/spec/placement/backend_kinds/{i}"), || {
                format!("{} is listed twice", k.as_str())
            });
        }
        // Whatever clusters there are: no backend kind allowed could serve it.
        let served = kinds.is_empty() || kinds.iter().any(|k| k.capabilities().serves_inference);
        v.check(s.kind != WorkloadKind::Inference || served, "/spec/kind", || {
            let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
            format!(
                "spec.placement.backend_kinds allows only {}, whose clusters run batch jobs and do not serve \
                 inference: allow kubernetes or sim, or submit a batch workload",
                kinds.join(", ")
            )
        });
        validate_run(&mut v, &s.run);
        if let Some(max) = s.max_runtime_seconds {
            v.check((1..=31_536_000).contains(&max), "/spec/max_runtime_seconds", || {
                "must be between 1 and 31536000 (one year)".into()
            });
        }
        if let Some(p) = &s.preemption {
            p.validate(&mut v, "/spec/preemption");
        }
        if let Some(c) = &s.checkpoint {
            v.check((1..=86_400).contains(&c.grace_seconds), "/spec/checkpoint/grace_seconds", || {
                "must be between 1 and 86400 (a day)".into()
            });
        }
        match (&s.inference, s.kind) {
            (Some(_), kind) if kind != WorkloadKind::Inference => {
                v.error("/spec/inference", format!("only inference workloads take this, not {}", kind.as_str()));
            }
            (Some(inf), _) => {
                v.check(inf.min_replicas <= inf.max_replicas, "/spec/inference/min_replicas", || {
                    "must not exceed max_replicas".into()
                });
                v.check((1..=1000).contains(&inf.max_replicas), "/spec/inference/max_replicas", || {
                    "must be between 1 and 1000".into()
                });
                if let Some(t) = inf.target_utilization {
                    v.check(t > 0.0 && t <= 1.0, "/spec/inference/target_utilization", || {
                        "must be above 0 and at most 1".into()
                    });
                }
                if let Some(t) = inf.target_in_flight {
                    v.check(t > 0.0 && t <= 1e9, "/spec/inference/target_in_flight", || {
                        "must be above 0 and at most 1000000000".into()
                    });
                    v.check(inf.target_utilization.is_none(), "/spec/inference/target_utilization", || {
                        "set one target: target_in_flight or target_utilization".into()
                    });
                }
                if inf.target().is_some() {
                    v.check(inf.min_replicas >= 1, "/spec/inference/min_replicas", || {
                        "must be at least 1 for a service that scales (it does not scale to zero)".into()
                    });
                    // (Said once min_replicas can be what it is set to.)
                    v.check(inf.min_replicas == 0 || s.tasks.count == inf.min_replicas, "/spec/tasks/count", || {
                        format!(
                            "is the replicas the service always runs: set it to min_replicas ({})",
                            inf.min_replicas
                        )
                    });
                }
                if let Some(q) = &inf.query {
                    v.check(!q.trim().is_empty() && q.len() <= 4096, "/spec/inference/query", || {
                        "must be a PromQL query of 1 to 4096 characters".into()
                    });
                }
                if let Some(w) = inf.scale_down_stabilization_seconds {
                    v.check(w <= 3600, "/spec/inference/scale_down_stabilization_seconds", || {
                        "must be at most 3600".into()
                    });
                }
            }
            (None, _) => {}
        }
        match (&s.notebook, s.kind) {
            (Some(_), kind) if kind != WorkloadKind::Notebook => {
                v.error("/spec/notebook", format!("only notebook workloads take this, not {}", kind.as_str()));
            }
            (Some(n), _) => {
                v.check(
                    (60..=2_592_000).contains(&n.idle_timeout_seconds),
                    "/spec/notebook/idle_timeout_seconds",
                    || "must be between 60 and 2592000 (30 days)".into(),
                );
            }
            (None, _) => {}
        }
        if let Some(sim) = &s.sim {
            v.check(sim.duration_seconds > 0.0 && sim.duration_seconds <= 1e8, "/spec/sim/duration_seconds", || {
                "must be above 0 and at most 100000000".into()
            });
            v.check(sim.load.len() <= 1000, "/spec/sim/load", || "at most 1000 steps".into());
            for (i, step) in sim.load.iter().enumerate() {
                let ok = |x: f64| x.is_finite() && (0.0..=1e9).contains(&x);
                v.check(ok(step.after_seconds) && ok(step.value), format!("/spec/sim/load/{i}"), || {
                    "after_seconds and value must be 0 to 1000000000".into()
                });
            }
        }
        v.finish()
    }
}

fn validate_tasks(v: &mut Validator, tasks: &Tasks) {
    v.check((1..=10_000).contains(&tasks.count), "/spec/tasks/count", || "must be between 1 and 10000".into());
    let r = &tasks.resources;
    let flavors = &r.flavors;
    v.check(!flavors.is_empty() && flavors.len() <= 16, "/spec/tasks/resources/flavors", || {
        "must list 1 to 16 acceptable flavors, most preferred first".into()
    });
    for (i, f) in flavors.iter().enumerate() {
        let at = format!("/spec/tasks/resources/flavors/{i}");
        v.name(&at, f);
        v.check(!flavors[..i].contains(f), at, || format!("flavor {f:?} is listed twice"));
    }
    let g = r.gpus;
    let whole = (1.0..=64.0).contains(&g) && g.fract() == 0.0;
    // At least a hundredth: 1e-320 passed as a "multiple of 0.01" and ran as no GPU.
    let hundredths = (g * 100.0).round();
    let fraction = g > 0.0 && g < 1.0 && hundredths >= 1.0 && (hundredths - g * 100.0).abs() < 1e-9;
    v.check(g == 0.0 || whole || fraction, "/spec/tasks/resources/gpus", || {
        "must be 0, a whole number of GPUs from 1 to 64, or a fraction of one GPU in steps of 0.01".into()
    });
    if let Some(c) = r.cpus {
        v.check((0.001..=4096.0).contains(&c), "/spec/tasks/resources/cpus", || {
            "must be from 0.001 (a thousandth of a core, Kubernetes' 1m) to 4096".into()
        });
    }
    if let Some(m) = r.memory_mib {
        v.check((1..=1 << 24).contains(&m), "/spec/tasks/resources/memory_mib", || {
            "must be between 1 and 16777216 (16 TiB)".into()
        });
    }
}

fn validate_run(v: &mut Validator, run: &Run) {
    v.check(run.command.len() <= 256, "/spec/run/command", || "at most 256 arguments".into());
    let total: usize = run.command.iter().map(|a| a.chars().count()).sum();
    v.check(total <= COMMAND_MAX_TOTAL, "/spec/run/command", || {
        format!("at most {COMMAND_MAX_TOTAL} characters of arguments in all, not {total}")
    });
    for (i, arg) in run.command.iter().enumerate() {
        v.text(&format!("/spec/run/command/{i}"), arg, 4096);
    }
    if let Some(script) = &run.script {
        v.text("/spec/run/script", script, 65_536);
    }
    if let Some(image) = &run.image {
        let ok = !image.is_empty() && image.len() <= 512 && !image.chars().any(|c| c.is_whitespace() || c.is_control());
        v.check(ok, "/spec/run/image", || "must be an image reference without spaces, at most 512 characters".into());
    }
    v.check(run.env.len() <= 256, "/spec/run/env", || "at most 256 variables".into());
    let total: usize = run.env.values().map(|value| value.chars().count()).sum();
    v.check(total <= ENV_MAX_TOTAL, "/spec/run/env", || {
        format!("at most {ENV_MAX_TOTAL} characters of values in all, not {total}")
    });
    for (key, value) in &run.env {
        let at = format!("/spec/run/env/{}", escape_pointer(key));
        let ok = !key.is_empty()
            && key.len() <= 256
            && !key.as_bytes()[0].is_ascii_digit()
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        v.check(ok, &at, || "variable names are letters, digits and '_', not starting with a digit".into());
        // The NVIDIA container runtime gives a container the devices this names: set by
        // the workload, "all" reached every GPU of the node, whatever it was given.
        v.check(key != "NVIDIA_VISIBLE_DEVICES", &at, || {
            "is set by Berth from the GPUs the task is given (spec.tasks.resources.gpus)".into()
        });
        v.text(&at, value, 32_768);
    }
}

/// What of a spec may still change once the workload is admitted: what changes no
/// resource it holds on its cluster.
pub const CHANGEABLE_AFTER_ADMISSION: [&str; 4] = ["priority", "max_runtime_seconds", "inference", "notebook"];

/// Where two JSON values first differ, as a JSON pointer under `at`.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (x, y) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                first_difference(x, y, &format!("{at}/{}", escape_pointer(k)))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}/{i}")))
        }
        _ => (a != b).then(|| at.to_owned()),
    }
}

impl WorkloadSpec {
    /// The first field of `new` (a JSON pointer, `/spec/tasks/resources/gpus`) that differs
    /// from this spec, other than [`CHANGEABLE_AFTER_ADMISSION`]; `None` when only those
    /// differ.
    pub fn fixed_field_changed(&self, new: &WorkloadSpec) -> Option<String> {
        let fixed = |spec: &WorkloadSpec| {
            let mut v = serde_json::to_value(spec).unwrap_or_default();
            if let Some(fields) = v.as_object_mut() {
                for f in CHANGEABLE_AFTER_ADMISSION {
                    fields.remove(f);
                }
            }
            v
        };
        first_difference(&fixed(self), &fixed(new), "/spec")
    }

    /// A minimal valid spec, for tests and examples.
    pub fn example(flavor: &str, gpus: f64) -> Self {
        Self {
            kind: WorkloadKind::Training,
            priority: 0,
            preemptible: true,
            tasks: Tasks {
                count: 1,
                resources: TaskResources { flavors: vec![flavor.into()], gpus, cpus: None, memory_mib: None },
            },
            gang: true,
            topology: TopologyPolicy::None,
            placement: Placement::default(),
            run: Run::default(),
            max_runtime_seconds: None,
            resumable: false,
            checkpoint: None,
            preemption: None,
            notebook: None,
            inference: None,
            sim: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_admission_only_priority_runtime_and_inference_may_change() {
        let a = WorkloadSpec::example("h100", 4.0);
        let mut b = a.clone();
        b.priority = 9;
        b.max_runtime_seconds = Some(60);
        assert_eq!(a.fixed_field_changed(&b), None);
        b.tasks.resources.gpus = 2.0;
        assert_eq!(a.fixed_field_changed(&b).as_deref(), Some("/spec/tasks/resources/gpus"));
        let mut c = a.clone();
        c.tasks.resources.flavors.push("a100".into());
        assert_eq!(a.fixed_field_changed(&c).as_deref(), Some("/spec/tasks/resources/flavors"));
        let mut d = a.clone();
        d.run.env.insert("A/B".into(), "1".into());
        assert_eq!(a.fixed_field_changed(&d).as_deref(), Some("/spec/run/env/A~1B"));
    }

    fn apply(spec: WorkloadSpec) -> WorkloadApply {
        WorkloadApply { metadata: ApplyMeta::default(), spec, status: None }
    }

    fn fields(result: Result<(), Error>) -> Vec<String> {
        match result {
            Err(Error::Invalid(e)) => e.into_iter().map(|e| e.field).collect(),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn gpus_are_whole_or_a_fraction_of_one() {
        for ok in [0.0, 0.25, 0.5, 1.0, 8.0, 64.0] {
            assert!(apply(WorkloadSpec::example("h100", ok)).validate("t", "w").is_ok(), "{ok}");
        }
        // Below a hundredth is no GPU, not a fraction of one (1e-320 was stored and ran
        // with none).
        for bad in [-1.0, 1.5, 65.0, 0.001, 0.004, 1e-11, 1e-320, f64::NAN] {
            assert_eq!(
                fields(apply(WorkloadSpec::example("h100", bad)).validate("t", "w")),
                ["/spec/tasks/resources/gpus"]
            );
        }
    }

    #[test]
    fn cpus_go_down_to_a_thousandth_of_a_core() {
        let with = |cpus| {
            let mut spec = WorkloadSpec::example("h100", 1.0);
            spec.tasks.resources.cpus = Some(cpus);
            apply(spec).validate("t", "w")
        };
        for ok in [0.001, 0.5, 64.0, 4096.0] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        // Below a millicore Kubernetes cannot ask for it (1e-9 was taken and sent as 1m).
        for bad in [0.0, 0.0009, 1e-9, 4096.5, f64::NAN] {
            assert_eq!(fields(with(bad)), ["/spec/tasks/resources/cpus"], "{bad}");
        }
    }

    #[test]
    fn inference_settings_only_fit_inference_workloads() {
        let mut spec = WorkloadSpec::example("h100", 1.0);
        spec.inference = Some(Inference {
            min_replicas: 1,
            max_replicas: 2,
            target_utilization: None,
            target_in_flight: None,
            query: None,
            scale_down_stabilization_seconds: None,
        });
        assert_eq!(fields(apply(spec.clone()).validate("t", "w")), ["/spec/inference"]);
        spec.kind = WorkloadKind::Inference;
        assert!(apply(spec.clone()).validate("t", "w").is_ok());
        // A service that scales runs min_replicas itself, and has one target.
        let inference = spec.inference.as_mut().unwrap();
        (inference.min_replicas, inference.target_in_flight, inference.target_utilization) = (0, Some(8.0), Some(0.5));
        assert_eq!(
            fields(apply(spec.clone()).validate("t", "w")),
            ["/spec/inference/target_utilization", "/spec/inference/min_replicas"]
        );
        let inference = spec.inference.as_mut().unwrap();
        (inference.min_replicas, inference.target_utilization) = (2, None);
        assert_eq!(fields(apply(spec.clone()).validate("t", "w")), ["/spec/tasks/count"]);
        spec.inference.as_mut().unwrap().min_replicas = 1;
        assert!(apply(spec.clone()).validate("t", "w").is_ok());
        // Only to Slurm, which runs batch jobs, a service could never be served.
        let mut on_slurm = spec.clone();
        on_slurm.placement.backend_kinds = vec![ClusterKind::Slurm];
        assert_eq!(fields(apply(on_slurm.clone()).validate("t", "w")), ["/spec/kind"]);
        on_slurm.placement.backend_kinds.push(ClusterKind::Kubernetes);
        assert!(apply(on_slurm).validate("t", "w").is_ok());
        // Which service a workload answers for is Berth's to say.
        let mut labelled = apply(spec);
        labelled.metadata.labels = Some([(REPLICA_OF_LABEL.to_owned(), "x".to_owned())].into());
        assert_eq!(fields(labelled.validate("t", "w")), ["/metadata/labels/berth.dev~1replica-of"]);
    }

    #[test]
    fn env_names_and_duplicate_flavors_are_checked() {
        let mut spec = WorkloadSpec::example("h100", 1.0);
        spec.tasks.resources.flavors.push("h100".into());
        spec.run.env.insert("1BAD".into(), "x".into());
        assert_eq!(fields(apply(spec).validate("t", "w")), ["/spec/tasks/resources/flavors/1", "/spec/run/env/1BAD"]);
        // The devices a container sees are Berth's to name ("all" reached every GPU of the node).
        let mut spec = WorkloadSpec::example("h100", 0.0);
        spec.run.env.insert("NVIDIA_VISIBLE_DEVICES".into(), "all".into());
        assert_eq!(fields(apply(spec).validate("t", "w")), ["/spec/run/env/NVIDIA_VISIBLE_DEVICES"]);
    }

    #[test]
    fn phases_round_trip_through_their_names() {
        for p in Phase::ALL {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
        assert!(Phase::Succeeded.is_final() && !Phase::Running.is_final());
    }
}
