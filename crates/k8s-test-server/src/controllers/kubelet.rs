//! The fake kubelet (kwok-like): runs bound pods on Ready nodes following their containers'
//! FAKE_* environment variables, and stops the containers of pods being deleted.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::{meta, nodes, resources};

/// Image prefix whose pulls always fail.
const MISSING_IMAGE_PREFIX: &str = "missing.invalid/";
/// How long a failed pull shows ErrImagePull before ImagePullBackOff.
const PULL_BACKOFF_AFTER: Duration = Duration::from_millis(500);
/// Exit code of a container stopped by SIGTERM.
const SIGTERM_EXIT_CODE: i32 = 143;
/// Exit code of a container killed by the OOM killer.
const OOM_EXIT_CODE: i32 = 137;

/// What the fake kubelet remembers about one pod.
#[derive(Debug, Default)]
pub(crate) struct PodClock {
    /// When its containers started.
    pub started: Option<Instant>,
    /// When its image pull first failed.
    pub pull_failed: Option<Instant>,
    /// When its deletion was requested (SIGTERM sent).
    pub stop_requested: Option<Instant>,
    /// When it is killed, where a second deletion cut its grace period short (else when
    /// its grace period, counted from `stop_requested`, ends).
    pub kill_by: Option<Instant>,
    /// When each of its containers terminated (its log ends there).
    pub terminated: HashMap<String, Instant>,
}

/// How one container behaves, read from its env.
struct Behavior {
    run: Option<Duration>,
    exit_code: i32,
    reason: &'static str,
    sigterm: Duration,
}

pub(crate) fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(Duration::MAX)
}

/// How long the container runs before it exits of itself; `None`: until stopped.
pub(crate) fn run_time(container: &Container, default_run_seconds: f64, runs_forever: bool) -> Option<Duration> {
    behavior(container, default_run_seconds, runs_forever).run
}

fn behavior(container: &Container, default_run_seconds: f64, runs_forever: bool) -> Behavior {
    let run = env_value(container, "FAKE_RUN_SECONDS")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(default_run_seconds);
    let oom = env_value(container, "FAKE_TERMINATION_REASON") == Some("OOMKilled");
    let exit_code = if oom {
        OOM_EXIT_CODE
    } else {
        env_value(container, "FAKE_EXIT_CODE").and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    };
    let reason = match (oom, exit_code) {
        (true, _) => "OOMKilled",
        (false, 0) => "Completed",
        (false, _) => "Error",
    };
    let sigterm =
        env_value(container, "FAKE_SIGTERM_SECONDS").and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
    Behavior { run: (!runs_forever).then(|| seconds(run)), exit_code, reason, sigterm: seconds(sigterm) }
}

/// Marks every container that has not terminated as terminated.
pub(crate) fn terminate_containers(pod: &mut Value, exit_code: i32, reason: &str, message: &str) {
    let now = meta::now();
    if let Some(statuses) = pod["status"]["containerStatuses"].as_array_mut() {
        for status in statuses {
            if status["state"]["terminated"].is_object() {
                continue;
            }
            let started_at = status["state"]["running"]["startedAt"].clone();
            let mut terminated = json!({
                "exitCode": exit_code,
                "reason": reason,
                "finishedAt": now,
                "containerID": status["containerID"],
            });
            if !started_at.is_null() {
                terminated["startedAt"] = started_at;
            }
            if !message.is_empty() {
                terminated["message"] = json!(message);
            }
            status["state"] = json!({"terminated": terminated});
            status["ready"] = json!(false);
            status["started"] = json!(false);
        }
    }
}

/// Fails a pod from outside its containers (eviction, lost node, orphaned pod): phase Failed,
/// reason/message, DisruptionTarget=True and its containers terminated.
pub(crate) fn fail_pod(
    pod: &mut Value,
    reason: &str,
    message: &str,
    disruption: (&str, &str),
    container: (i32, &str, &str),
) {
    let (exit_code, container_reason, container_message) = container;
    terminate_containers(pod, exit_code, container_reason, container_message);
    pod["status"]["phase"] = json!("Failed");
    pod["status"]["reason"] = json!(reason);
    pod["status"]["message"] = json!(message);
    meta::set_condition(pod, "DisruptionTarget", "True", disruption.0, disruption.1);
    meta::set_condition(pod, "Ready", "False", "PodFailed", "");
    meta::set_condition(pod, "ContainersReady", "False", "PodFailed", "");
}

