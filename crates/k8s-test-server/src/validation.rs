//! Validation of written objects: names, the real k8s-openapi schema (which also normalizes the
//! stored JSON), the checks the real API server makes that Berth may trip over, and immutable
//! fields on update.

use std::collections::HashSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::meta;
use crate::resources::{self, ResourceType};
use crate::selector::label_selector_matches;
use crate::status::Cause;

const SUBDOMAIN_HELP: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_HELP: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_HELP: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// Whether `s` is a DNS-1123 label (without the length limit).
fn is_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Checks `metadata.name` against the rule of the resource type.
fn check_name(rt: &ResourceType, name: &str) -> Result<(), Cause> {
    let invalid = |help: &str| Cause::new("metadata.name", format!("Invalid value: {name:?}: {help}"));
    let too_long = |max: usize| {
        Cause::new("metadata.name", format!("Invalid value: {name:?}: must be no more than {max} characters"))
    };
    if name.is_empty() {
        return Err(Cause::new("metadata.name", "Required value: name or generateName is required"));
    }
    if rt == resources::NAMESPACES {
        if !is_label(name) {
            return Err(invalid(LABEL_HELP));
        }
        return if name.len() > 63 { Err(too_long(63)) } else { Ok(()) };
    }
    if rt == resources::SERVICES {
        if !is_label(name) || !name.as_bytes()[0].is_ascii_lowercase() {
            return Err(invalid(DNS1035_HELP));
        }
        return if name.len() > 63 { Err(too_long(63)) } else { Ok(()) };
    }
    if !name.split('.').all(is_label) {
        return Err(invalid(SUBDOMAIN_HELP));
    }
    let max = if rt == resources::JOBS { 63 } else { 253 };
    if name.len() > max { Err(too_long(max)) } else { Ok(()) }
}

/// Deserializes into the k8s-openapi type `T` and serializes back: the stored form.
fn round_trip<T: DeserializeOwned + Serialize>(obj: Value) -> Result<Value, Cause> {
    let typed: T = serde_path_to_error::deserialize(obj).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        Cause::new(field, format!("Invalid value: {}", e.inner()))
    })?;
    serde_json::to_value(typed).map_err(|e| Cause::new("", e.to_string()))
}

/// The pod spec checks (containers present, named, unique, with images).
fn check_pod_spec(spec: &PodSpec, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    if spec.containers.is_empty() {
        causes.push(Cause::new(format!("{path}.containers"), "Required value"));
    }
    let mut seen = HashSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let field = format!("{path}.containers[{i}]");
        if !is_label(&c.name) || c.name.len() > 63 {
            causes.push(Cause::new(format!("{field}.name"), format!("Invalid value: {:?}: {LABEL_HELP}", c.name)));
        } else if !seen.insert(c.name.as_str()) {
            causes.push(Cause::new(format!("{field}.name"), format!("Duplicate value: {:?}", c.name)));
        }
        if c.image.as_deref().is_none_or(str::is_empty) {
            causes.push(Cause::new(format!("{field}.image"), "Required value"));
        }
    }
    causes
}

fn check_job(obj: &Value) -> Vec<Cause> {
    let Some(job) = meta::typed::<Job>(obj) else {
        return Vec::new();
    };
    let Some(spec) = job.spec else {
        return vec![Cause::new("spec", "Required value")];
    };
    let Some(pod_spec) = spec.template.spec.as_ref() else {
        return vec![Cause::new("spec.template.spec", "Required value")];
    };
    let mut causes = check_pod_spec(pod_spec, "spec.template.spec");
    match pod_spec.restart_policy.as_deref() {
        Some("Never" | "OnFailure") => {}
        Some(other) => causes.push(Cause::new(
            "spec.template.spec.restartPolicy",
            format!("Unsupported value: {other:?}: supported values: \"OnFailure\", \"Never\""),
        )),
        None => causes.push(Cause::new(
            "spec.template.spec.restartPolicy",
            "Required value: valid values: \"OnFailure\", \"Never\"",
        )),
    }
    if spec.completion_mode.as_deref() == Some("Indexed") && spec.completions.is_none() {
        causes.push(Cause::new("spec.completions", "Required value: when completion mode is Indexed"));
    }
    for (field, value) in [
        ("spec.parallelism", spec.parallelism),
        ("spec.completions", spec.completions),
        ("spec.backoffLimit", spec.backoff_limit),
    ] {
        if value.is_some_and(|v| v < 0) {
            causes.push(Cause::new(field, "Invalid value: must be greater than or equal to 0"));
        }
    }
    causes
}

