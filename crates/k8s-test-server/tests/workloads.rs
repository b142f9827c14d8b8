//! The built-in controllers seen through a kube client: scheduling onto GPU nodes, the fake
//! kubelet, the Job and Deployment controllers, deletion and injected disruptions.

mod common;

use berth_k8s_test_server::{Config, FakeNode};
use common::{eventually, gpu_cluster, indexed_job, job_condition, pod, start};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The pod's condition `type_`, as (status, reason, message).
fn pod_condition(pod: &Pod, type_: &str) -> Option<(String, String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

#[tokio::test]
async fn indexed_gpu_job_runs_on_the_gpu_node_and_completes() {
    let (_server, client) = start(gpu_cluster()).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let job = jobs
        .create(&PostParams::default(), &indexed_job("train", 2, 1, &[("FAKE_RUN_SECONDS", "0.3")], json!({})))
        .await
        .unwrap();

    let running = eventually("two running job pods", || async {
        let list = pods.list(&ListParams::default().labels("batch.kubernetes.io/job-name=train")).await.unwrap();
        (list.items.len() == 2 && list.items.iter().all(|p| phase(p) == "Running")).then_some(list.items)
    })
    .await;
    let mut indexes: Vec<String> = running
        .iter()
        .map(|p| {
            assert_eq!(p.spec.as_ref().unwrap().node_name.as_deref(), Some("gpu-1"));
            assert_eq!(p.owner_references()[0].uid, job.uid().unwrap());
            assert_eq!(p.owner_references()[0].controller, Some(true));
            let index = p.labels()["batch.kubernetes.io/job-completion-index"].clone();
            assert!(p.name_any().starts_with(&format!("train-{index}-")));
            let env = p.spec.as_ref().unwrap().containers[0].env.clone().unwrap();
            assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX" && e.value.as_deref() == Some(&index)));
            assert_eq!(pod_condition(p, "Ready").unwrap().0, "True");
            index
        })
        .collect();
    indexes.sort();
    assert_eq!(indexes, vec!["0", "1"]);

    let done = eventually("the job to complete", || async {
        let job = jobs.get("train").await.unwrap();
        job_condition(&job, "Complete").map(|_| job)
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!(status.succeeded, Some(2));
    assert_eq!(status.completed_indexes.as_deref(), Some("0-1"));
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    let types: Vec<String> = status.conditions.unwrap().into_iter().map(|c| c.type_).collect();
    assert_eq!(types, vec!["SuccessCriteriaMet", "Complete"]);
    // Pods of a finished job stay, Succeeded.
    let left = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|p| phase(p) == "Succeeded"));
    let terminated = left[0].status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (0, Some("Completed")));
}

#[tokio::test]
async fn fail_job_rule_fails_the_job_with_the_real_message() {
    let (_server, client) = start(gpu_cluster()).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let policy = json!({"podFailurePolicy": {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [3]}},
    ]}, "backoffLimit": 6});
    jobs.create(
        &PostParams::default(),
        &indexed_job("bad", 1, 1, &[("FAKE_RUN_SECONDS", "0.1"), ("FAKE_EXIT_CODE", "3")], policy),
    )
    .await
    .unwrap();
    let failed = eventually("the job to fail", || async {
        let job = jobs.get("bad").await.unwrap();
        job_condition(&job, "Failed").map(|c| (job, c))
    })
    .await;
    let (job, (reason, message)) = failed;
    assert_eq!(reason, "PodFailurePolicy");
    assert!(
        message.starts_with("Container main for pod default/bad-0-")
            && message.ends_with("failed with exit code 3 matching FailJob rule at index 1"),
        "{message}"
    );
    assert!(job_condition(&job, "FailureTarget").is_some());
    assert_eq!(job.status.unwrap().failed, Some(1));
}

