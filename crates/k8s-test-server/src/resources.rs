//! The resource types the server stores, and how they map to REST paths.

/// One served resource type.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ResourceType {
    /// Plural (path segment), e.g. `pods`.
    pub plural: &'static str,
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// Kind, e.g. `Pod`.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
}

/// Core v1 pods.
pub(crate) const PODS: &ResourceType =
    &ResourceType { plural: "pods", group: "", version: "v1", kind: "Pod", namespaced: true };
/// Core v1 services.
pub(crate) const SERVICES: &ResourceType =
    &ResourceType { plural: "services", group: "", version: "v1", kind: "Service", namespaced: true };
/// Core v1 namespaces.
pub(crate) const NAMESPACES: &ResourceType =
    &ResourceType { plural: "namespaces", group: "", version: "v1", kind: "Namespace", namespaced: false };
/// Core v1 nodes.
pub(crate) const NODES: &ResourceType =
    &ResourceType { plural: "nodes", group: "", version: "v1", kind: "Node", namespaced: false };
/// batch/v1 jobs.
pub(crate) const JOBS: &ResourceType =
    &ResourceType { plural: "jobs", group: "batch", version: "v1", kind: "Job", namespaced: true };
/// apps/v1 deployments.
pub(crate) const DEPLOYMENTS: &ResourceType =
    &ResourceType { plural: "deployments", group: "apps", version: "v1", kind: "Deployment", namespaced: true };
/// Core v1 service accounts, secrets and config maps, RBAC and pod disruption budgets:
/// stored and validated, nothing acts on them (what deploying Berth itself applies).
pub(crate) const SERVICE_ACCOUNTS: &ResourceType =
    &ResourceType { plural: "serviceaccounts", group: "", version: "v1", kind: "ServiceAccount", namespaced: true };
pub(crate) const SECRETS: &ResourceType =
    &ResourceType { plural: "secrets", group: "", version: "v1", kind: "Secret", namespaced: true };
pub(crate) const CONFIG_MAPS: &ResourceType =
    &ResourceType { plural: "configmaps", group: "", version: "v1", kind: "ConfigMap", namespaced: true };
const RBAC: &str = "rbac.authorization.k8s.io";
pub(crate) const ROLES: &ResourceType =
    &ResourceType { plural: "roles", group: RBAC, version: "v1", kind: "Role", namespaced: true };
pub(crate) const ROLE_BINDINGS: &ResourceType =
    &ResourceType { plural: "rolebindings", group: RBAC, version: "v1", kind: "RoleBinding", namespaced: true };
pub(crate) const CLUSTER_ROLES: &ResourceType =
    &ResourceType { plural: "clusterroles", group: RBAC, version: "v1", kind: "ClusterRole", namespaced: false };
pub(crate) const CLUSTER_ROLE_BINDINGS: &ResourceType = &ResourceType {
    plural: "clusterrolebindings",
    group: RBAC,
    version: "v1",
    kind: "ClusterRoleBinding",
    namespaced: false,
};
pub(crate) const POD_DISRUPTION_BUDGETS: &ResourceType = &ResourceType {
    plural: "poddisruptionbudgets",
    group: "policy",
    version: "v1",
    kind: "PodDisruptionBudget",
    namespaced: true,
};
/// jobset.x-k8s.io/v1alpha2 jobsets (served only when enabled).
pub(crate) const JOBSETS: &ResourceType = &ResourceType {
    plural: "jobsets",
    group: "jobset.x-k8s.io",
    version: "v1alpha2",
    kind: "JobSet",
    namespaced: true,
};

/// Every resource type the server knows, in discovery order.
pub(crate) const ALL: [&ResourceType; 15] = [
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
    SERVICE_ACCOUNTS,
    SECRETS,
    CONFIG_MAPS,
    JOBS,
    DEPLOYMENTS,
    ROLES,
    ROLE_BINDINGS,
    CLUSTER_ROLES,
    CLUSTER_ROLE_BINDINGS,
    POD_DISRUPTION_BUDGETS,
    JOBSETS,
];

/// The API group versions served, as `(group, version)`; the JobSet one only when enabled.
pub(crate) fn group_versions(serve_jobsets: bool) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![("batch", "v1"), ("apps", "v1"), (RBAC, "v1"), ("policy", "v1")];
    if serve_jobsets {
        out.push((JOBSETS.group, JOBSETS.version));
    }
    out
}

/// The resource types served under one group version.
pub(crate) fn in_group_version(group: &str, version: &str, serve_jobsets: bool) -> Vec<&'static ResourceType> {
    ALL.into_iter()
        .filter(|rt| rt.group == group && rt.version == version && (serve_jobsets || *rt != JOBSETS))
        .collect()
}

/// Looks a resource type up by its plural, across all groups.
pub(crate) fn by_plural(plural: &str) -> Option<&'static ResourceType> {
    ALL.into_iter().find(|rt| rt.plural == plural)
}

impl ResourceType {
    /// `apiVersion` of its objects, e.g. `v1` or `batch/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }

    /// Kind of its lists, e.g. `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The resource name used in Status messages, e.g. `pods` or `jobs.batch`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.to_string() } else { format!("{}.{}", self.plural, self.group) }
    }
}
