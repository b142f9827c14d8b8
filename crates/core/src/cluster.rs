//! Clusters: registered backends (Slurm, Kubernetes or simulated) that run workloads.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::apply::validate_meta;
use crate::error::Error;
use crate::meta::{ApplyMeta, ObjectMeta};
use crate::validation::Validator;

/// The kind of backend a cluster is. Fixed once the cluster exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterKind {
    Slurm,
    Kubernetes,
    Sim,
}

/// What a kind of backend can run. The scheduler places a workload only on clusters that
/// can run it, and says which capability was missing when none could; the adapters refuse
/// the same things should one reach them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Tasks of a fraction of one GPU (shared devices): on Slurm as GRES `shard`s, where a
    /// partition says how many a GPU has ([`ClusterSpec::capabilities`]); Kubernetes'
    /// device plugins give whole devices (MIG slices are flavors of their own).
    pub fractional_gpus: bool,
    /// Whether a workload must name a container image (`spec.run.image`).
    pub requires_image: bool,
    /// Whether a workload must give what to run (`spec.run.script` or `spec.run.command`):
    /// a Slurm job is a batch script.
    pub requires_command: bool,
    /// Whether it serves inference (a long-running service behind an address): Slurm runs
    /// batch jobs and does not.
    pub serves_inference: bool,
}

impl ClusterKind {
    /// What every cluster of this kind can run (a Slurm cluster shares GPUs too where it
    /// has shards: [`ClusterSpec::capabilities`]).
    pub fn capabilities(self) -> Capabilities {
        match self {
            Self::Slurm => Capabilities {
                fractional_gpus: false,
                requires_image: false,
                requires_command: true,
                serves_inference: false,
            },
            Self::Kubernetes => Capabilities {
                fractional_gpus: false,
                requires_image: true,
                requires_command: false,
                serves_inference: true,
            },
            Self::Sim => Capabilities {
                fractional_gpus: true,
                requires_image: false,
                requires_command: false,
                serves_inference: true,
            },
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
            Self::Kubernetes => "kubernetes",
            Self::Sim => "sim",
        }
    }

    /// Parses the stored form.
    ///
    /// # Errors
    /// [`Error::Internal`] for a value the database should never hold.
    pub fn from_db(s: &str) -> Result<Self, Error> {
        match s {
            "slurm" => Ok(Self::Slurm),
            "kubernetes" => Ok(Self::Kubernetes),
            "sim" => Ok(Self::Sim),
            other => Err(Error::Internal(format!("unknown cluster kind {other:?} in the database"))),
        }
    }
}

/// The label that orders clusters in placement: reservation, then on-demand, then spot.
pub const TIER_LABEL: &str = "tier";
pub const TIERS: [&str; 3] = ["reservation", "on-demand", "spot"];

/// Desired state of a cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "kind": "sim",
    "cordoned": false,
    "sim": {"node_groups": [{"name": "h100", "count": 4, "flavor": "h100-80gb", "gpus_per_node": 8, "topology_block": "nvl-a"}]}
}))]
pub struct ClusterSpec {
    pub kind: ClusterKind,
    /// Where the backend listens (slurmrestd or the Kubernetes API); required for
    /// `slurm` and `kubernetes`, not allowed for `sim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "https://slurm.example.internal:6820")]
    pub endpoint: Option<String>,
    /// The *name* of the credential berthd holds for this cluster: `BERTH_CREDENTIAL_<NAME>`,
    /// read from that environment variable, the file its `_FILE` variable names, or the
    /// file of that name in `BERTH_CREDENTIALS_DIR`. No other setting of berthd can be
    /// named. The secret itself is never sent, stored or returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "BERTH_CREDENTIAL_SLURM_A", pattern = "^BERTH_CREDENTIAL_[A-Za-z0-9_]+$", max_length = 128)]
    pub credentials_ref: Option<String>,
    /// A cordoned cluster keeps its running work but receives nothing new.
    #[serde(default)]
    pub cordoned: bool,
    /// The longest time to checkpoint a workload may ask for here (`spec.checkpoint`)
    /// between being told to stop and being killed, at most 86,400; when left out, the
    /// server's cancel grace period (so no member can hold off a reclaim longer than the
    /// platform admin allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 900, maximum = 86_400)]
    pub max_checkpoint_grace_seconds: Option<u32>,
    /// How Berth picks the nodes (and shared GPUs) a workload's tasks take here:
    /// `best_fit` (the default) where each task leaves the least room unused;
    /// `fragmentation` where it leaves the least room that the work Berth sees (its task
    /// shapes) could not use, for clusters whose GPUs are shared by fractional tasks.
    #[serde(default, skip_serializing_if = "Packing::is_best_fit")]
    pub packing: Packing,
    /// Required for `sim` clusters: the simulated hardware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimSpec>,
    /// Required for `slurm` clusters: the Slurm user, and which partitions hold which flavor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmSpec>,
    /// Required for `kubernetes` clusters: which nodes hold which flavor, and where each
    /// team's work goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSpec>,
}

