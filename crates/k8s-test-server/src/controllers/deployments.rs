//! The Deployment controller (apps/v1), without ReplicaSet objects: keeps `spec.replicas` pods of
//! the current template (named `{deployment}-{template hash}-{random}`), replaces pods of an
//! older template, scales down newest first, and writes the deployment status.

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::{meta, resources};

/// Label carrying the template hash, as on real ReplicaSet pods.
const HASH_LABEL: &str = "pod-template-hash";
/// The alphabet of the template hash (as Kubernetes' SafeEncodeString).
const HASH_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A 10-character hash of a pod template.
fn template_hash(template: &Value) -> String {
    // FNV-1a over the canonical JSON (serde_json maps are key-ordered).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in template.to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (0..10)
        .map(|i| {
            let digit = (hash >> (i * 6)) % HASH_ALPHABET.len() as u64;
            char::from(HASH_ALPHABET[usize::try_from(digit).unwrap_or(0)])
        })
        .collect()
}

fn is_running(pod: &Value) -> bool {
    !matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) && !meta::is_deleting(pod)
}

/// The pod a deployment creates from its template.
fn pod_for(deployment: &Value, hash: &str) -> Value {
    let template = &deployment["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["generateName"] = json!(format!("{}-{hash}-", meta::name(deployment)));
    metadata["labels"][HASH_LABEL] = json!(hash);
    metadata["ownerReferences"] = json!([meta::controller_ref(deployment)]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

/// Sets a count in the status, omitting zero like the real API.
fn set_count(status: &mut Value, key: &str, n: usize) {
    if n > 0 {
        status[key] = json!(n);
    } else if let Some(m) = status.as_object_mut() {
        m.remove(key);
    }
}

/// One pass of the deployment controller over every deployment not being deleted.
pub(crate) fn reconcile(cluster: &mut Cluster) {
    for obj in cluster.store.snapshot(resources::DEPLOYMENTS.plural) {
        if meta::is_deleting(&obj) {
            continue;
        }
        reconcile_deployment(cluster, &obj);
    }
}

fn reconcile_deployment(cluster: &mut Cluster, obj: &Value) {
    let uid = meta::uid(obj).to_string();
    let namespace = meta::namespace(obj).to_string();
    let replicas = usize::try_from(obj["spec"]["replicas"].as_i64().unwrap_or(1)).unwrap_or(0);
    let hash = template_hash(&obj["spec"]["template"]);
    let owned: Vec<Value> = cluster
        .store
        .list(resources::PODS.plural)
        .filter(|p| meta::is_owned_by(p, &uid) && is_running(p))
        .cloned()
        .collect();
    let (mut current, old): (Vec<Value>, Vec<Value>) =
        owned.into_iter().partition(|p| p["metadata"]["labels"][HASH_LABEL] == hash.as_str());
    for pod in &old {
        cluster.delete_pod(&namespace, meta::name(pod), None);
    }
    if current.len() > replicas {
        // Unready first, then newest first.
        current.sort_by(|a, b| {
            let key = |p: &Value| {
                (
                    meta::has_condition(p, "Ready"),
                    std::cmp::Reverse(p["metadata"]["creationTimestamp"].as_str().unwrap_or_default().to_string()),
                    std::cmp::Reverse(meta::name(p).to_string()),
                )
            };
            key(a).cmp(&key(b))
        });
        for pod in current.drain(..current.len() - replicas) {
            cluster.delete_pod(&namespace, meta::name(&pod), None);
        }
    }
    for _ in current.len()..replicas {
        if let Err(err) = cluster.create(resources::PODS, &namespace, pod_for(obj, &hash)) {
            tracing::warn!(deployment = meta::name(obj), message = %err.message, "deployment controller could not create a pod");
        }
    }
    let ready = current.iter().filter(|p| meta::has_condition(p, "Ready")).count();
    let mut updated = obj.clone();
    let status = &mut updated["status"];
    status["observedGeneration"] = obj["metadata"]["generation"].clone();
    set_count(status, "replicas", current.len());
    set_count(status, "updatedReplicas", current.len());
    set_count(status, "readyReplicas", ready);
    set_count(status, "availableReplicas", ready);
    set_count(status, "unavailableReplicas", replicas.saturating_sub(ready));
    if ready >= replicas {
        meta::set_condition(
            &mut updated,
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
        );
    } else {
        meta::set_condition(
            &mut updated,
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        );
    }
    let progress = if ready >= replicas && old.is_empty() {
        ("NewReplicaSetAvailable", "Deployment has successfully progressed.")
    } else {
        ("ReplicaSetUpdated", "Deployment is progressing.")
    };
    meta::set_condition(&mut updated, "Progressing", "True", progress.0, progress.1);
    cluster.store.update(resources::DEPLOYMENTS.plural, updated);
}
