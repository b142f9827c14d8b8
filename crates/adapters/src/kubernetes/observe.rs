//! Reading the cluster: the inventory from Nodes and Pods, and a job's state from its Job
//! (or Deployment) and pods. Pure functions over `k8s-openapi` objects.

use std::collections::HashMap;
use std::time::Duration;

use berth_core::cluster::KubernetesSpec;
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::manifest::{CONTAINER, KEY_LABEL, PRODUCT_LABEL, key_of};
use crate::backend::{InventoryNode, JobKey, JobState, JobStatus};

/// Container waiting reasons that will not clear up by themselves: the job cannot start.
const STUCK: [&str; 5] =
    ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"];

/// The cluster's nodes as Berth sees them, with the GPUs held by pods that have not
/// finished (Berth's, and everyone else's).
pub fn inventory(spec: &KubernetesSpec, nodes: &[&Node], pods: &[&Pod]) -> Vec<InventoryNode> {
    let mut used: HashMap<&str, (u32, u32)> = HashMap::new();
    for pod in pods.iter().filter(|p| holds_node(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        let Some(n) = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node)) else { continue };
        let resource = flavor_of(spec, n).map_or("nvidia.com/gpu", |f| f.resource.as_str());
        let gpus = pod_limit(pod, resource) * 100;
        let entry = used.entry(node).or_default();
        entry.0 += gpus;
        if key_of(pod.metadata.labels.as_ref()).is_none() {
            entry.1 += gpus;
        }
    }
    nodes
        .iter()
        .map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            let flavor = flavor_of(spec, n);
            let resource = flavor.map_or("nvidia.com/gpu", |f| f.resource.as_str());
            let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
            let amount = |r: &str| allocatable.and_then(|a| a.get(r)).map_or(0.0, quantity);
            let (gpus_used, gpus_used_outside_berth) = used.get(name.as_str()).copied().unwrap_or_default();
            InventoryNode {
                flavor: flavor.map(|f| f.flavor.clone()),
                gpus: amount(resource) as u32,
                gpus_used,
                gpus_used_outside_berth,
                cpus: amount("cpu") as u32,
                memory_mib: (amount("memory") / (1024.0 * 1024.0)) as u64,
                block: n.metadata.labels.as_ref().and_then(|l| l.get(&spec.topology_label)).cloned(),
                schedulable: schedulable(n),
                name,
            }
        })
        .collect()
}

fn flavor_of<'a>(spec: &'a KubernetesSpec, node: &Node) -> Option<&'a berth_core::cluster::KubernetesFlavor> {
    let product = node.metadata.labels.as_ref()?.get(PRODUCT_LABEL)?;
    spec.flavors.iter().find(|f| &f.product == product)
}

/// Ready, not cordoned, and no taint that keeps new pods off (Berth's pods tolerate the
/// usual `nvidia.com/gpu` taint of GPU nodes).
fn schedulable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|taints| {
        taints.iter().any(|t| (t.effect == "NoSchedule" || t.effect == "NoExecute") && t.key != "nvidia.com/gpu")
    });
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready && !cordoned && !tainted
}

/// Whether a pod holds its node's resources: bound and not finished.
fn holds_node(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed")
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// The pod's limit of an extended resource, summed over its containers.
fn pod_limit(pod: &Pod, resource: &str) -> u32 {
    pod.spec.as_ref().map_or(0, |s| {
        s.containers
            .iter()
            .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(resource))
            .map(|q| quantity(q) as u32)
            .sum()
    })
}

/// A Kubernetes quantity as a number (`8`, `500m`, `64Gi`, `1e3`, `2E`); 0 when unreadable.
pub fn quantity(q: &Quantity) -> f64 {
    let s = q.0.trim();
    // The suffix is the trailing letters; an exponent (`1e3`) ends in a digit.
    let split = s.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len();
    let (number, suffix) = s.split_at(split);
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        _ => return 0.0,
    };
    number.parse::<f64>().map_or(0.0, |n| n * scale)
}

pub fn time(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32).unwrap_or_default()
}