/// The longest any cluster may allow.
pub const CHECKPOINT_GRACE_MAX: u32 = 86_400;

/// How a cluster's nodes are chosen for each task of a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// The node (and shared GPU) where the task leaves the least room unused: work packs
    /// onto busy nodes and whole nodes stay free for large gangs.
    #[default]
    BestFit,
    /// The node and GPU whose choice leaves the least capacity that the work Berth sees
    /// (its running and pending task shapes) could not use: fragmentation gradient descent
    /// (Weng et al., USENIX ATC'23). Worth it where GPUs are shared by fractional tasks; it
    /// costs more per task than best fit. A gang that this way would not fit is placed by
    /// best fit.
    Fragmentation,
}

impl Packing {
    pub fn is_best_fit(&self) -> bool {
        *self == Self::BestFit
    }
}

impl ClusterSpec {
    /// How long a workload asking for `asked` seconds to checkpoint gets here, where the
    /// server's grace period is `server_grace`.
    pub fn checkpoint_grace(&self, asked: u32, server_grace: std::time::Duration) -> std::time::Duration {
        let asked = std::time::Duration::from_secs(u64::from(asked));
        let most = self.max_checkpoint_grace_seconds.map_or(server_grace, |m| std::time::Duration::from_secs(m.into()));
        asked.min(most)
    }

    /// What this cluster can run: its kind's capabilities, and a Slurm cluster shares GPUs
    /// only when a partition has shards (`shards_per_gpu`).
    pub fn capabilities(&self) -> Capabilities {
        let mut can = self.kind.capabilities();
        can.fractional_gpus |=
            self.slurm.as_ref().is_some_and(|s| s.partitions.iter().any(|p| p.shards_per_gpu.is_some()));
        can
    }
}

/// Every credential a cluster can name starts so: the namespace of berthd's settings that
/// were given for clusters, closed to every other setting (the signing secret, the
/// database URL).
pub const CREDENTIAL_PREFIX: &str = "BERTH_CREDENTIAL_";

/// Whether `name` is a credential name a cluster may refer to.
pub fn is_credential_name(name: &str) -> bool {
    name.len() <= 128
        && name
            .strip_prefix(CREDENTIAL_PREFIX)
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
}

/// How Berth uses a Kubernetes cluster (reached at `endpoint`; `credentials_ref` names a
/// kubeconfig, and without one berthd uses its in-cluster service account).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"flavors": [{"flavor": "h100-80gb", "product": "NVIDIA-H100-80GB-HBM3"}]}))]
pub struct KubernetesSpec {
    /// Which nodes hold which flavor: one entry per flavor. Nodes of no listed product are
    /// not Berth's to use.
    pub flavors: Vec<KubernetesFlavor>,
    /// A team's work runs in namespace `namespace_prefix` + team name, unless `namespaces`
    /// names one for it.
    #[serde(default = "default_namespace_prefix")]
    #[schema(example = "berth-")]
    pub namespace_prefix: String,
    /// Team name → namespace, for teams whose namespace is not the prefixed team name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<String, String>,
    /// The node label holding the topology block (NVLink domain, switch).
    #[serde(default = "default_topology_label")]
    #[schema(example = "berth.dev/topology-block")]
    pub topology_label: String,
    /// How long a dispatched job's pods may stay unscheduled (the cluster changed under
    /// Berth's placement) before Berth withdraws the job and requeues the workload.
    #[serde(default = "default_gang_timeout")]
    #[schema(example = 300)]
    pub gang_timeout_seconds: u64,
    /// The Prometheus whose queries give inference services their load
    /// (`spec.inference.query`), e.g. `http://prometheus.monitoring:9090`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "http://prometheus.monitoring:9090")]
    pub prometheus_url: Option<String>,
}