fn check_deployment(obj: &Value) -> Vec<Cause> {
    let Some(spec) = meta::typed::<Deployment>(obj).and_then(|d| d.spec) else {
        return vec![Cause::new("spec", "Required value")];
    };
    let mut causes = match spec.template.spec.as_ref() {
        Some(pod_spec) => check_pod_spec(pod_spec, "spec.template.spec"),
        None => vec![Cause::new("spec.template.spec", "Required value")],
    };
    let labels = spec.template.metadata.and_then(|m| m.labels).unwrap_or_default();
    if !label_selector_matches(&spec.selector, &labels) {
        causes.push(Cause::new(
            "spec.template.metadata.labels",
            "Invalid value: `selector` does not match template `labels`",
        ));
    }
    causes
}

/// Validates an object about to be stored and returns its normalized (stored) form.
pub(crate) fn validate(rt: &ResourceType, obj: Value) -> Result<Value, Vec<Cause>> {
    check_name(rt, meta::name(&obj)).map_err(|c| vec![c])?;
    let normalized = match rt.plural {
        "pods" => round_trip::<Pod>(obj),
        "jobs" => round_trip::<Job>(obj),
        "deployments" => round_trip::<Deployment>(obj),
        "services" => round_trip::<Service>(obj),
        "namespaces" => round_trip::<Namespace>(obj),
        "nodes" => round_trip::<Node>(obj),
        "serviceaccounts" => round_trip::<ServiceAccount>(obj),
        "secrets" => round_trip::<Secret>(obj),
        "configmaps" => round_trip::<ConfigMap>(obj),
        "roles" => round_trip::<Role>(obj),
        "rolebindings" => round_trip::<RoleBinding>(obj),
        "clusterroles" => round_trip::<ClusterRole>(obj),
        "clusterrolebindings" => round_trip::<ClusterRoleBinding>(obj),
        "poddisruptionbudgets" => round_trip::<PodDisruptionBudget>(obj),
        _ if obj["spec"].is_object() => Ok(obj),
        _ => Err(Cause::new("spec", "Required value")),
    }
    .map_err(|c| vec![c])?;
    let causes = match rt.plural {
        "pods" => match meta::typed::<Pod>(&normalized).and_then(|p| p.spec) {
            Some(spec) => check_pod_spec(&spec, "spec"),
            None => vec![Cause::new("spec", "Required value")],
        },
        "jobs" => check_job(&normalized),
        "deployments" => check_deployment(&normalized),
        _ => Vec::new(),
    };
    if causes.is_empty() { Ok(normalized) } else { Err(causes) }
}

/// The fields that may not change on update, per resource type.
fn immutable_fields(rt: &ResourceType) -> &'static [&'static str] {
    match rt.plural {
        "jobs" => &["spec.template", "spec.completions", "spec.selector", "spec.completionMode"],
        "deployments" => &["spec.selector"],
        _ => &[],
    }
}

/// Rejects an update that changes an immutable field.
pub(crate) fn check_immutable(rt: &ResourceType, old: &Value, new: &Value) -> Result<(), Vec<Cause>> {
    let lookup = |obj: &'_ Value, path: &str| path.split('.').fold(obj, |v, s| &v[s]).clone();
    let causes: Vec<Cause> = immutable_fields(rt)
        .iter()
        .filter(|path| lookup(old, path) != lookup(new, path))
        .map(|path| Cause::new(*path, "Invalid value: field is immutable"))
        .collect();
    if causes.is_empty() { Ok(()) } else { Err(causes) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_follow_the_resource_rules() {
        assert!(check_name(resources::PODS, "a.b-c").is_ok());
        assert!(check_name(resources::PODS, "Bad_Name").is_err());
        assert!(check_name(resources::NAMESPACES, "a.b").is_err());
        assert!(check_name(resources::SERVICES, "1abc").is_err());
        assert!(check_name(resources::JOBS, &"a".repeat(64)).is_err());
        assert!(check_name(resources::PODS, &"a".repeat(64)).is_ok());
    }

    #[test]
    fn schema_errors_name_the_field() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "image": "x", "ports": "eighty"}]}});
        let causes = validate(resources::PODS, pod).unwrap_err();
        assert_eq!(causes[0].field, "spec.containers[0].ports");
    }

    #[test]
    fn job_template_is_immutable() {
        let old = json!({"spec": {"template": {"spec": {"containers": []}}, "parallelism": 1}});
        let new = json!({"spec": {"template": {"spec": {"containers": [{}]}}, "parallelism": 2}});
        let causes = check_immutable(resources::JOBS, &old, &new).unwrap_err();
        assert_eq!(causes, vec![Cause::new("spec.template", "Invalid value: field is immutable")]);
    }
}