/// The pods of each job, by key.
pub fn pods_by_key<'a>(pods: &[&'a Pod]) -> HashMap<JobKey, Vec<&'a Pod>> {
    let mut by_key: HashMap<JobKey, Vec<&Pod>> = HashMap::new();
    for pod in pods {
        if let Some(key) = key_of(pod.metadata.labels.as_ref()) {
            by_key.entry(key).or_default().push(pod);
        }
    }
    by_key
}

fn job_id(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

fn blank(key: JobKey, meta: &ObjectMeta) -> JobStatus {
    JobStatus {
        key,
        job_id: job_id(meta),
        state: JobState::Queued,
        exit_code: None,
        reason: None,
        submitted_at: meta.creation_timestamp.as_ref().map_or_else(Utc::now, time),
        started_at: None,
        finished_at: None,
        cancelling: meta.deletion_timestamp.is_some(),
        output: None,
        url: None,
    }
}

/// A Job's state: its conditions once it finished, else Running once every index has a
/// running pod (the gang started), else Queued; a pod that cannot start (its image cannot
/// be pulled) fails it, and pods left unschedulable past `gang_timeout` after the Job was
/// made make it Unplaceable.
pub fn job_status(key: JobKey, job: &Job, pods: &[&Pod], gang_timeout: Duration) -> JobStatus {
    let mut status = blank(key, &job.metadata);
    let s = job.status.as_ref();
    let condition =
        |t: &str| s.and_then(|s| s.conditions.as_ref())?.iter().find(|c| c.type_ == t && c.status == "True").cloned();
    status.started_at = pods.iter().filter_map(|p| p.status.as_ref()?.start_time.as_ref()).map(time).min();
    if let Some(done) = condition("Complete") {
        status.state = JobState::Succeeded;
        status.exit_code = Some(0);
        status.finished_at =
            s.and_then(|s| s.completion_time.as_ref()).or(done.last_transition_time.as_ref()).map(time);
        return status;
    }
    if let Some(failed) = condition("Failed") {
        // activeDeadlineSeconds is the workload's max_runtime_seconds.
        status.state = match failed.reason.as_deref() {
            Some("DeadlineExceeded") => JobState::TimedOut,
            _ => JobState::Failed,
        };
        status.finished_at = failed.last_transition_time.as_ref().map(time);
        let (exit_code, why) = pod_failure(pods).unzip();
        status.exit_code = exit_code.flatten();
        let job_reason = failed.reason.unwrap_or_else(|| "Failed".into());
        let job_message = failed.message.unwrap_or_default();
        status.reason = Some(match why {
            Some(why) => format!("{why} ({job_reason}: {job_message})"),
            None => format!("{job_reason}: {job_message}"),
        });
        return status;
    }
    if let Some(stuck) = stuck(pods) {
        status.state = JobState::Failed;
        status.reason = Some(stuck);
        return status;
    }
    let tasks = job.spec.as_ref().and_then(|s| s.completions.or(s.parallelism)).unwrap_or(1).max(1);
    let running = pods.iter().filter(|p| phase(p) == "Running" || phase(p) == "Succeeded").count();
    if running >= tasks as usize {
        status.state = JobState::Running;
    } else {
        unplaceable(&mut status, pods, gang_timeout);
    }
    status
}

/// Marks a job that has not started Unplaceable when one of its pods has stayed
/// unschedulable for longer than `gang_timeout` since the job was made.
fn unplaceable(status: &mut JobStatus, pods: &[&Pod], gang_timeout: Duration) {
    let waited = (Utc::now() - status.submitted_at).to_std().unwrap_or_default();
    if waited < gang_timeout {
        return;
    }
    let why = pods.iter().find_map(|p| {
        let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False").then(|| c.message.clone().unwrap_or_else(|| "unschedulable".into()))
    });
    if let Some(why) = why {
        status.state = JobState::Unplaceable;
        status.reason = Some(format!("pods unschedulable for over {}s: {why}", gang_timeout.as_secs()));
    }
}

/// A Deployment's state: Running once all its replicas are available, else Queued (or
/// Unplaceable, as for Jobs, while none is); a Deployment never finishes by itself
/// (inference serves until Berth stops it).
pub fn deployment_status(key: JobKey, deployment: &Deployment, pods: &[&Pod], gang_timeout: Duration) -> JobStatus {
    let mut status = blank(key, &deployment.metadata);
    // A service's own Service has its name, port 80 (a replica of another service has
    // none: it answers at that one's).
    let meta = &deployment.metadata;
    let service = meta.labels.as_ref().and_then(|l| l.get(super::SERVICE_LABEL));
    let mut buf = uuid::Uuid::encode_buffer();
    let own: &str = key.workload.hyphenated().encode_lower(&mut buf);
    if service.is_none_or(|s| s.as_str() == own) {
        status.url = Some(format!(
            "http://{}.{}.svc",
            meta.name.as_deref().unwrap_or_default(),
            meta.namespace.as_deref().unwrap_or_default()
        ));
    }
    if let Some(stuck) = stuck(pods) {
        status.state = JobState::Failed;
        status.reason = Some(stuck);
        return status;
    }
    let wanted = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available = deployment.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
    status.started_at = pods.iter().filter_map(|p| p.status.as_ref()?.start_time.as_ref()).map(time).min();
    if available >= wanted && wanted > 0 {
        status.state = JobState::Running;
    } else if available == 0 {
        unplaceable(&mut status, pods, gang_timeout);
    }
    status
}

/// A pod whose container cannot start, in words: "ImagePullBackOff: Back-off pulling …".
fn stuck(pods: &[&Pod]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            let reason = waiting.reason.as_deref().filter(|r| STUCK.contains(r))?;
            Some(format!(
                "{reason}: pod {} cannot start: {}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                waiting.message.as_deref().unwrap_or("")
            ))
        })
    })
}

