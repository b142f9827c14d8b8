//! Node objects of fake nodes, and reading a node's readiness and capacity.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::config::FakeNode;
use crate::meta;

/// The Node object of a fake node: labels, taints, capacity/allocatable and Ready=True.
pub(crate) fn node_object(node: &FakeNode, address: &str) -> Value {
    let mut labels = node.labels.clone();
    labels.insert("kubernetes.io/hostname".to_string(), node.name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), "amd64".to_string());
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), node.cpus.to_string()),
        ("memory".to_string(), format!("{}Mi", node.memory_mib)),
        ("pods".to_string(), "110".to_string()),
        ("ephemeral-storage".to_string(), "1000Gi".to_string()),
    ]);
    if node.gpus > 0 {
        capacity.insert(node.gpu_resource.clone(), node.gpus.to_string());
    }
    let mut spec = json!({"unschedulable": node.unschedulable});
    if !node.taints.is_empty() {
        spec["taints"] = json!(node.taints);
    }
    let now = meta::now();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": node.name},
            ],
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "fake://1.0",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.34.0-berth-test",
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": "berth fake node",
                "systemUUID": "",
            },
        },
    })
}

/// Whether a Node object has condition Ready=True.
pub(crate) fn is_ready(node: &Value) -> bool {
    meta::has_condition(node, "Ready")
}

/// The node's InternalIP, if it has one.
pub(crate) fn internal_ip(node: &Value) -> Option<&str> {
    node["status"]["addresses"]
        .as_array()?
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
}