/// The nodes of one flavor on a Kubernetes cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = KubernetesNodeFlavor)]
pub struct KubernetesFlavor {
    #[schema(example = "h100-80gb", pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub flavor: String,
    /// The value of the node label `nvidia.com/gpu.product` (set by NVIDIA's GPU feature
    /// discovery) on the flavor's nodes.
    #[schema(example = "NVIDIA-H100-80GB-HBM3")]
    pub product: String,
    /// The extended resource a task asks for: `nvidia.com/gpu`, or a MIG resource such as
    /// `nvidia.com/mig-1g.10gb`.
    #[serde(default = "default_gpu_resource")]
    #[schema(example = "nvidia.com/gpu")]
    pub resource: String,
}

fn default_namespace_prefix() -> String {
    "berth-".into()
}

fn default_topology_label() -> String {
    "berth.dev/topology-block".into()
}

fn default_gang_timeout() -> u64 {
    300
}

fn default_gpu_resource() -> String {
    "nvidia.com/gpu".into()
}

/// How Berth uses a Slurm cluster (reached through slurmrestd at `endpoint`, with the JWT
/// named by `credentials_ref`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user": "berth", "partitions": [{"name": "gpu", "flavor": "h100-80gb", "gpu_type": "h100"}]}))]
pub struct SlurmSpec {
    /// The Slurm user Berth's jobs run as (`X-SLURM-USER-NAME`); the token must be this
    /// user's.
    #[schema(example = "berth")]
    pub user: String,
    /// The slurmrestd API version to speak: `auto` (the default) uses the newest the
    /// cluster's slurmrestd offers (v0.0.38 on Slurm 22.05 … v0.0.45 on 26.05), found
    /// again after a Slurm upgrade; a version pins it. The cluster's `status.api` says
    /// which is in use.
    #[serde(default = "default_slurm_api")]
    #[schema(example = "auto")]
    pub api_version: String,
    /// The partitions Berth submits to, each with the flavor of its GPUs; one partition per
    /// flavor. Nodes in no listed partition are not Berth's to use.
    pub partitions: Vec<SlurmPartition>,
    /// Where jobs start and write their output (`slurm-<job id>.out`); it must exist on
    /// the compute nodes and be writable by `user`.
    #[serde(default = "default_slurm_directory")]
    #[schema(example = "/tmp")]
    pub working_directory: String,
}

/// A Slurm partition and the flavor of its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmPartition {
    #[schema(example = "gpu")]
    pub name: String,
    #[schema(example = "h100-80gb", pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub flavor: String,
    /// The GRES type of the flavor's GPUs (`gpu:<type>:<count>`); when set, only GPUs of
    /// this type count and jobs ask for them by type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "h100")]
    pub gpu_type: Option<String>,
    /// How many GRES `shard`s each GPU of this partition's nodes has (Slurm's GPU sharing,
    /// gres.conf `Name=shard`). When set, a task of a fraction of a GPU runs as that
    /// fraction of the shards (0.25 GPU with 8 shards per GPU: 2 shards); without it the
    /// partition takes whole GPUs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 8, minimum = 1, maximum = 100)]
    pub shards_per_gpu: Option<u32>,
}

/// `spec.slurm.api_version` that lets Berth choose.
pub const SLURM_API_AUTO: &str = "auto";

/// What `spec.slurm.api_version` accepts: `auto` and the slurmrestd API versions Berth
/// speaks (the Slurm adapter's test checks that they agree).
pub const SLURM_API_VERSIONS: [&str; 8] =
    [SLURM_API_AUTO, "v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38"];

fn default_slurm_api() -> String {
    SLURM_API_AUTO.into()
}

fn default_slurm_directory() -> String {
    "/tmp".into()
}

