//! The Job controller (batch/v1): creates pods (Indexed and NonIndexed), counts successes and
//! failures, applies the pod failure policy, backoff limit and active deadline, and writes the
//! job status and its conditions the way the real controller does.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::{Job, PodFailurePolicy};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::{meta, resources};

/// Label and annotation with a pod's completion index.
const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";

/// What the job controller remembers about one job.
#[derive(Debug)]
pub(crate) struct JobTrack {
    /// When the controller first saw the job (for activeDeadlineSeconds).
    started: Instant,
    /// Pods whose outcome has been counted.
    counted: HashSet<String>,
    succeeded: usize,
    failed: usize,
    completed_indexes: BTreeSet<i64>,
}

impl JobTrack {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            counted: HashSet::new(),
            succeeded: 0,
            failed: 0,
            completed_indexes: BTreeSet::new(),
        }
    }
}

/// What the pod failure policy says about a failed pod.
#[derive(Debug, PartialEq)]
enum FailureAction {
    /// Fail the whole job, with this message.
    FailJob(String),
    /// Do not count the failure.
    Ignore,
    /// Count it against the backoff limit.
    Count,
}

/// Evaluates `spec.podFailurePolicy.rules` in order against a failed pod.
fn evaluate_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> FailureAction {
    let Some(policy) = policy else {
        return FailureAction::Count;
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let decide = |action: &str, message: String| match action {
        "FailJob" => FailureAction::FailJob(message),
        "Ignore" => FailureAction::Ignore,
        _ => FailureAction::Count,
    };
    for (index, rule) in policy.rules.iter().enumerate() {
        if let Some(req) = &rule.on_exit_codes {
            let containers =
                status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
            for container in containers {
                let Some(code) = container
                    .state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| t.exit_code)
                    .filter(|c| *c != 0)
                else {
                    continue;
                };
                if req.container_name.as_ref().is_some_and(|n| *n != container.name) {
                    continue;
                }
                let hit = match req.operator.as_str() {
                    "In" => req.values.contains(&code),
                    "NotIn" => !req.values.contains(&code),
                    _ => false,
                };
                if hit {
                    return decide(
                        &rule.action,
                        format!(
                            "Container {} for pod {namespace}/{name} failed with exit code {code} matching {} rule at index {index}",
                            container.name, rule.action
                        ),
                    );
                }
            }
        }
        for pattern in rule.on_pod_conditions.iter().flatten() {
            let wanted = if pattern.status.is_empty() { "True" } else { pattern.status.as_str() };
            let matched = status.conditions.iter().flatten().any(|c| c.type_ == pattern.type_ && c.status == wanted);
            if matched {
                return decide(
                    &rule.action,
                    format!(
                        "Pod {namespace}/{name} has condition {} matching {} rule at index {index}",
                        pattern.type_, rule.action
                    ),
                );
            }
        }
    }
    FailureAction::Count
}

/// `0-2,4` form of a set of indexes.
fn compress_indexes(indexes: &BTreeSet<i64>) -> String {
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for &i in indexes {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == i => *end = i,
            _ => ranges.push((i, i)),
        }
    }
    ranges.iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect::<Vec<_>>().join(",")
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

fn completion_index(pod: &Value) -> Option<i64> {
    pod["metadata"]["annotations"][INDEX_KEY].as_str()?.parse().ok()
}

/// Sets a count in the status, omitting zero like the real API.
fn set_count(status: &mut Value, key: &str, n: usize, keep_zero: bool) {
    if n > 0 || keep_zero {
        status[key] = json!(n);
    } else if let Some(m) = status.as_object_mut() {
        m.remove(key);
    }
}

