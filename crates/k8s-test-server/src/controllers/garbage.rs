//! The garbage collector: finishes deletions (foreground finalizer, terminated pods), deletes
//! dependents whose owners are gone, and fails pods bound to nodes that no longer exist.

use std::collections::HashSet;

use serde_json::json;

use crate::cluster::Cluster;
use crate::controllers::kubelet;
use crate::deletion::{FOREGROUND_FINALIZER, Propagation};
use crate::{meta, resources};

/// One pass of the garbage collector.
pub(crate) fn reconcile(cluster: &mut Cluster) {
    finish_deletions(cluster);
    collect_orphans(cluster);
    fail_pods_of_missing_nodes(cluster);
}

/// Removes objects being deleted once nothing holds them: the foreground finalizer is dropped
/// when no dependents remain, and pods go once their containers have stopped.
fn finish_deletions(cluster: &mut Cluster) {
    for rt in resources::ALL {
        for obj in cluster.store.snapshot_where(rt.plural, meta::is_deleting) {
            let (namespace, name) = (meta::namespace(&obj).to_string(), meta::name(&obj).to_string());
            let mut finalizers = meta::finalizers(&obj);
            if finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) && cluster.dependents(meta::uid(&obj)).is_empty() {
                finalizers.retain(|f| f != FOREGROUND_FINALIZER);
                cluster.store.modify(rt.plural, &namespace, &name, |o| {
                    o["metadata"]["finalizers"] = json!(finalizers);
                });
            }
            if !finalizers.is_empty() {
                continue;
            }
            let stopped = rt != resources::PODS
                || matches!(obj["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                || obj["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
            if stopped {
                cluster.store.remove(rt.plural, &namespace, &name);
            }
        }
    }
}

/// Deletes (in the background) objects all of whose owners are gone.
fn collect_orphans(cluster: &mut Cluster) {
    let uids: HashSet<String> = resources::ALL
        .into_iter()
        .flat_map(|rt| cluster.store.list(rt.plural))
        .map(|o| meta::uid(o).to_string())
        .collect();
    for rt in resources::ALL.into_iter().filter(|rt| rt.namespaced) {
        let orphans: Vec<(String, String)> = cluster
            .store
            .list(rt.plural)
            .filter(|o| !meta::is_deleting(o))
            .filter(|o| {
                let owners = meta::owner_uids(o);
                !owners.is_empty() && owners.iter().all(|u| !uids.contains(*u))
            })
            .map(|o| (meta::namespace(o).to_string(), meta::name(o).to_string()))
            .collect();
        for (namespace, name) in orphans {
            cluster.delete_object(rt, &namespace, &name, Propagation::Background, None);
        }
    }
}

/// Pods bound to a node that no longer exists fail (DisruptionTarget, DeletionByPodGC) and are
/// marked deleted, like the real PodGC does; the next pass removes them (after the job
/// controller has seen the failure).
fn fail_pods_of_missing_nodes(cluster: &mut Cluster) {
    let nodes: HashSet<String> =
        cluster.store.list(resources::NODES.plural).map(|n| meta::name(n).to_string()).collect();
    let stranded: Vec<(String, String)> = cluster
        .store
        .list(resources::PODS.plural)
        .filter(|p| p["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty() && !nodes.contains(n)))
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .map(|p| (meta::namespace(p).to_string(), meta::name(p).to_string()))
        .collect();
    for (namespace, name) in stranded {
        cluster.store.modify(resources::PODS.plural, &namespace, &name, |pod| {
            kubelet::fail_pod(
                pod,
                "NodeLost",
                "PodGC: node no longer exists",
                ("DeletionByPodGC", "PodGC: node no longer exists"),
                (137, "ContainerStatusUnknown", "The container could not be located when the pod was terminated"),
            );
            pod["metadata"]["deletionTimestamp"] = json!(meta::now());
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        });
    }
}