/// The simulated hardware of a `sim` cluster, its clock and the faults to inject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    pub node_groups: Vec<NodeGroup>,
    /// Simulated seconds per real second: 60 runs a ten-minute job in ten seconds.
    #[serde(default = "one")]
    #[schema(example = 60)]
    pub time_scale: f64,
    /// Run time of a job whose workload does not set `spec.sim.duration_seconds`.
    #[serde(default = "default_duration")]
    pub default_duration_seconds: f64,
    /// Chance (0 to 1) that a job fails partway through, decided per job from `seed`.
    #[serde(default)]
    pub job_failure_probability: f64,
    /// Seeds the simulated failures, so a run can be repeated exactly.
    #[serde(default)]
    pub seed: u64,
    /// Nodes that have failed: their jobs fail and they take no new work until removed
    /// from this list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    /// Makes the simulated backend unreachable: every call fails, as if it were down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreachable: bool,
    /// Makes the simulated backend refuse to cancel jobs (it answers everything else), as
    /// a scheduler that rejects a cancel would.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refuse_cancels: bool,
}

fn one() -> f64 {
    1.0
}

fn default_duration() -> f64 {
    300.0
}

impl SimSpec {
    /// Simulated hardware with the defaults for everything else (real time, no faults).
    pub fn new(node_groups: Vec<NodeGroup>) -> Self {
        Self {
            node_groups,
            time_scale: one(),
            default_duration_seconds: default_duration(),
            job_failure_probability: 0.0,
            seed: 0,
            failed_nodes: Vec::new(),
            unreachable: false,
            refuse_cancels: false,
        }
    }
}

impl NodeGroup {
    /// The name of node `i` (0-based) of the group: `{group}-{i}`.
    pub fn node_name(&self, i: u32) -> String {
        format!("{}-{i}", self.name)
    }
}

/// `count` identical nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    #[schema(example = "h100", pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub name: String,
    #[schema(example = 4, minimum = 1, maximum = 100_000)]
    pub count: u32,
    #[schema(example = "h100-80gb", pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub flavor: String,
    #[schema(example = 8)]
    pub gpus_per_node: u32,
    #[serde(default = "default_cpus")]
    pub cpus_per_node: u32,
    #[serde(default = "default_memory")]
    pub memory_mib_per_node: u64,
    /// Nodes sharing a block (NVLink domain, IB switch) are close to each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_block: Option<String>,
}

fn default_cpus() -> u32 {
    128
}

fn default_memory() -> u64 {
    1024 * 1024
}

/// Health of a cluster as seen by the controllers.
///
/// ```text
///  Unknown ──► Healthy ◄──► Degraded (a refresh failed) ──► Unreachable (N in a row)
///                 ▲                                              │
///                 └──────────────── a refresh succeeds ──────────┘
/// ```
///
/// An `Unreachable` cluster receives no new work; its not-yet-started work is re-placed
/// and its running work becomes `Unknown`, then is requeued or failed after a timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ClusterHealth {
    /// Not yet contacted.
    #[default]
    Unknown,
    Healthy,
    Degraded,
    Unreachable,
}

/// Observed state of a cluster, written by the controllers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ClusterStatus {
    pub health: ClusterHealth,
    /// When the backend last answered an inventory refresh (refreshes every few seconds;
    /// stored at most a minute apart while nothing else about the cluster changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<DateTime<Utc>>,
    /// Inventory refreshes that failed in a row, counted up to the configured threshold at
    /// which the cluster becomes `Unreachable`.
    pub consecutive_failures: u32,
    /// Why the cluster is not healthy (the backend's error), if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The API Berth speaks with the cluster, as last found (`slurmrestd v0.0.45, Slurm
    /// 26.05.5`); absent for backends with one API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// GPUs per flavor, as last observed.
    #[serde(default)]
    pub inventory: Vec<InventoryEntry>,
}

/// Observed capacity of one flavor on a cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InventoryEntry {
    pub flavor: String,
    pub nodes: u32,
    pub gpus_total: f64,
    pub gpus_free: f64,
}