/// Why the first failed pod failed, in words, with its container's exit code:
/// OOMKilled, Evicted, NodeLost, or an exit code.
fn pod_failure(pods: &[&Pod]) -> Option<(Option<i32>, String)> {
    let pod = pods
        .iter()
        .filter(|p| phase(p) == "Failed")
        .min_by_key(|p| p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map_or(1, |_| 0))?;
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref()?;
    let terminated = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER).or(cs.first()))
        .and_then(|c| c.state.as_ref()?.terminated.clone());
    let exit_code = terminated.as_ref().map(|t| t.exit_code);
    if let Some(reason) = status.reason.as_deref() {
        // Evicted, NodeLost, …: the pod was stopped from outside.
        let message = status.message.as_deref().unwrap_or("");
        return Some((exit_code, format!("{reason}: pod {name} {message}").trim_end().to_owned()));
    }
    let t = terminated?;
    let why = match t.reason.as_deref() {
        Some("OOMKilled") => {
            format!("OOMKilled: container {CONTAINER} of pod {name} ran out of memory (exit {})", t.exit_code)
        }
        Some(reason) if reason != "Error" && reason != "Completed" => {
            format!("{reason}: container {CONTAINER} of pod {name} exited with code {}", t.exit_code)
        }
        _ => format!("container {CONTAINER} of pod {name} exited with code {}", t.exit_code),
    };
    Some((exit_code, why))
}

