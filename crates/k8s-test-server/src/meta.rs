//! Small helpers over stored objects (JSON values): metadata access, timestamps, names, conditions.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The alphabet Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The current time as a Kubernetes timestamp (RFC 3339, seconds, UTC).
pub(crate) fn now() -> String {
    timestamp_in(0)
}

/// The time `seconds` from now as a Kubernetes timestamp.
pub(crate) fn timestamp_in(seconds: i64) -> String {
    let since_epoch =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let at = Timestamp::from_second(since_epoch.saturating_add(seconds)).unwrap_or(Timestamp::UNIX_EPOCH);
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `n` random lowercase alphanumerics, as used by `generateName`.
pub(crate) fn random_suffix(n: usize) -> String {
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for byte in uuid::Uuid::new_v4().into_bytes() {
            if out.len() == n {
                break;
            }
            out.push(char::from(SUFFIX_ALPHABET[usize::from(byte) % SUFFIX_ALPHABET.len()]));
        }
    }
    out
}

/// `metadata.name` (empty if absent).
pub(crate) fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// `metadata.namespace` (empty if absent or cluster-scoped).
pub(crate) fn namespace(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or_default()
}

/// `metadata.uid` (empty if absent).
pub(crate) fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

/// `metadata.resourceVersion` (empty if absent).
pub(crate) fn resource_version(obj: &Value) -> &str {
    obj["metadata"]["resourceVersion"].as_str().unwrap_or_default()
}

/// `metadata.labels` as a map.
pub(crate) fn labels(obj: &Value) -> BTreeMap<String, String> {
    obj["metadata"]["labels"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
        .unwrap_or_default()
}

/// Whether `metadata.deletionTimestamp` is set.
pub(crate) fn is_deleting(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
}

/// `metadata.finalizers` (empty if absent).
pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The uids named by `metadata.ownerReferences`.
pub(crate) fn owner_uids(obj: &Value) -> Vec<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str()).collect())
        .unwrap_or_default()
}

/// Whether `obj` has an ownerReference to `owner_uid`.
pub(crate) fn is_owned_by(obj: &Value, owner_uid: &str) -> bool {
    owner_uids(obj).contains(&owner_uid)
}

/// The kind of the controlling owner, if any.
pub(crate) fn controller_kind(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))
        .and_then(|r| r["kind"].as_str())
}

/// An ownerReference naming `owner` as controller.
pub(crate) fn controller_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": name(owner),
        "uid": uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Deserializes a stored object into its k8s-openapi type.
pub(crate) fn typed<T: DeserializeOwned>(obj: &Value) -> Option<T> {
    serde_json::from_value(obj.clone()).ok()
}

/// Sets a condition in `status.conditions` of `obj`, keeping `lastTransitionTime` when the status
/// does not change (so that an unchanged condition does not change the object).
pub(crate) fn set_condition(obj: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    if !obj["status"]["conditions"].is_array() {
        obj["status"]["conditions"] = json!([]);
    }
    let Some(conditions) = obj["status"]["conditions"].as_array_mut() else {
        return;
    };
    let mut condition = json!({"type": type_, "status": status, "lastTransitionTime": now()});
    if !reason.is_empty() {
        condition["reason"] = json!(reason);
    }
    if !message.is_empty() {
        condition["message"] = json!(message);
    }
    match conditions.iter_mut().find(|c| c["type"] == type_) {
        Some(existing) => {
            if existing["status"] == status {
                condition["lastTransitionTime"] = existing["lastTransitionTime"].clone();
            }
            *existing = condition;
        }
        None => conditions.push(condition),
    }
}

/// Whether `obj` has condition `type_` with status `True`.
pub(crate) fn has_condition(obj: &Value, type_: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|conds| conds.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}
