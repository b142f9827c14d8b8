//! Disruptions a test can inject: evicting a pod and losing a node.

use crate::cluster::Cluster;
use crate::controllers::kubelet;
use crate::{meta, resources};

impl Cluster {
    /// Evicts a pod: phase Failed, reason Evicted, DisruptionTarget=True (EvictionByEvictionAPI).
    pub fn evict(&mut self, namespace: &str, pod: &str) {
        self.store.modify(resources::PODS.plural, namespace, pod, |p| {
            kubelet::fail_pod(
                p,
                "Evicted",
                "The pod was evicted by the Berth test API server.",
                ("EvictionByEvictionAPI", "Eviction API: evicting"),
                (137, "Error", ""),
            );
        });
    }

    /// Loses a node: Ready=False (NodeStatusUnknown) and its unfinished pods fail with reason
    /// NodeLost and DisruptionTarget=True.
    pub fn lose_node(&mut self, node: &str) {
        self.store.modify(resources::NODES.plural, "", node, |n| {
            meta::set_condition(n, "Ready", "False", "NodeStatusUnknown", "Kubelet stopped posting node status.");
        });
        let pods: Vec<(String, String)> = self
            .store
            .list(resources::PODS.plural)
            .filter(|p| p["spec"]["nodeName"] == node)
            .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
            .map(|p| (meta::namespace(p).to_string(), meta::name(p).to_string()))
            .collect();
        for (namespace, name) in pods {
            let message = format!("Node {node} which was running pod {name} is unresponsive");
            self.store.modify(resources::PODS.plural, &namespace, &name, |p| {
                kubelet::fail_pod(
                    p,
                    "NodeLost",
                    &message,
                    ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"),
                    (137, "ContainerStatusUnknown", "The container could not be located when the pod was terminated"),
                );
            });
        }
    }
}