#[tokio::test]
async fn backoff_limit_and_deadline_fail_jobs() {
    let (_server, client) = start(gpu_cluster()).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    jobs.create(
        &PostParams::default(),
        &indexed_job("flaky", 1, 0, &[("FAKE_RUN_SECONDS", "0"), ("FAKE_EXIT_CODE", "1")], json!({"backoffLimit": 1})),
    )
    .await
    .unwrap();
    jobs.create(
        &PostParams::default(),
        &indexed_job("slow", 1, 0, &[("FAKE_RUN_SECONDS", "60")], json!({"activeDeadlineSeconds": 1})),
    )
    .await
    .unwrap();
    let (reason, _) = eventually("flaky to exceed its backoff limit", || async {
        job_condition(&jobs.get("flaky").await.unwrap(), "Failed")
    })
    .await;
    assert_eq!(reason, "BackoffLimitExceeded");
    assert_eq!(jobs.get("flaky").await.unwrap().status.unwrap().failed, Some(2));
    let (reason, _) = eventually("slow to exceed its deadline", || async {
        job_condition(&jobs.get("slow").await.unwrap(), "Failed")
    })
    .await;
    assert_eq!(reason, "DeadlineExceeded");
    // Its running pod was stopped and removed.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let slow_pods = pods.list(&ListParams::default().labels("batch.kubernetes.io/job-name=slow")).await.unwrap();
    assert!(slow_pods.items.is_empty());
}

#[tokio::test]
async fn oom_killed_and_image_pull_failures_look_real() {
    let (_server, client) = start(gpu_cluster()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let oom = pod("oom", "busybox", &[("FAKE_RUN_SECONDS", "0.1"), ("FAKE_TERMINATION_REASON", "OOMKilled")], 0);
    pods.create(&PostParams::default(), &oom).await.unwrap();
    pods.create(&PostParams::default(), &pod("pull", "missing.invalid/nothing:1", &[], 0)).await.unwrap();

    let oom = eventually("the OOM kill", || async {
        let p = pods.get("oom").await.unwrap();
        (phase(&p) == "Failed").then_some(p)
    })
    .await;
    let terminated = oom.status.unwrap().container_statuses.unwrap()[0].state.clone().unwrap().terminated.unwrap();
    assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (137, Some("OOMKilled")));

    let waiting = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.clone())
            .and_then(|s| s.waiting)
    };
    let first = eventually("ErrImagePull", || async {
        let p = pods.get("pull").await.unwrap();
        waiting(&p).and_then(|w| w.reason)
    })
    .await;
    assert!(first == "ErrImagePull" || first == "ImagePullBackOff", "{first}");
    let backoff = eventually("ImagePullBackOff", || async {
        let p = pods.get("pull").await.unwrap();
        waiting(&p).filter(|w| w.reason.as_deref() == Some("ImagePullBackOff")).map(|w| (p, w))
    })
    .await;
    assert_eq!(phase(&backoff.0), "Pending");
    assert_eq!(backoff.1.message.as_deref(), Some("Back-off pulling image \"missing.invalid/nothing:1\""));
    // A pod stuck pulling goes at once when deleted.
    pods.delete("pull", &DeleteParams::default()).await.unwrap();
    eventually("the stuck pod to go", || async { pods.get_opt("pull").await.unwrap().is_none().then_some(()) }).await;
}

