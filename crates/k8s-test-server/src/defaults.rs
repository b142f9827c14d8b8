//! What the API server fills in on writes: server-set metadata, reset/preserved status and the
//! defaulted fields of each kind.

use serde_json::{Value, json};

use crate::meta;
use crate::resources::ResourceType;

/// Metadata fields only the server sets; carried over from the stored object on update.
const SERVER_METADATA: [&str; 5] =
    ["uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"];

/// Sets `obj[key]` to `value` when it is absent or null.
fn default(obj: &mut Value, key: &str, value: Value) {
    if obj[key].is_null() {
        obj[key] = value;
    }
}

fn default_pod(obj: &mut Value) {
    let spec = &mut obj["spec"];
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "schedulerName", json!("default-scheduler"));
    if let Some(containers) = spec["containers"].as_array_mut() {
        for container in containers {
            // Requests default to limits.
            let limits = container["resources"]["limits"].as_object().cloned().unwrap_or_default();
            for (resource, quantity) in limits {
                default(&mut container["resources"]["requests"], &resource, quantity);
            }
        }
    }
}

fn default_job(obj: &mut Value) {
    let uid = meta::uid(obj).to_string();
    let name = meta::name(obj).to_string();
    let spec = &mut obj["spec"];
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        spec["completions"] = json!(1);
    }
    default(spec, "parallelism", json!(1));
    default(spec, "backoffLimit", json!(6));
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    if spec["manualSelector"].as_bool() != Some(true) {
        default(spec, "selector", json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}));
        let labels = &mut spec["template"]["metadata"]["labels"];
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", &uid),
            ("batch.kubernetes.io/job-name", &name),
            ("controller-uid", &uid),
            ("job-name", &name),
        ] {
            default(labels, key, json!(value));
        }
    }
}

/// Fills the defaulted fields of a kind (idempotent; applied on every write to an object that
/// passed schema validation).
pub(crate) fn apply(rt: &ResourceType, obj: &mut Value) {
    match rt.plural {
        "pods" => default_pod(obj),
        "jobs" => default_job(obj),
        "deployments" => default(&mut obj["spec"], "replicas", json!(1)),
        "services" => default(&mut obj["spec"], "type", json!("ClusterIP")),
        "namespaces" => {
            let name = meta::name(obj).to_string();
            default(&mut obj["metadata"]["labels"], "kubernetes.io/metadata.name", json!(name));
        }
        _ => {}
    }
}

/// Prepares a new object: fresh uid, creation time, generation 1 and initial status. `obj` must be
/// a JSON object whose metadata is an object.
pub(crate) fn on_create(rt: &ResourceType, obj: &mut Value) {
    let metadata = &mut obj["metadata"];
    if let Some(m) = metadata.as_object_mut() {
        for key in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"] {
            m.remove(key);
        }
    }
    metadata["uid"] = json!(uuid::Uuid::new_v4().to_string());
    metadata["creationTimestamp"] = json!(meta::now());
    metadata["generation"] = json!(1);
    match rt.plural {
        // Nodes may carry their status on create, like on the real server.
        "nodes" => {}
        "pods" => obj["status"] = json!({"phase": "Pending"}),
        "namespaces" => obj["status"] = json!({"phase": "Active"}),
        "services" => obj["status"] = json!({"loadBalancer": {}}),
        _ => obj["status"] = json!({}),
    }
}

/// Prepares an update of `old` to `new`: server-set metadata and (unless `status_only`) the
/// status are kept from `old`; with `status_only` only the status is taken from `new`. `new` must
/// be a JSON object whose metadata is an object.
pub(crate) fn on_update(old: &Value, new: &mut Value, status_only: bool) {
    if status_only {
        let status = new["status"].take();
        *new = old.clone();
        new["status"] = status;
        return;
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    for key in SERVER_METADATA {
        match &old["metadata"][key] {
            Value::Null => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(key);
                }
            }
            value => new["metadata"][key] = value.clone(),
        }
    }
    match &old["status"] {
        Value::Null => {
            if let Some(m) = new.as_object_mut() {
                m.remove("status");
            }
        }
        status => new["status"] = status.clone(),
    }
}

/// Bumps `metadata.generation` of `new` when its spec differs from `old`'s.
pub(crate) fn bump_generation(old: &Value, new: &mut Value) {
    if new["spec"] != old["spec"] {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(generation + 1);
    }
}