/// A node of a cluster as the dashboard shows it (`GET /api/v1/clusters/{name}/nodes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub name: String,
    /// None: the node's GPUs map to no flavor (Berth does not place work there).
    pub flavor: Option<String>,
    /// Topology block (e.g. an NVLink domain or a switch), if the backend reports one.
    pub block: Option<String>,
    pub gpus: u32,
    /// GPUs the backend reports unusable, or held by work Berth did not start.
    pub unavailable_gpus: u32,
    /// GPUs Berth's active workloads are placed on.
    pub allocated_gpus: f64,
    /// False when drained, down or cordoned at the backend.
    pub schedulable: bool,
}

/// A registered backend cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Cluster {
    pub metadata: ObjectMeta,
    pub spec: ClusterSpec,
    pub status: ClusterStatus,
}

/// The label every cluster carries for placement, whatever its own labels say: its name.
/// A workload's `placement.cluster_selector` may name it to run on that cluster only (a
/// service's replicas do, to be reached through the service's one Service).
pub const CLUSTER_NAME_LABEL: &str = "berth.dev/cluster";

impl Cluster {
    /// Its labels for placement: its own, and [`CLUSTER_NAME_LABEL`] with its name.
    pub fn placement_labels(&self) -> crate::meta::Labels {
        let mut labels = self.metadata.labels.clone();
        labels.insert(CLUSTER_NAME_LABEL.to_owned(), self.metadata.name.clone());
        labels
    }
}

/// The body of `PUT /api/v1/clusters/{name}`. `status` is accepted and ignored.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterApply {
    #[serde(default)]
    pub metadata: ApplyMeta,
    pub spec: ClusterSpec,
    /// Ignored: status is written only by Berth.
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}

impl ClusterApply {
    /// Checks everything that needs no other object.
    ///
    /// # Errors
    /// [`Error::Invalid`] listing every broken rule.
    pub fn validate(&self, name: &str) -> Result<(), Error> {
        let mut v = Validator::new();
        validate_meta(&mut v, &self.metadata, name);
        if let Some(tier) = self.metadata.labels.as_ref().and_then(|l| l.get(TIER_LABEL)) {
            v.check(TIERS.contains(&tier.as_str()), format!("/metadata/labels/{TIER_LABEL}"), || {
                format!("must be one of {}", TIERS.join(", "))
            });
        }
        let s = &self.spec;
        match (s.kind, &s.endpoint) {
            (ClusterKind::Sim, Some(_)) => v.error("/spec/endpoint", "a sim cluster has no endpoint"),
            (ClusterKind::Sim, None) => {}
            (_, None) => v.error("/spec/endpoint", format!("required for a {} cluster", s.kind.as_str())),
            (_, Some(endpoint)) => {
                let ok = (endpoint.starts_with("http://") || endpoint.starts_with("https://"))
                    && endpoint.len() <= 2048
                    && !endpoint.chars().any(|c| c.is_whitespace() || c.is_control());
                v.check(ok, "/spec/endpoint", || "must be an http:// or https:// URL".into());
            }
        }
        if let Some(most) = s.max_checkpoint_grace_seconds {
            v.check(most <= CHECKPOINT_GRACE_MAX, "/spec/max_checkpoint_grace_seconds", || {
                format!("must be at most {CHECKPOINT_GRACE_MAX} (a day)")
            });
        }
        if let Some(r) = &s.credentials_ref {
            v.check(is_credential_name(r), "/spec/credentials_ref", || {
                format!(
                    "must name a credential berthd was given for clusters: {CREDENTIAL_PREFIX}<NAME> (letters, \
                     digits and '_', at most 128 characters), never the secret itself nor any other setting"
                )
            });
        }
        let only = "only a sim cluster has simulated hardware";
        if let Some(sim) = kind_section(&mut v, s.kind, ClusterKind::Sim, "/spec/sim", s.sim.as_ref(), only) {
            validate_node_groups(&mut v, &sim.node_groups);
            v.check(sim.time_scale > 0.0 && sim.time_scale <= 1e6, "/spec/sim/time_scale", || {
                "must be above 0 and at most 1000000".into()
            });
            v.check(
                sim.default_duration_seconds > 0.0 && sim.default_duration_seconds <= 1e8,
                "/spec/sim/default_duration_seconds",
                || "must be above 0 and at most 100000000".into(),
            );
            v.check((0.0..=1.0).contains(&sim.job_failure_probability), "/spec/sim/job_failure_probability", || {
                "must be between 0 and 1".into()
            });
            v.check(sim.failed_nodes.len() <= 100_000, "/spec/sim/failed_nodes", || "at most 100000 nodes".into());
            for (i, n) in sim.failed_nodes.iter().enumerate() {
                v.name(&format!("/spec/sim/failed_nodes/{i}"), n);
            }
        }
        let only = "only a slurm cluster takes Slurm settings";
        if let Some(slurm) = kind_section(&mut v, s.kind, ClusterKind::Slurm, "/spec/slurm", s.slurm.as_ref(), only) {
            validate_slurm(&mut v, slurm);
        }
        let only = "only a kubernetes cluster takes Kubernetes settings";
        let k8s = s.kubernetes.as_ref();
        if let Some(k8s) = kind_section(&mut v, s.kind, ClusterKind::Kubernetes, "/spec/kubernetes", k8s, only) {
            validate_kubernetes(&mut v, k8s);
        }
        if s.kind == ClusterKind::Slurm && s.credentials_ref.is_none() {
            v.error("/spec/credentials_ref", "required for a slurm cluster: the name of the secret holding its JWT");
        }
        v.finish()
    }
}