/// The key label's selector for one job.
pub fn key_selector(key: JobKey) -> String {
    format!("{KEY_LABEL}={}", key.name())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec() -> KubernetesSpec {
        serde_json::from_value(json!({"flavors": [
            {"flavor": "h100", "product": "H100"},
            {"flavor": "a100-mig", "product": "A100", "resource": "nvidia.com/mig-1g.10gb"},
        ]}))
        .unwrap()
    }

    fn node(name: &str, product: &str, resource: &str, gpus: u32) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {PRODUCT_LABEL: product, "berth.dev/topology-block": "b1"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {resource: gpus.to_string(), "cpu": "63500m", "memory": "512Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap()
    }

    fn pod(name: &str, node: &str, resource: &str, gpus: u32, key: Option<&str>, phase: &str) -> Pod {
        let labels = key.map_or(json!({}), |k| json!({KEY_LABEL: k}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": {resource: gpus.to_string()}}}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn inventory_counts_gpus_of_the_flavors_resource_and_whose_pods_hold_them() {
        let key = JobKey { workload: uuid::Uuid::nil(), attempt: 0 }.name();
        let nodes = [node("h1", "H100", "nvidia.com/gpu", 8), node("m1", "A100", "nvidia.com/mig-1g.10gb", 7)];
        let mut cordoned = node("x1", "T4", "nvidia.com/gpu", 1);
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        let pods = [
            pod("p1", "h1", "nvidia.com/gpu", 4, Some(&key), "Running"),
            pod("p2", "h1", "nvidia.com/gpu", 2, None, "Running"),
            pod("p3", "h1", "nvidia.com/gpu", 2, None, "Succeeded"),
            pod("p4", "m1", "nvidia.com/mig-1g.10gb", 3, None, "Pending"),
        ];
        let nodes: Vec<&Node> = nodes.iter().chain([&cordoned]).collect();
        let inv = inventory(&spec(), &nodes, &pods.iter().collect::<Vec<_>>());
        let h1 = &inv[0];
        assert_eq!(
            (h1.flavor.as_deref(), h1.gpus, h1.gpus_used, h1.gpus_used_outside_berth),
            (Some("h100"), 8, 600, 200)
        );
        assert_eq!((h1.cpus, h1.memory_mib, h1.block.as_deref(), h1.schedulable), (63, 512 * 1024, Some("b1"), true));
        let m1 = &inv[1];
        assert_eq!((m1.flavor.as_deref(), m1.gpus, m1.gpus_used), (Some("a100-mig"), 7, 300));
        assert_eq!((inv[2].flavor.as_deref(), inv[2].schedulable), (None, false));
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        for (q, n) in [
            ("8", 8.0),
            ("500m", 0.5),
            ("250u", 250e-6),
            ("2Ki", 2048.0),
            ("1G", 1e9),
            ("2E", 2e18),
            ("1Ei", 1024.0_f64.powi(6)),
            ("1e3", 1000.0),
            ("bogus", 0.0),
        ] {
            assert_eq!(quantity(&Quantity(q.into())), n, "{q}");
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn pods_left_unschedulable_past_the_gang_timeout_make_the_job_unplaceable() {
        let key = JobKey { workload: uuid::Uuid::nil(), attempt: 0 };
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"completions": 2, "template": {}},
        }))
        .unwrap();
        let pending: Pod = serde_json::from_value(json!({
            "metadata": {"name": "j-0-abcde"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]},
        }))
        .unwrap();
        let s = job_status(key, &job, &[&pending], HOUR);
        assert_eq!(s.state, JobState::Unplaceable);
        assert!(s.reason.as_deref().unwrap().ends_with("2 Insufficient nvidia.com/gpu."), "{s:?}");
        let mut young = job.clone();
        young.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(job_status(key, &young, &[&pending], HOUR).state, JobState::Queued);
    }

    fn failed_job(reason: &str, message: &str) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"completions": 1, "template": {}},
            "status": {"conditions": [{"type": "Failed", "status": "True", "reason": reason, "message": message,
                "lastTransitionTime": "2026-01-01T00:01:00Z"}]},
        }))
        .unwrap()
    }

    #[test]
    fn failure_reasons_come_from_the_failed_pod() {
        let key = JobKey { workload: uuid::Uuid::nil(), attempt: 0 };
        let oom: Pod = serde_json::from_value(json!({
            "metadata": {"name": "j-0-abcde"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]},
        }))
        .unwrap();
        let s = job_status(key, &failed_job("PodFailurePolicy", "Container main failed"), &[&oom], HOUR);
        assert_eq!((s.state, s.exit_code), (JobState::Failed, Some(137)));
        assert!(s.reason.as_deref().unwrap().starts_with("OOMKilled: container main of pod j-0-abcde"), "{s:?}");
        assert_eq!(s.job_id, "ns/j");
        let evicted: Pod = serde_json::from_value(json!({
            "metadata": {"name": "j-0-fghij"},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "was evicted"},
        }))
        .unwrap();
        let s = job_status(key, &failed_job("PodFailurePolicy", "disrupted"), &[&evicted], HOUR);
        assert_eq!(s.reason.as_deref(), Some("Evicted: pod j-0-fghij was evicted (PodFailurePolicy: disrupted)"));
        let s = job_status(
            key,
            &failed_job("DeadlineExceeded", "Job was active longer than specified deadline"),
            &[],
            HOUR,
        );
        assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded: Job was active longer than specified deadline"));
        assert_eq!(s.state, JobState::TimedOut, "activeDeadlineSeconds is the workload's max_runtime_seconds");
    }
}