/// Sets the containers' waiting state for a failed image pull.
fn pull_failure(pod: &mut Value, spec: &[Container], backoff: bool) {
    let statuses: Vec<Value> = spec
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let waiting = if !image.starts_with(MISSING_IMAGE_PREFIX) {
                json!({"reason": "ContainerCreating"})
            } else if backoff {
                json!({"reason": "ImagePullBackOff", "message": format!("Back-off pulling image \"{image}\"")})
            } else {
                json!({"reason": "ErrImagePull", "message": format!("rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": not found")})
            };
            json!({"name": c.name, "image": image, "imageID": "", "ready": false, "started": false, "restartCount": 0, "state": {"waiting": waiting}})
        })
        .collect();
    let names: Vec<&str> = spec.iter().map(|c| c.name.as_str()).collect();
    let unready = format!("containers with unready status: [{}]", names.join(" "));
    pod["status"]["containerStatuses"] = json!(statuses);
    meta::set_condition(pod, "Initialized", "True", "", "");
    meta::set_condition(pod, "Ready", "False", "ContainersNotReady", &unready);
    meta::set_condition(pod, "ContainersReady", "False", "ContainersNotReady", &unready);
}

/// Starts every container: phase Running, Ready, IPs and start times.
fn start(pod: &mut Value, spec: &[Container], pod_ip: &str, host_ip: Option<&str>) {
    let now = meta::now();
    let uid = meta::uid(pod).to_string();
    let statuses: Vec<Value> = spec
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image,
                "imageID": format!("fake://{}", c.image.clone().unwrap_or_default()),
                "containerID": format!("fake://{uid}/{}", c.name),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let status = &mut pod["status"];
    status["phase"] = json!("Running");
    status["startTime"] = json!(now);
    status["podIP"] = json!(pod_ip);
    status["podIPs"] = json!([{"ip": pod_ip}]);
    if let Some(host_ip) = host_ip {
        status["hostIP"] = json!(host_ip);
        status["hostIPs"] = json!([{"ip": host_ip}]);
    }
    status["containerStatuses"] = json!(statuses);
    meta::set_condition(pod, "Initialized", "True", "", "");
    meta::set_condition(pod, "Ready", "True", "", "");
    meta::set_condition(pod, "ContainersReady", "True", "", "");
}

/// Terminates the containers whose time has come; sets the phase once all have terminated.
/// Returns when the next of the others will stop by itself or be killed.
fn progress(
    pod: &mut Value,
    plans: &HashMap<String, Behavior>,
    clock: &mut PodClock,
    grace: Duration,
    now: Instant,
) -> Option<Instant> {
    let started = clock.started?;
    let mut next: Option<Instant> = None;
    let finished_at = meta::now();
    if let Some(statuses) = pod["status"]["containerStatuses"].as_array_mut() {
        for status in statuses.iter_mut() {
            let Some(plan) = status["name"].as_str().and_then(|n| plans.get(n)) else {
                continue;
            };
            if status["state"]["running"].is_null() {
                continue;
            }
            let natural = plan.run.map(|run| started + run);
            let killed = clock.stop_requested.map(|at| (at + plan.sigterm).min(clock.kill_by.unwrap_or(at + grace)));
            let (exit_code, reason) = match (natural, killed) {
                (Some(n), Some(k)) if k < n && now >= k => (SIGTERM_EXIT_CODE, "Error"),
                (None, Some(k)) if now >= k => (SIGTERM_EXIT_CODE, "Error"),
                (Some(n), _) if now >= n => (plan.exit_code, plan.reason),
                _ => {
                    next = super::sooner(next, super::sooner(natural, killed));
                    continue;
                }
            };
            if let Some(name) = status["name"].as_str() {
                clock.terminated.insert(name.to_owned(), now);
            }
            status["state"] = json!({"terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "startedAt": status["state"]["running"]["startedAt"],
                "finishedAt": finished_at,
                "containerID": status["containerID"],
            }});
            status["ready"] = json!(false);
            status["started"] = json!(false);
        }
    }
    let statuses = pod["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
    let running: Vec<&str> =
        statuses.iter().filter(|s| s["state"]["terminated"].is_null()).filter_map(|s| s["name"].as_str()).collect();
    if running.is_empty() {
        let failed = statuses.iter().any(|s| s["state"]["terminated"]["exitCode"] != 0);
        pod["status"]["phase"] = json!(if failed { "Failed" } else { "Succeeded" });
        meta::set_condition(pod, "Ready", "False", "PodCompleted", "");
        meta::set_condition(pod, "ContainersReady", "False", "PodCompleted", "");
    } else if running.len() < statuses.len() {
        let unready: Vec<&str> = statuses
            .iter()
            .filter(|s| !s["state"]["terminated"].is_null())
            .filter_map(|s| s["name"].as_str())
            .collect();
        let message = format!("containers with unready status: [{}]", unready.join(" "));
        meta::set_condition(pod, "Ready", "False", "ContainersNotReady", &message);
        meta::set_condition(pod, "ContainersReady", "False", "ContainersNotReady", &message);
    }
    next
}

/// One pass of the fake kubelet over every bound, unfinished pod on a Ready node. Returns
/// when the next change that time alone brings is due (a container's exit or kill, an image
/// pull's back-off), so that an idle cluster is not passed over again before then.
pub(crate) fn reconcile(cluster: &mut Cluster) -> Option<Instant> {
    let now = Instant::now();
    let mut due: Option<Instant> = None;
    let ready_nodes: HashMap<String, Option<String>> = cluster
        .store
        .list(resources::NODES.plural)
        .filter(|n| nodes::is_ready(n))
        .map(|n| (meta::name(n).to_string(), nodes::internal_ip(n).map(str::to_string)))
        .collect();
    let live: HashSet<&str> = cluster.store.list(resources::PODS.plural).map(meta::uid).collect();
    cluster.pod_clocks.retain(|uid, _| live.contains(uid.as_str()));
    let bound_and_unfinished = |p: &Value| {
        p["spec"]["nodeName"].is_string() && !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
    };
    let pods = cluster.store.snapshot_where(resources::PODS.plural, bound_and_unfinished);
    for obj in &pods {
        let Some(node) = obj["spec"]["nodeName"].as_str() else {
            continue;
        };
        let Some(host_ip) = ready_nodes.get(node) else {
            continue;
        };
        let Some(pod) = meta::typed::<Pod>(obj) else {
            continue;
        };
        let containers = pod.spec.map(|s| s.containers).unwrap_or_default();
        let (namespace, name) = (meta::namespace(obj).to_string(), meta::name(obj).to_string());
        let deleting = meta::is_deleting(obj);
        let runs_forever = meta::controller_kind(obj) == Some("Deployment");
        let pulls_fail =
            containers.iter().any(|c| c.image.as_deref().is_some_and(|i| i.starts_with(MISSING_IMAGE_PREFIX)));
        let started = cluster.pod_clocks.get(meta::uid(obj)).and_then(|c| c.started);
        if deleting && (pulls_fail || started.is_none()) {
            // Nothing runs: the pod goes at once.
            cluster.remove_or_mark(resources::PODS, &namespace, &name);
            continue;
        }
        let mut updated = obj.clone();
        if pulls_fail {
            let clock = cluster.pod_clocks.entry(meta::uid(obj).to_string()).or_default();
            let backoff_at = *clock.pull_failed.get_or_insert(now) + PULL_BACKOFF_AFTER;
            pull_failure(&mut updated, &containers, now >= backoff_at);
            due = super::sooner(due, Some(backoff_at).filter(|at| *at > now));
        } else if started.is_none() {
            let pod_ip = cluster.next_address("10.244");
            start(&mut updated, &containers, &pod_ip, host_ip.as_deref());
            cluster.pod_clocks.entry(meta::uid(obj).to_string()).or_default().started = Some(now);
        } else {
            let plans: HashMap<String, Behavior> = containers
                .iter()
                .map(|c| (c.name.clone(), behavior(c, cluster.default_run_seconds, runs_forever)))
                .collect();
            let grace = seconds(obj["metadata"]["deletionGracePeriodSeconds"].as_f64().unwrap_or(0.0));
            let clock = cluster.pod_clocks.entry(meta::uid(obj).to_string()).or_default();
            if deleting && clock.stop_requested.is_none() {
                clock.stop_requested = Some(now);
            }
            due = super::sooner(due, progress(&mut updated, &plans, clock, grace, now));
        }
        cluster.store.update(resources::PODS.plural, updated);
    }
    due
}