#[tokio::test]
async fn scheduler_reports_why_nothing_fits_and_honors_selectors_and_taints() {
    let (server, client) = start(Config {
        nodes: vec![
            FakeNode::gpu("gpu-1", 1, "H100"),
            FakeNode::gpu("gpu-2", 1, "A100").label("berth.dev/topology-block", "b2"),
        ],
        ..Config::default()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["big-1", "big-2"] {
        pods.create(&PostParams::default(), &pod(name, "busybox", &[("FAKE_RUN_SECONDS", "60")], 1)).await.unwrap();
    }
    pods.create(&PostParams::default(), &pod("waiting", "busybox", &[], 1)).await.unwrap();
    let (status, reason, message) = eventually("the unschedulable condition", || async {
        pod_condition(&pods.get("waiting").await.unwrap(), "PodScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Unschedulable"));
    assert_eq!(message, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
    assert_eq!(pods.get("waiting").await.unwrap().spec.unwrap().node_name, None);

    // Freeing a GPU lets the waiting pod in.
    pods.delete("big-2", &DeleteParams::default()).await.unwrap();
    let node = eventually("the waiting pod to be bound", || async {
        pods.get("waiting").await.unwrap().spec.unwrap().node_name
    })
    .await;
    assert_eq!(node, "gpu-2");

    // Required node affinity and taints.
    let nodes: Api<Node> = Api::all(client.clone());
    server.add_node(FakeNode {
        taints: vec![
            serde_json::from_value(json!({"key": "dedicated", "value": "ml", "effect": "NoSchedule"})).unwrap(),
        ],
        ..FakeNode::gpu("gpu-3", 4, "H100").label("berth.dev/topology-block", "b3")
    });
    let mut pinned = pod("pinned", "busybox", &[("FAKE_RUN_SECONDS", "60")], 1);
    pinned.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "berth.dev/topology-block", "operator": "In", "values": ["b3"]}]}]
        }}}))
        .unwrap(),
    );
    pods.create(&PostParams::default(), &pinned).await.unwrap();
    let (_, _, message) = eventually("the taint to block the pinned pod", || async {
        pod_condition(&pods.get("pinned").await.unwrap(), "PodScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert!(message.contains("1 node(s) had untolerated taint {dedicated: ml}"), "{message}");
    assert!(message.contains("2 node(s) didn't match Pod's node affinity/selector"), "{message}");
    nodes.patch("gpu-3", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": null}}))).await.unwrap();
    let node = eventually("the pinned pod to be bound", || async {
        pods.get("pinned").await.unwrap().spec.unwrap().node_name
    })
    .await;
    assert_eq!(node, "gpu-3");

    // Cordoned nodes take nothing new.
    nodes
        .patch("gpu-3", &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("late", "busybox", &[], 1)).await.unwrap();
    let (_, _, message) = eventually("the cordon to block", || async {
        pod_condition(&pods.get("late").await.unwrap(), "PodScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert!(message.contains("1 node(s) were unschedulable"), "{message}");
}

#[tokio::test]
async fn foreground_delete_removes_pods_before_the_job() {
    let (server, client) = start(gpu_cluster()).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    jobs.create(
        &PostParams::default(),
        &indexed_job("long", 2, 1, &[("FAKE_RUN_SECONDS", "60"), ("FAKE_SIGTERM_SECONDS", "2")], json!({})),
    )
    .await
    .unwrap();
    eventually("running pods", || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        (list.len() == 2 && list.iter().all(|p| phase(p) == "Running")).then_some(())
    })
    .await;
    jobs.delete("long", &DeleteParams::foreground().grace_period(5)).await.unwrap();

    let job = jobs.get("long").await.unwrap();
    assert!(job.metadata.deletion_timestamp.is_some());
    assert!(job.finalizers().contains(&"foregroundDeletion".to_string()));
    for p in pods.list(&ListParams::default()).await.unwrap() {
        assert!(p.metadata.deletion_timestamp.is_some());
        assert_eq!(p.metadata.deletion_grace_period_seconds, Some(5));
    }
    eventually("pods and then the job to go", || async {
        let pods_left = server.objects("pods").len();
        let job_left = server.objects("jobs").len();
        assert!(job_left == 1 || pods_left == 0, "the job went before its pods");
        (pods_left == 0 && job_left == 0).then_some(())
    })
    .await;
}

/// As the API server: deleting a terminating pod again with a shorter grace period
/// replaces the one that runs, and its container (which ignores SIGTERM) is killed when
/// the shorter one ends; a longer one changes nothing.
#[tokio::test]
async fn a_second_delete_with_a_shorter_grace_period_kills_sooner() {
    let (server, client) = start(gpu_cluster()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let vars = [("FAKE_RUN_SECONDS", "3600"), ("FAKE_SIGTERM_SECONDS", "3600")];
    pods.create(&PostParams::default(), &pod("stubborn", "busybox", &vars, 1)).await.unwrap();
    eventually("running", || async { (phase(&pods.get("stubborn").await.unwrap()) == "Running").then_some(()) }).await;
    pods.delete("stubborn", &DeleteParams::default().grace_period(600)).await.unwrap();
    pods.delete("stubborn", &DeleteParams::default().grace_period(900)).await.unwrap();
    let terminating = pods.get("stubborn").await.unwrap();
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(600), "a longer grace changes nothing");
    let asked = std::time::Instant::now();
    pods.delete("stubborn", &DeleteParams::default().grace_period(1)).await.unwrap();
    let shortened = pods.get("stubborn").await.unwrap();
    assert_eq!(shortened.metadata.deletion_grace_period_seconds, Some(1));
    assert!(shortened.metadata.deletion_timestamp < terminating.metadata.deletion_timestamp);
    eventually("the pod to go", || async { server.objects("pods").is_empty().then_some(()) }).await;
    assert!(asked.elapsed() < std::time::Duration::from_secs(10), "{:?}", asked.elapsed());
}

#[tokio::test]
async fn background_and_orphan_deletes_treat_dependents_accordingly() {
    let (server, client) = start(gpu_cluster()).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    for name in ["bg", "orphan"] {
        jobs.create(&PostParams::default(), &indexed_job(name, 1, 0, &[("FAKE_RUN_SECONDS", "60")], json!({})))
            .await
            .unwrap();
    }
    eventually("two pods", || async { (server.objects("pods").len() == 2).then_some(()) }).await;
    jobs.delete("bg", &DeleteParams::background()).await.unwrap();
    assert!(jobs.get_opt("bg").await.unwrap().is_none());
    jobs.delete("orphan", &DeleteParams::orphan()).await.unwrap();
    eventually("the background job's pod to be collected", || async {
        (server.objects("pods").len() == 1).then_some(())
    })
    .await;
    let orphan = &server.objects("pods")[0];
    assert_eq!(orphan["metadata"]["labels"]["batch.kubernetes.io/job-name"], "orphan");
    assert!(orphan["metadata"]["ownerReferences"].is_null());
}

#[tokio::test]
async fn deployment_scales_up_and_down() {
    let (_server, client) = start(gpu_cluster()).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "nginx", "env": [{"name": "FAKE_RUN_SECONDS", "value": "0"}]}]}}
        }
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &deployment).await.unwrap();
    for replicas in [2, 3, 1] {
        deployments
            .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}})))
            .await
            .unwrap();
        let ready = eventually(&format!("{replicas} ready replicas"), || async {
            let d = deployments.get("web").await.unwrap();
            let status = d.status.clone().unwrap_or_default();
            let running: Vec<Pod> =
                pods.list(&ListParams::default().labels("app=web")).await.unwrap().items.into_iter().collect();
            let settled = running.len() == usize::try_from(replicas).unwrap()
                && running.iter().all(|p| phase(p) == "Running" && p.metadata.deletion_timestamp.is_none())
                && status.ready_replicas == Some(replicas)
                && status.replicas == Some(replicas)
                && status.observed_generation == d.metadata.generation;
            settled.then_some(running)
        })
        .await;
        for p in &ready {
            let name = p.name_any();
            let hash = &p.labels()["pod-template-hash"];
            assert_eq!(hash.len(), 10);
            assert!(name.starts_with(&format!("web-{hash}-")) && name.len() == "web-".len() + 10 + 6, "{name}");
        }
    }
    let d = deployments.get("web").await.unwrap();
    let available = d.status.unwrap().conditions.unwrap();
    assert!(available.iter().any(|c| c.type_ == "Available" && c.status == "True"));
}

