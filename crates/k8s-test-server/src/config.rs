//! What a test server starts with: its nodes and its knobs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

/// Configuration of a [`TestApiServer`](crate::TestApiServer).
#[derive(Clone, Debug)]
pub struct Config {
    /// The nodes the cluster starts with.
    pub nodes: Vec<FakeNode>,
    /// When set, every request must carry `Authorization: Bearer <token>` (else 401 Status).
    pub token: Option<String>,
    /// Serve the JobSet CRD (jobset.x-k8s.io/v1alpha2, kind JobSet, plural jobsets) in discovery and as a stored resource.
    pub serve_jobsets: bool,
    /// How often an open watch that asked for bookmarks gets a BOOKMARK event (default 1 s).
    pub bookmark_interval: Duration,
    /// How long a container runs when its env has no FAKE_RUN_SECONDS (default 1.0 s).
    pub default_run_seconds: f64,
    /// How many change events are kept for watches resuming from an older resourceVersion (default 10_000); older → 410.
    pub history_limit: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            token: None,
            serve_jobsets: false,
            bookmark_interval: Duration::from_secs(1),
            default_run_seconds: 1.0,
            history_limit: 10_000,
        }
    }
}

/// A node of the fake cluster, turned into a Node object with capacity, labels and taints.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeNode {
    /// Node name (also its `kubernetes.io/hostname` label).
    pub name: String,
    /// How many units of `gpu_resource` the node has.
    pub gpus: u32,
    /// The extended resource the GPUs are advertised as, e.g. `nvidia.com/gpu` or `nvidia.com/mig-1g.10gb`.
    pub gpu_resource: String,
    /// CPU cores.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Node labels (`kubernetes.io/hostname` is added).
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
}

impl FakeNode {
    /// A node with `gpus` × `nvidia.com/gpu`, 64 CPUs, 512 GiB of memory and the label
    /// `nvidia.com/gpu.product=<product>`.
    pub fn gpu(name: &str, gpus: u32, product: &str) -> Self {
        Self {
            name: name.to_string(),
            gpus,
            gpu_resource: "nvidia.com/gpu".to_string(),
            cpus: 64,
            memory_mib: 512 * 1024,
            labels: BTreeMap::from([("nvidia.com/gpu.product".to_string(), product.to_string())]),
            taints: Vec::new(),
            unschedulable: false,
        }
    }

    /// Adds (or replaces) a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }
}