/// The settings section `field` that clusters of kind `owner` require and others must not
/// have (`only` says so); `Some` when it is there to be checked.
fn kind_section<'a, T>(
    v: &mut Validator,
    kind: ClusterKind,
    owner: ClusterKind,
    field: &str,
    section: Option<&'a T>,
    only: &str,
) -> Option<&'a T> {
    match section {
        None if kind == owner => {
            v.error(field, format!("required for a {} cluster", owner.as_str()));
            None
        }
        Some(_) if kind != owner => {
            v.error(field, format!("{only}, not a {} cluster", kind.as_str()));
            None
        }
        section => section,
    }
}

fn validate_slurm(v: &mut Validator, slurm: &SlurmSpec) {
    v.check(
        !slurm.user.is_empty()
            && slurm.user.len() <= 64
            && slurm.user.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
        "/spec/slurm/user",
        || "must be a Unix user name (letters, digits, '.', '_', '-'; at most 64)".into(),
    );
    v.check(SLURM_API_VERSIONS.contains(&slurm.api_version.as_str()), "/spec/slurm/api_version", || {
        format!("must be one of {}", SLURM_API_VERSIONS.join(", "))
    });
    v.check(!slurm.partitions.is_empty() && slurm.partitions.len() <= 64, "/spec/slurm/partitions", || {
        "must list 1 to 64 partitions".into()
    });
    let slurm_name =
        |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    for (i, p) in slurm.partitions.iter().enumerate() {
        let at = |f: &str| format!("/spec/slurm/partitions/{i}/{f}");
        v.check(slurm_name(&p.name), at("name"), || {
            "must be a Slurm partition name (letters, digits, '.', '_', '-')".into()
        });
        v.name(&at("flavor"), &p.flavor);
        if slurm.partitions[..i].iter().any(|other| other.flavor == p.flavor) {
            v.error(at("flavor"), format!("flavor {:?} is already mapped to a partition", p.flavor));
        }
        if let Some(t) = &p.gpu_type {
            v.check(slurm_name(t), at("gpu_type"), || "must be a GRES type (letters, digits, '.', '_', '-')".into());
        }
        if let Some(n) = p.shards_per_gpu {
            v.check((1..=100).contains(&n), at("shards_per_gpu"), || "must be 1 to 100".into());
        }
    }
    let dir = &slurm.working_directory;
    v.check(
        dir.starts_with('/') && dir.len() <= 1024 && !dir.chars().any(char::is_control),
        "/spec/slurm/working_directory",
        || "must be an absolute path".into(),
    );
}

/// A Kubernetes name (DNS-1123 label): lowercase letters, digits and '-', at most `max`.
fn dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A Kubernetes label key or value part: letters, digits, '-', '_', '.', '/'.
fn label_text(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
}

