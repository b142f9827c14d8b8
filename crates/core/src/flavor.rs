//! Flavors: classes of accelerator (`h100-80gb`, `a100-40gb`, `l4`, CPU-only) and how each
//! backend names them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::apply::validate_meta;
use crate::error::Error;
use crate::meta::{ApplyMeta, ObjectMeta};
use crate::validation::Validator;

/// Desired state of a flavor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "description": "NVIDIA H100 SXM 80 GB",
    "gpu_memory_gib": 80,
    "slurm": {"gres_type": "h100"},
    "kubernetes": {"node_label_value": "NVIDIA-H100-80GB-HBM3"}
}))]
pub struct FlavorSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$")]
    pub description: Option<String>,
    /// Memory per GPU (or per MIG slice), for display and placement hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 4096)]
    pub gpu_memory_gib: Option<u32>,
    /// A CPU-only flavor: workloads on it request no GPUs.
    #[serde(default)]
    pub cpu_only: bool,
    /// The MIG profile this flavor stands for, e.g. `1g.10gb` (not with `cpu_only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9.]{1,32}$")]
    pub mig_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmFlavor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesFlavor>,
    /// What a GPU-hour of this flavor costs, for the usage report (in the organisation's
    /// currency). Each attempt is costed at the price when it ended (or now, while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
}

/// A flavor's price per GPU-hour, optionally different per cluster (a reservation, spot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"per_gpu_hour": 2.5, "clusters": {"spot-east": 0.9}}))]
pub struct Price {
    #[schema(minimum = 0, maximum = 1_000_000)]
    pub per_gpu_hour: f64,
    /// Prices on particular clusters, by cluster name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub clusters: std::collections::BTreeMap<String, f64>,
}

impl Price {
    /// The price of a GPU-hour on `cluster`.
    pub fn on(&self, cluster: &str) -> f64 {
        self.clusters.get(cluster).copied().unwrap_or(self.per_gpu_hour)
    }
}

/// How Slurm names the flavor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmFlavor {
    /// The GRES type, as in `gpu:<type>:<count>`.
    #[schema(example = "h100", pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub gres_type: String,
}

/// How Kubernetes names the flavor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesFlavor {
    /// The node label that carries the GPU product.
    #[serde(default = "default_node_label_key")]
    #[schema(
        example = "nvidia.com/gpu.product",
        pattern = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$",
        max_length = 316
    )]
    pub node_label_key: String,
    /// The label's value on nodes of this flavor.
    #[schema(example = "NVIDIA-H100-80GB-HBM3", pattern = "^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")]
    pub node_label_value: String,
}

fn default_node_label_key() -> String {
    "nvidia.com/gpu.product".into()
}

/// Observed state of a flavor. Flavors have none yet; the field keeps the envelope uniform.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FlavorStatus {}

/// A GPU flavor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Flavor {
    pub metadata: ObjectMeta,
    pub spec: FlavorSpec,
    pub status: FlavorStatus,
}

/// The body of `PUT /api/v1/flavors/{name}`. `status` is accepted and ignored.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlavorApply {
    #[serde(default)]
    pub metadata: ApplyMeta,
    pub spec: FlavorSpec,
    /// Ignored: status is written only by Berth.
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}

impl FlavorApply {
    /// Checks everything that needs no other object.
    ///
    /// # Errors
    /// [`Error::Invalid`] listing every broken rule.
    pub fn validate(&self, name: &str) -> Result<(), Error> {
        let mut v = Validator::new();
        validate_meta(&mut v, &self.metadata, name);
        let s = &self.spec;
        if let Some(d) = &s.description {
            v.text("/spec/description", d, 1024);
        }
        if let Some(m) = s.gpu_memory_gib {
            v.check((1..=4096).contains(&m), "/spec/gpu_memory_gib", || "must be between 1 and 4096".into());
        }
        if let Some(p) = &s.mig_profile {
            let ok = !p.is_empty() && p.len() <= 32 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.');
            v.check(ok, "/spec/mig_profile", || "must look like a MIG profile, e.g. 1g.10gb".into());
        }
        v.check(!(s.cpu_only && s.mig_profile.is_some()), "/spec/mig_profile", || {
            "a CPU-only flavor has no MIG profile".into()
        });
        if let Some(p) = &s.price {
            let ok = |x: f64| x.is_finite() && (0.0..=crate::usage::PRICE_MAX).contains(&x);
            v.check(ok(p.per_gpu_hour), "/spec/price/per_gpu_hour", || "must be a number from 0 to 1000000".into());
            v.check(p.clusters.len() <= 64, "/spec/price/clusters", || "at most 64 cluster prices".into());
            for (c, x) in &p.clusters {
                let at = format!("/spec/price/clusters/{}", crate::validation::escape_pointer(c));
                v.name(&at, c);
                v.check(ok(*x), at, || "must be a number from 0 to 1000000".into());
            }
        }
        if let Some(slurm) = &s.slurm {
            let ok = !slurm.gres_type.is_empty()
                && slurm.gres_type.len() <= 64
                && slurm.gres_type.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            v.check(ok, "/spec/slurm/gres_type", || "must be 1-64 letters, digits, '-', '_' or '.'".into());
        }
        if let Some(k8s) = &s.kubernetes {
            if let Err(m) = crate::validation::check_label_key(&k8s.node_label_key) {
                v.error("/spec/kubernetes/node_label_key", m);
            }
            if let Err(m) = crate::validation::check_label_value(&k8s.node_label_value) {
                v.error("/spec/kubernetes/node_label_value", m);
            }
        }
        v.finish()
    }
}