#[tokio::test]
async fn evictions_and_lost_nodes_fail_pods_with_disruption_conditions() {
    let (server, client) = start(gpu_cluster()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["victim", "bystander"] {
        pods.create(&PostParams::default(), &pod(name, "busybox", &[("FAKE_RUN_SECONDS", "60")], 1)).await.unwrap();
    }
    eventually("both running", || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        list.iter().all(|p| phase(p) == "Running").then_some(())
    })
    .await;
    server.evict("default", "victim");
    let victim = pods.get("victim").await.unwrap();
    let status = victim.status.clone().unwrap();
    assert_eq!((status.phase.as_deref(), status.reason.as_deref()), (Some("Failed"), Some("Evicted")));
    let disruption = pod_condition(&victim, "DisruptionTarget").unwrap();
    assert_eq!((disruption.0.as_str(), disruption.1.as_str()), ("True", "EvictionByEvictionAPI"));

    server.lose_node("gpu-1");
    let bystander = pods.get("bystander").await.unwrap();
    assert_eq!(bystander.status.as_ref().unwrap().reason.as_deref(), Some("NodeLost"));
    assert_eq!(pod_condition(&bystander, "DisruptionTarget").unwrap().0, "True");
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("gpu-1").await.unwrap();
    let ready = node.status.unwrap().conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("NodeStatusUnknown")));

    // A lost node takes no new pods; a removed node's pods are failed and deleted.
    pods.create(&PostParams::default(), &pod("next", "busybox", &[], 1)).await.unwrap();
    let (_, _, message) = eventually("no ready GPU node", || async {
        pod_condition(&pods.get("next").await.unwrap(), "PodScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert!(message.contains("node(s) were not ready"), "{message}");
    server.add_node(FakeNode::gpu("gpu-2", 1, "H100"));
    eventually("the new node to run the pod", || async {
        let p = pods.get("next").await.unwrap();
        (phase(&p) == "Running").then_some(())
    })
    .await;
    server.remove_node("gpu-2");
    eventually("the removed node's pod to be deleted", || async {
        pods.get_opt("next").await.unwrap().is_none().then_some(())
    })
    .await;
}

/// A pod's log as a kubelet serves it: what the fake container printed so far, its last
/// lines, the stream of a followed log ending with the container, and the real errors.
#[tokio::test]
async fn a_pod_log_grows_as_the_container_prints_and_follows_to_its_end() {
    use futures_util::{AsyncBufReadExt, TryStreamExt};
    use kube::api::LogParams;

    let (_server, client) = start(gpu_cluster()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.logs("nothing", &LogParams::default()).await.map(|_| ()).expect_err("no such pod");
    // Six lines over 1.2 s: one at the start, then one every 0.2 s.
    let lines = "one\ntwo\nthree\nfour\nfive\nsix";
    let vars = [("FAKE_RUN_SECONDS", "1.2"), ("FAKE_LOG", lines)];
    pods.create(&PostParams::default(), &pod("printer", "busybox", &vars, 0)).await.unwrap();
    eventually("the pod runs", || async { (phase(&pods.get("printer").await.ok()?) == "Running").then_some(()) }).await;
    let early = pods.logs("printer", &LogParams::default()).await.unwrap();
    assert!(early.starts_with("one\n") && early.lines().count() < 6, "{early:?}");

    let follow = LogParams { follow: true, ..LogParams::default() };
    let started = std::time::Instant::now();
    let mut stream = pods.log_stream("printer", &follow).await.unwrap().lines();
    let mut seen = Vec::new();
    while let Some(line) = stream.try_next().await.unwrap() {
        seen.push((line, started.elapsed()));
    }
    let text: Vec<&str> = seen.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(text, lines.lines().collect::<Vec<_>>());
    assert!(seen[5].1 - seen[0].1 >= std::time::Duration::from_millis(300), "lines came as printed: {seen:?}");
    assert_eq!(phase(&pods.get("printer").await.unwrap()), "Succeeded", "the stream ended with the container");

    let tail = LogParams { tail_lines: Some(2), ..LogParams::default() };
    assert_eq!(pods.logs("printer", &tail).await.unwrap(), "five\nsix\n");
    let wrong = LogParams { container: Some("sidecar".into()), ..LogParams::default() };
    let e = pods.logs("printer", &wrong).await.expect_err("no such container");
    assert!(e.to_string().contains("container sidecar is not valid for pod printer"), "{e}");
}