/// The pod a job creates for `index` (None for NonIndexed jobs).
fn pod_for(job: &Value, index: Option<i64>) -> Value {
    let template = &job["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    if !metadata.is_object() {
        metadata = json!({});
    }
    let job_name = meta::name(job);
    let prefix = match index {
        Some(i) => format!("{job_name}-{i}-"),
        None => format!("{job_name}-"),
    };
    metadata["generateName"] = json!(prefix);
    metadata["labels"]["batch.kubernetes.io/job-name"] = json!(job_name);
    metadata["labels"]["batch.kubernetes.io/controller-uid"] = json!(meta::uid(job));
    metadata["ownerReferences"] = json!([meta::controller_ref(job)]);
    let mut spec = template["spec"].clone();
    if let Some(i) = index {
        metadata["labels"][INDEX_KEY] = json!(i.to_string());
        metadata["annotations"][INDEX_KEY] = json!(i.to_string());
        if let Some(containers) = spec["containers"].as_array_mut() {
            for container in containers {
                if !container["env"].is_array() {
                    container["env"] = json!([]);
                }
                if let Some(env) = container["env"].as_array_mut() {
                    env.push(json!({"name": "JOB_COMPLETION_INDEX", "value": i.to_string()}));
                }
            }
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// One pass of the job controller over every unfinished job that is not being deleted.
/// Returns when the next active deadline of a job falls due.
pub(crate) fn reconcile(cluster: &mut Cluster) -> Option<Instant> {
    let live: HashSet<String> = cluster.store.list(resources::JOBS.plural).map(|j| meta::uid(j).to_string()).collect();
    cluster.job_tracks.retain(|uid, _| live.contains(uid.as_str()));
    let active =
        |j: &Value| !(meta::is_deleting(j) || meta::has_condition(j, "Complete") || meta::has_condition(j, "Failed"));
    let jobs = cluster.store.snapshot_where(resources::JOBS.plural, active);
    if jobs.is_empty() {
        return None;
    }
    let owners: HashSet<&str> = jobs.iter().map(meta::uid).collect();
    let pods = cluster
        .store
        .snapshot_where(resources::PODS.plural, |p| meta::owner_uids(p).iter().any(|o| owners.contains(o)));
    let (now, mut due) = (Instant::now(), None);
    for obj in &jobs {
        let Some(spec) = meta::typed::<Job>(obj).and_then(|j| j.spec) else {
            continue;
        };
        if spec.suspend == Some(true) {
            continue;
        }
        reconcile_job(cluster, obj, &spec, &pods);
        let deadline = spec.active_deadline_seconds.and_then(|d| u64::try_from(d).ok()).map(Duration::from_secs);
        let started = cluster.job_tracks.get(meta::uid(obj)).map(|t| t.started);
        if let (Some(started), Some(deadline)) = (started, deadline) {
            due = super::sooner(due, Some(started + deadline).filter(|at| *at > now));
        }
    }
    due
}

fn reconcile_job(cluster: &mut Cluster, obj: &Value, spec: &k8s_openapi::api::batch::v1::JobSpec, pods: &[Value]) {
    let uid = meta::uid(obj).to_string();
    let namespace = meta::namespace(obj).to_string();
    let owned: Vec<&Value> = pods.iter().filter(|p| meta::is_owned_by(p, &uid)).collect();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let parallelism = usize::try_from(spec.parallelism.unwrap_or(1)).unwrap_or(0);
    let completions = spec.completions.and_then(|c| usize::try_from(c).ok());
    let backoff_limit = usize::try_from(spec.backoff_limit.unwrap_or(6)).unwrap_or(0);
    let failing = meta::has_condition(obj, "FailureTarget");
    let succeeding = meta::has_condition(obj, "SuccessCriteriaMet");

    let track = cluster.job_tracks.entry(uid.clone()).or_insert_with(JobTrack::new);
    let mut failure: Option<(&str, String)> = None;
    for pod in owned.iter().filter(|p| matches!(phase(p), "Succeeded" | "Failed")) {
        if !track.counted.insert(meta::uid(pod).to_string()) {
            continue;
        }
        if phase(pod) == "Succeeded" {
            track.succeeded += 1;
            if let Some(i) = completion_index(pod) {
                track.completed_indexes.insert(i);
            }
            continue;
        }
        let action = if failing || succeeding {
            FailureAction::Count
        } else {
            meta::typed::<Pod>(pod)
                .map_or(FailureAction::Count, |p| evaluate_policy(spec.pod_failure_policy.as_ref(), &p))
        };
        match action {
            FailureAction::FailJob(message) => {
                track.failed += 1;
                failure.get_or_insert(("PodFailurePolicy", message));
            }
            FailureAction::Ignore => {}
            FailureAction::Count => track.failed += 1,
        }
    }
    let succeeded = if indexed { track.completed_indexes.len() } else { track.succeeded };
    if !failing && !succeeding && failure.is_none() {
        if track.failed > backoff_limit {
            failure = Some(("BackoffLimitExceeded", "Job has reached the specified backoff limit".to_string()));
        } else if let Some(deadline) = spec.active_deadline_seconds
            && track.started.elapsed() >= Duration::from_secs(u64::try_from(deadline).unwrap_or(0))
        {
            failure = Some(("DeadlineExceeded", "Job was active longer than specified deadline".to_string()));
        }
    }
    let failed_count = track.failed;
    let completed_indexes = compress_indexes(&track.completed_indexes);
    let done_indexes = track.completed_indexes.clone();

    let running = |p: &&Value| !matches!(phase(p), "Succeeded" | "Failed");
    let active: Vec<&Value> = owned.iter().copied().filter(running).filter(|p| !meta::is_deleting(p)).collect();
    let success = !failing
        && failure.is_none()
        && match (indexed, completions) {
            (true, Some(c)) => (0..c).all(|i| done_indexes.contains(&i64::try_from(i).unwrap_or(-1))),
            (_, Some(c)) => succeeded >= c,
            (_, None) => succeeded > 0 && active.is_empty(),
        };

    let mut updated = obj.clone();
    if let Some((reason, message)) = &failure {
        meta::set_condition(&mut updated, "FailureTarget", "True", reason, message);
    }
    if success && !succeeding {
        meta::set_condition(
            &mut updated,
            "SuccessCriteriaMet",
            "True",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        );
    }
    let stopping = failing || failure.is_some() || succeeding || success;
    if stopping {
        for pod in &active {
            cluster.delete_pod(&namespace, meta::name(pod), None);
        }
    } else {
        create_missing(cluster, obj, indexed, parallelism, completions, succeeded, &active, &done_indexes);
    }
    // Pods as they are now, after deletions.
    let now_pods: Vec<Value> =
        cluster.store.list(resources::PODS.plural).filter(|p| meta::is_owned_by(p, &uid)).cloned().collect();
    let still_running: Vec<&Value> = now_pods.iter().filter(running).collect();
    let active_now = still_running.iter().filter(|p| !meta::is_deleting(p)).count();
    let terminating = still_running.len() - active_now;
    let ready = still_running.iter().filter(|p| !meta::is_deleting(p) && meta::has_condition(p, "Ready")).count();

    let status = &mut updated["status"];
    if status["startTime"].is_null() {
        status["startTime"] = json!(meta::now());
    }
    set_count(status, "active", active_now, false);
    set_count(status, "ready", ready, true);
    set_count(status, "terminating", terminating, true);
    set_count(status, "succeeded", succeeded, false);
    set_count(status, "failed", failed_count, false);
    if indexed && !completed_indexes.is_empty() {
        status["completedIndexes"] = json!(completed_indexes);
    }
    if stopping && still_running.is_empty() {
        if failing || failure.is_some() {
            let target = updated["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "FailureTarget"))
                .cloned()
                .unwrap_or_default();
            let reason = target["reason"].as_str().unwrap_or_default().to_string();
            let message = target["message"].as_str().unwrap_or_default().to_string();
            meta::set_condition(&mut updated, "Failed", "True", &reason, &message);
        } else {
            updated["status"]["completionTime"] = json!(meta::now());
            meta::set_condition(
                &mut updated,
                "Complete",
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            );
        }
    }
    cluster.store.update(resources::JOBS.plural, updated);
}

/// Creates the pods a running job is missing, up to its parallelism.
#[allow(clippy::too_many_arguments)]
fn create_missing(
    cluster: &mut Cluster,
    job: &Value,
    indexed: bool,
    parallelism: usize,
    completions: Option<usize>,
    succeeded: usize,
    active: &[&Value],
    done_indexes: &BTreeSet<i64>,
) {
    let room = parallelism.saturating_sub(active.len());
    let indexes: Vec<Option<i64>> = if indexed {
        let running: BTreeSet<i64> = active.iter().filter_map(|p| completion_index(p)).collect();
        (0..i64::try_from(completions.unwrap_or(0)).unwrap_or(0))
            .filter(|i| !done_indexes.contains(i) && !running.contains(i))
            .take(room)
            .map(Some)
            .collect()
    } else {
        let wanted = match completions {
            Some(c) => c.saturating_sub(succeeded).min(parallelism),
            None if succeeded > 0 => 0,
            None => parallelism,
        };
        vec![None; wanted.saturating_sub(active.len())]
    };
    for index in indexes {
        let pod = pod_for(job, index);
        if let Err(err) = cluster.create(resources::PODS, meta::namespace(job), pod) {
            tracing::warn!(job = meta::name(job), message = %err.message, "job controller could not create a pod");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_compress_to_ranges() {
        assert_eq!(compress_indexes(&BTreeSet::from([0, 1, 2, 4, 6, 7])), "0-2,4,6-7");
        assert_eq!(compress_indexes(&BTreeSet::new()), "");
    }

    #[test]
    fn fail_job_rule_names_container_and_exit_code() {
        let policy: PodFailurePolicy = serde_json::from_value(json!({"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [3]}}
        ]}))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "status": {"containerStatuses": [{"name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 3}}}]}
        }))
        .unwrap();
        assert_eq!(
            evaluate_policy(Some(&policy), &pod),
            FailureAction::FailJob(
                "Container main for pod ns/p failed with exit code 3 matching FailJob rule at index 0".to_string()
            )
        );
    }
}