fn validate_kubernetes(v: &mut Validator, k: &KubernetesSpec) {
    v.check(!k.flavors.is_empty() && k.flavors.len() <= 64, "/spec/kubernetes/flavors", || {
        "must list 1 to 64 flavors".into()
    });
    for (i, f) in k.flavors.iter().enumerate() {
        let at = |field: &str| format!("/spec/kubernetes/flavors/{i}/{field}");
        v.name(&at("flavor"), &f.flavor);
        if k.flavors[..i].iter().any(|other| other.flavor == f.flavor) {
            v.error(at("flavor"), format!("flavor {:?} is listed twice", f.flavor));
        }
        v.check(label_text(&f.product) && f.product.len() <= 63, at("product"), || {
            "must be a node label value (letters, digits, '-', '_', '.'; at most 63)".into()
        });
        if k.flavors[..i].iter().any(|other| other.product == f.product) {
            v.error(at("product"), format!("product {:?} is already mapped to a flavor", f.product));
        }
        v.check(f.resource.starts_with("nvidia.com/") && label_text(&f.resource), at("resource"), || {
            "must be an NVIDIA extended resource such as nvidia.com/gpu or nvidia.com/mig-1g.10gb".into()
        });
    }
    v.check(
        k.namespace_prefix.is_empty() || dns_label(&format!("{}x", k.namespace_prefix), 40),
        "/spec/kubernetes/namespace_prefix",
        || "must start a namespace name: lowercase letters, digits and '-', at most 39".into(),
    );
    v.check(k.namespaces.len() <= 10_000, "/spec/kubernetes/namespaces", || "at most 10000 teams".into());
    for (team, ns) in &k.namespaces {
        let at = format!("/spec/kubernetes/namespaces/{}", crate::validation::escape_pointer(team));
        // The keys are team names: a key no team could have is a mistake (or an attack
        // on whatever reads the map), not a setting.
        v.name(&at, team);
        v.check(dns_label(ns, 63), at, || {
            "must be a namespace name: lowercase letters, digits and '-', at most 63".into()
        });
    }
    v.check(label_text(&k.topology_label), "/spec/kubernetes/topology_label", || "must be a node label key".into());
    v.check((1..=86_400).contains(&k.gang_timeout_seconds), "/spec/kubernetes/gang_timeout_seconds", || {
        "must be 1 to 86400".into()
    });
    if let Some(url) = &k.prometheus_url {
        let http = url.starts_with("http://") || url.starts_with("https://");
        let ok = http && url.len() <= 2048 && !url.chars().any(char::is_whitespace);
        v.check(ok, "/spec/kubernetes/prometheus_url", || "must be an http:// or https:// URL".into());
    }
}

fn validate_node_groups(v: &mut Validator, groups: &[NodeGroup]) {
    v.check(!groups.is_empty() && groups.len() <= 256, "/spec/sim/node_groups", || {
        "must list 1 to 256 node groups".into()
    });
    for (i, g) in groups.iter().enumerate() {
        let at = |f: &str| format!("/spec/sim/node_groups/{i}/{f}");
        v.name(&at("name"), &g.name);
        if groups[..i].iter().any(|other| other.name == g.name) {
            v.error(at("name"), format!("node group {:?} is listed twice", g.name));
        }
        v.check((1..=100_000).contains(&g.count), at("count"), || "must be between 1 and 100000".into());
        v.name(&at("flavor"), &g.flavor);
        v.check(g.gpus_per_node <= 32, at("gpus_per_node"), || "must be at most 32".into());
        v.check((1..=4096).contains(&g.cpus_per_node), at("cpus_per_node"), || "must be between 1 and 4096".into());
        v.check((1..=1 << 24).contains(&g.memory_mib_per_node), at("memory_mib_per_node"), || {
            "must be between 1 and 16777216 (16 TiB)".into()
        });
        if let Some(block) = &g.topology_block {
            v.name(&at("topology_block"), block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(groups: Vec<NodeGroup>) -> ClusterApply {
        ClusterApply {
            metadata: ApplyMeta::default(),
            spec: ClusterSpec {
                kind: ClusterKind::Sim,
                endpoint: None,
                credentials_ref: None,
                cordoned: false,
                max_checkpoint_grace_seconds: None,
                packing: Packing::BestFit,
                sim: Some(SimSpec::new(groups)),
                slurm: None,
                kubernetes: None,
            },
            status: None,
        }
    }

    #[test]
    fn a_checkpoint_grace_is_cut_to_the_clusters_maximum_or_else_the_servers_grace() {
        let server = std::time::Duration::from_secs(30);
        let secs = std::time::Duration::from_secs;
        let mut spec = sim(vec![]).spec;
        assert_eq!(spec.checkpoint_grace(5, server), secs(5), "less is always fine");
        assert_eq!(spec.checkpoint_grace(3600, server), secs(30), "no more than the server's without a maximum");
        spec.max_checkpoint_grace_seconds = Some(120);
        assert_eq!(spec.checkpoint_grace(60, server), secs(60), "more where the cluster allows it");
        assert_eq!(spec.checkpoint_grace(3600, server), secs(120));
    }

    fn group(name: &str) -> NodeGroup {
        NodeGroup {
            name: name.into(),
            count: 2,
            flavor: "h100".into(),
            gpus_per_node: 8,
            cpus_per_node: 64,
            memory_mib_per_node: 1024,
            topology_block: None,
        }
    }

    #[test]
    fn a_sim_cluster_needs_node_groups_with_unique_names() {
        assert!(sim(vec![group("a")]).validate("sim-a").is_ok());
        let Err(Error::Invalid(e)) = sim(vec![group("a"), group("a")]).validate("sim-a") else { panic!() };
        assert_eq!(e[0].field, "/spec/sim/node_groups/1/name");
    }

    #[test]
    fn a_slurm_cluster_needs_an_endpoint_and_a_secret_name_not_a_secret() {
        let mut c = sim(vec![]);
        c.spec.kind = ClusterKind::Slurm;
        c.spec.sim = None;
        c.spec.credentials_ref = Some("eyJhbGciOi.secret.value".into());
        let Err(Error::Invalid(e)) = c.validate("slurm-a") else { panic!() };
        let fields: Vec<_> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["/spec/endpoint", "/spec/credentials_ref", "/spec/slurm"]);
    }

    #[test]
    fn a_credential_is_named_only_from_the_closed_namespace() {
        for ok in ["BERTH_CREDENTIAL_SLURM_A", "BERTH_CREDENTIAL_x1"] {
            assert!(is_credential_name(ok), "{ok}");
        }
        for bad in
            ["BERTH_JWT_SECRET", "DATABASE_URL", "BERTH_CREDENTIAL_", "BERTH_CREDENTIAL_A-B", "berth_credential_a"]
        {
            assert!(!is_credential_name(bad), "{bad}");
        }
        assert!(!is_credential_name(&format!("BERTH_CREDENTIAL_{}", "A".repeat(120))));
    }

    #[test]
    fn a_slurm_cluster_maps_each_flavor_to_one_partition() {
        let mut c = sim(vec![]);
        c.spec.kind = ClusterKind::Slurm;
        c.spec.sim = None;
        c.spec.endpoint = Some("http://127.0.0.1:6820".into());
        c.spec.credentials_ref = Some("BERTH_CREDENTIAL_SLURM_A".into());
        let partition = |name: &str, flavor: &str| SlurmPartition {
            name: name.into(),
            flavor: flavor.into(),
            gpu_type: None,
            shards_per_gpu: None,
        };
        c.spec.slurm = Some(SlurmSpec {
            user: "berth".into(),
            api_version: "v0.0.38".into(),
            partitions: vec![partition("gpu", "h100"), partition("a100", "a100")],
            working_directory: "/tmp".into(),
        });
        assert!(c.validate("slurm-a").is_ok());
        let slurm = c.spec.slurm.as_mut().unwrap();
        slurm.partitions[1].flavor = "h100".into();
        slurm.api_version = "v0.0.99".into();
        slurm.working_directory = "relative".into();
        let Err(Error::Invalid(e)) = c.validate("slurm-a") else { panic!() };
        let fields: Vec<_> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["/spec/slurm/api_version", "/spec/slurm/partitions/1/flavor", "/spec/slurm/working_directory"]
        );
    }
}
