//! The Kubernetes adapter against the test API server, over real HTTP: kube-rs talks to it
//! exactly as it would to a cluster's API server.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use berth_adapters::kubernetes::KubernetesCluster;
use berth_adapters::{BackendError, ClusterBackend, Inventory, JobKey, JobRequest, JobState, JobStatus};
use berth_core::cluster::{ClusterKind, ClusterSpec};
use berth_core::workload::{Run, WorkloadKind};
use berth_k8s_test_server::{Config, FakeNode, TestApiServer};
use common::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

const TOKEN: &str = "s3cret-t0ken";

fn nodes() -> Vec<FakeNode> {
    vec![
        FakeNode::gpu("gpu-a", 8, "NVIDIA-H100-80GB-HBM3").label("berth.dev/topology-block", "nvl-a"),
        FakeNode::gpu("gpu-b", 8, "NVIDIA-H100-80GB-HBM3").label("berth.dev/topology-block", "nvl-a"),
        FakeNode::gpu("gpu-c", 4, "NVIDIA-A100-SXM4-80GB"),
        FakeNode::gpu("cpu-a", 0, "none"),
    ]
}

fn spec(endpoint: &str) -> ClusterSpec {
    serde_json::from_value(json!({
        "kind": "kubernetes",
        "endpoint": endpoint,
        "credentials_ref": "BERTH_CREDENTIAL_K8S",
        "kubernetes": {
            "flavors": [
                {"flavor": "h100", "product": "NVIDIA-H100-80GB-HBM3"},
                {"flavor": "a100", "product": "NVIDIA-A100-SXM4-80GB"},
            ],
            "gang_timeout_seconds": 2,
        },
    }))
    .unwrap()
}

struct Fixture {
    server: TestApiServer,
    k8s: KubernetesCluster,
}

async fn fixture() -> Fixture {
    fixture_with(Config::default()).await
}

async fn fixture_with(config: Config) -> Fixture {
    let server = TestApiServer::start(Config { nodes: nodes(), token: Some(TOKEN.into()), ..config })
        .await
        .expect("the test API server starts");
    let k8s = KubernetesCluster::new(&spec(&server.url()), Some(server.kubeconfig())).unwrap();
    assert_eq!(k8s.kind(), ClusterKind::Kubernetes);
    Fixture { server, k8s }
}

fn job(kind: WorkloadKind, tasks: u32, gpus: u32, nodes: &[&str], env: &[(&str, &str)]) -> JobRequest {
    JobRequest {
        key: JobKey { workload: Uuid::now_v7(), attempt: 0 },
        team: "vision".into(),
        workload: "resnet".into(),
        kind,
        flavor: "h100".into(),
        tasks,
        gpus_per_task: gpus * 100,
        cpus_per_task: Some(2.0),
        memory_mib_per_task: Some(4096),
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        run: Run {
            command: vec!["python".into(), "train.py".into()],
            script: None,
            image: Some("ghcr.io/acme/train:1".into()),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
        },
        max_runtime_seconds: None,
        sim_duration_seconds: None,
        resume: false,
        grace_seconds: 30,
        api: None,
        notebook_token: None,
        service: None,
        sim_load: Vec::new(),
    }
}

/// How long the test API server gets to reach a state.
const WAIT: Duration = Duration::from_secs(30);

async fn state_of(k8s: &KubernetesCluster, key: JobKey, want: JobState) -> JobStatus {
    eventually(&format!("{key} {want:?}"), WAIT, || async {
        k8s.jobs().await.unwrap().into_iter().find(|j| j.key == key && j.state == want)
    })
    .await
}

fn pods_of(server: &TestApiServer, key: JobKey) -> Vec<Value> {
    server.objects("pods").into_iter().filter(|p| p["metadata"]["labels"]["berth.dev/job-key"] == key.name()).collect()
}

fn node<'a>(inventory: &'a Inventory, name: &str) -> &'a berth_adapters::InventoryNode {
    inventory.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node {name} in {inventory:?}"))
}

/// A pod Berth did not make, holding `gpus` GPUs on `node`.
async fn outside_pod(server: &TestApiServer, node: &str, gpus: u32) {
    let client = kube::Client::try_from({
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap()
    })
    .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("notebook-{node}"), "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "lab", "image": "jupyter/base", "env": [{"name": "FAKE_RUN_SECONDS", "value": "3600"}],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
        },
    }))
    .unwrap();
    kube::Api::namespaced(client, "default").create(&kube::api::PostParams::default(), &pod).await.unwrap();
}

#[tokio::test]
async fn inventory_comes_from_nodes_and_pods_and_is_kept_by_watches() {
    let Fixture { server, k8s } = fixture().await;
    k8s.health().await.unwrap();
    outside_pod(&server, "gpu-b", 3).await;
    let inv = eventually("the outside pod in the inventory", WAIT, || async {
        let inv = k8s.inventory().await.unwrap();
        (node(&inv, "gpu-b").gpus_used > 0).then_some(inv)
    })
    .await;
    assert_eq!(inv.nodes.len(), 4);
    let a = node(&inv, "gpu-a");
    assert_eq!(
        (a.flavor.as_deref(), a.gpus, a.gpus_used, a.block.as_deref(), a.schedulable),
        (Some("h100"), 8, 0, Some("nvl-a"), true)
    );
    let b = node(&inv, "gpu-b");
    assert_eq!((b.gpus_used, b.gpus_used_outside_berth), (300, 300));
    assert_eq!((node(&inv, "gpu-c").flavor.as_deref(), node(&inv, "gpu-c").gpus), (Some("a100"), 4));
    assert_eq!(node(&inv, "cpu-a").flavor, None);
    assert!(a.cpus > 0 && a.memory_mib > 0, "{a:?}");

    // Later reads come from the watches: no further listing of nodes or pods.
    let lists = (server.requests("GET", "nodes", false), server.requests("GET", "pods", false));
    for _ in 0..5 {
        k8s.inventory().await.unwrap();
    }
    assert_eq!((server.requests("GET", "nodes", false), server.requests("GET", "pods", false)), lists);
    assert!(server.requests("GET", "pods", true) >= 1, "pods are watched");

    // A node cordoned through the API shows as unschedulable.
    server.add_node(FakeNode { unschedulable: true, ..FakeNode::gpu("gpu-d", 8, "NVIDIA-H100-80GB-HBM3") });
    eventually("the cordoned node", WAIT, || async {
        let inv = k8s.inventory().await.unwrap();
        inv.nodes.iter().find(|n| n.name == "gpu-d").map(|d| assert!(!d.schedulable))
    })
    .await;
}

#[tokio::test]
async fn a_training_job_runs_its_gang_on_the_placed_nodes_and_succeeds() {
    let Fixture { server, k8s } = fixture().await;
    let request = job(WorkloadKind::Training, 2, 4, &["gpu-a", "gpu-b"], &[("FAKE_RUN_SECONDS", "1")]);
    let submitted = k8s.submit(&request).await.unwrap();
    assert_eq!(submitted.state, JobState::Queued);
    // Listed at once, even if the watch has not shown it yet: it never looks vanished.
    assert!(k8s.jobs().await.unwrap().iter().any(|j| j.key == request.key));
    assert_eq!(submitted.job_id, format!("berth-vision/{}", request.key.name()));
    // Submitting the same key again (a retry, a restarted berthd) finds the same Job.
    let again = k8s.submit(&request).await.unwrap();
    assert_eq!(again.job_id, submitted.job_id);
    assert_eq!(server.objects("jobs").len(), 1);

    let running = state_of(&k8s, request.key, JobState::Running).await;
    assert!(running.started_at.is_some());
    let mut placed: Vec<String> =
        pods_of(&server, request.key).iter().map(|p| p["spec"]["nodeName"].as_str().unwrap().to_owned()).collect();
    placed.sort();
    assert_eq!(placed, ["gpu-a", "gpu-b"], "one pod per placed node");
    let inv = k8s.inventory().await.unwrap();
    assert_eq!((node(&inv, "gpu-a").gpus_used, node(&inv, "gpu-a").gpus_used_outside_berth), (400, 0));

    let done = state_of(&k8s, request.key, JobState::Succeeded).await;
    assert_eq!(done.exit_code, Some(0));
    assert!(done.finished_at.is_some());
    assert_eq!(k8s.job(request.key).await.unwrap().map(|j| j.state), Some(JobState::Succeeded));
    let env = &pods_of(&server, request.key)[0]["spec"]["containers"][0]["env"];
    assert!(env.as_array().unwrap().iter().any(|e| e["name"] == "BERTH_WORKLOAD_UID"), "{env}");
}

#[tokio::test]
async fn each_failure_reason_reaches_berth_in_words() {
    let Fixture { server, k8s } = fixture().await;
    let exit3 = job(WorkloadKind::Batch, 1, 1, &["gpu-a"], &[("FAKE_RUN_SECONDS", "0.2"), ("FAKE_EXIT_CODE", "3")]);
    let oom = job(
        WorkloadKind::Batch,
        1,
        1,
        &["gpu-a"],
        &[("FAKE_RUN_SECONDS", "0.2"), ("FAKE_TERMINATION_REASON", "OOMKilled")],
    );
    let mut no_image = job(WorkloadKind::Batch, 1, 1, &["gpu-a"], &[]);
    no_image.run.image = Some("missing.invalid/acme/train:1".into());
    let evicted = job(WorkloadKind::Batch, 1, 1, &["gpu-a"], &[("FAKE_RUN_SECONDS", "3600")]);
    let node_lost = job(WorkloadKind::Batch, 1, 1, &["gpu-c"], &[("FAKE_RUN_SECONDS", "3600")]);
    let node_lost = JobRequest { flavor: "a100".into(), ..node_lost };
    for r in [&exit3, &oom, &no_image, &evicted, &node_lost] {
        k8s.submit(r).await.unwrap();
    }

    let failed = state_of(&k8s, exit3.key, JobState::Failed).await;
    assert_eq!(failed.exit_code, Some(3));
    assert!(failed.reason.as_deref().unwrap().contains("exited with code 3"), "{failed:?}");
    let failed = state_of(&k8s, oom.key, JobState::Failed).await;
    assert_eq!(failed.exit_code, Some(137));
    assert!(failed.reason.as_deref().unwrap().starts_with("OOMKilled"), "{failed:?}");
    let failed = state_of(&k8s, no_image.key, JobState::Failed).await;
    assert!(failed.reason.as_deref().unwrap().contains("ImagePull"), "{failed:?}");

    state_of(&k8s, evicted.key, JobState::Running).await;
    let pod = pods_of(&server, evicted.key)[0]["metadata"]["name"].as_str().unwrap().to_owned();
    server.evict("berth-vision", &pod);
    let failed = state_of(&k8s, evicted.key, JobState::Failed).await;
    assert!(failed.reason.as_deref().unwrap().starts_with("Evicted"), "{failed:?}");

    state_of(&k8s, node_lost.key, JobState::Running).await;
    server.lose_node("gpu-c");
    let failed = state_of(&k8s, node_lost.key, JobState::Failed).await;
    assert!(failed.reason.as_deref().unwrap().starts_with("NodeLost"), "{failed:?}");
    let inv = k8s.inventory().await.unwrap();
    assert!(!node(&inv, "gpu-c").schedulable, "a lost node takes no work");

    // What the cluster cannot run is refused before anything is made.
    let err = k8s.submit(&JobRequest { gpus_per_task: 50, ..job(WorkloadKind::Batch, 1, 1, &[], &[]) }).await;
    assert!(matches!(err, Err(BackendError::Rejected(ref m)) if m.contains("fraction")), "{err:?}");
}

#[tokio::test]
async fn cancel_gives_the_grace_period_and_removes_the_job() {
    let Fixture { server, k8s } = fixture().await;
    let r = job(
        WorkloadKind::Training,
        2,
        1,
        &["gpu-a", "gpu-b"],
        &[("FAKE_RUN_SECONDS", "3600"), ("FAKE_SIGTERM_SECONDS", "1")],
    );
    k8s.submit(&r).await.unwrap();
    state_of(&k8s, r.key, JobState::Running).await;
    k8s.cancel(r.key, Duration::from_secs(30)).await.unwrap();
    let cancelling = k8s.job(r.key).await.unwrap().expect("the job is there while its pods stop");
    assert!(cancelling.cancelling, "{cancelling:?}");
    let pods = pods_of(&server, r.key);
    assert!(pods.iter().all(|p| p["metadata"]["deletionGracePeriodSeconds"] == 30), "{pods:?}");
    // Each pod was told, before its SIGTERM, when it is stopped for good.
    for p in &pods {
        let stop_by = p["metadata"]["annotations"]["berth.dev/stop-by"].as_str().expect("the notice");
        let left = chrono::DateTime::parse_from_rfc3339(stop_by).unwrap().timestamp() - chrono::Utc::now().timestamp();
        assert!((28..=30).contains(&left), "{stop_by}: {left} s left");
    }
    // A second cancel changes nothing.
    k8s.cancel(r.key, Duration::from_secs(1)).await.unwrap();
    assert!(pods_of(&server, r.key).iter().all(|p| p["metadata"]["deletionGracePeriodSeconds"] == 30));
    // The pods take 1 s to stop after SIGTERM; then the Job is gone.
    eventually("the job gone", WAIT, || async { k8s.job(r.key).await.unwrap().is_none().then_some(()) }).await;
    assert!(pods_of(&server, r.key).is_empty());
    // Cancels of unknown keys are no-ops.
    k8s.cancel(JobKey { workload: Uuid::now_v7(), attempt: 0 }, Duration::from_secs(1)).await.unwrap();
}

/// A team's namespace deleted after Berth made it (by hand, or the cluster rebuilt) is made
/// again by the next submission: remembered as made, every later job of the team was
/// refused with `namespaces "berth-vision" not found` until berthd restarted.
#[tokio::test]
async fn a_namespace_deleted_since_berth_made_it_is_made_again() {
    let Fixture { server, k8s } = fixture().await;
    let first = job(WorkloadKind::Training, 1, 1, &["gpu-a"], &[("FAKE_RUN_SECONDS", "3600")]);
    k8s.submit(&first).await.unwrap();
    let namespaces =
        || server.objects("namespaces").into_iter().filter(|n| n["metadata"]["name"] == "berth-vision").count();
    assert_eq!(namespaces(), 1);
    let client = kube::Client::try_from({
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap()
    })
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .delete("berth-vision", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(namespaces(), 0);
    let second = job(WorkloadKind::Training, 1, 1, &["gpu-b"], &[("FAKE_RUN_SECONDS", "3600")]);
    k8s.submit(&second).await.unwrap();
    assert_eq!(namespaces(), 1);
    state_of(&k8s, second.key, JobState::Running).await;
}

/// An API server that stops answering (its connections open, nothing said) makes the
/// inventory fail, though the watches still hold what they last saw; once it answers again,
/// so does the inventory.
#[tokio::test]
async fn an_api_server_that_hangs_fails_the_inventory() {
    let Fixture { server, k8s } = fixture().await;
    assert_eq!(k8s.inventory().await.unwrap().nodes.len(), 4);
    server.hang(true);
    match k8s.inventory().await {
        Err(BackendError::Unreachable(why)) => assert!(why.contains("did not answer within 5s"), "{why}"),
        other => panic!("the inventory of a hung server: {other:?}"),
    }
    server.hang(false);
    assert_eq!(k8s.inventory().await.unwrap().nodes.len(), 4);
}

#[tokio::test]
async fn watches_resume_after_a_dropped_connection_and_relist_after_410_gone() {
    // No bookmarks: they would move the watches' resourceVersions along.
    let Fixture { server, k8s } =
        fixture_with(Config { bookmark_interval: Duration::from_secs(3600), ..Config::default() }).await;
    let has = |name: &'static str, want: bool| {
        let k8s = &k8s;
        async move { (k8s.inventory().await.unwrap().nodes.iter().any(|n| n.name == name) == want).then_some(()) }
    };
    assert_eq!(k8s.inventory().await.unwrap().nodes.len(), 4);
    let lists = server.requests("GET", "nodes", false);

    server.drop_watches();
    server.add_node(FakeNode::gpu("gpu-e", 8, "NVIDIA-H100-80GB-HBM3"));
    eventually("gpu-e after the watch resumed", WAIT, || has("gpu-e", true)).await;
    assert_eq!(server.requests("GET", "nodes", false), lists, "a dropped watch resumes without listing again");

    // The node watch's last resourceVersion falls behind (a change it does not see), the
    // server forgets its history, and the connection drops: resuming gets 410 Gone.
    outside_pod(&server, "gpu-a", 1).await;
    server.compact();
    server.drop_watches();
    eventually("a new listing of nodes", WAIT, || async {
        (server.requests("GET", "nodes", false) > lists).then_some(())
    })
    .await;
    server.remove_node("gpu-e");
    eventually("gpu-e gone after the relist", WAIT, || has("gpu-e", false)).await;
    k8s.health().await.unwrap();
}

#[tokio::test]
async fn berth_scales_an_inference_deployment_up_and_down() {
    let Fixture { server, k8s } = fixture().await;
    let r = job(WorkloadKind::Inference, 2, 1, &["gpu-a", "gpu-b"], &[]);
    k8s.submit(&r).await.unwrap();
    let running = state_of(&k8s, r.key, JobState::Running).await;
    assert_eq!(running.job_id, format!("berth-vision/{}", r.key.name()));
    assert_eq!(server.objects("services").iter().filter(|s| s["metadata"]["name"] == r.key.name()).count(), 1);
    let live = |n: usize| {
        let server = &server;
        async move {
            let pods = pods_of(server, r.key);
            let running = pods
                .iter()
                .filter(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null());
            (running.count() == n && pods.len() == n).then_some(())
        }
    };
    eventually("2 replicas", WAIT, || live(2)).await;
    k8s.scale(r.key, 3).await.unwrap();
    eventually("3 replicas", WAIT, || live(3)).await;
    k8s.scale(r.key, 1).await.unwrap();
    eventually("1 replica", WAIT, || live(1)).await;
    assert_eq!(state_of(&k8s, r.key, JobState::Running).await.state, JobState::Running);
    // Cancelling removes the Deployment and its Service.
    k8s.cancel(r.key, Duration::from_secs(0)).await.unwrap();
    eventually("the deployment gone", WAIT, || async { k8s.job(r.key).await.unwrap().is_none().then_some(()) }).await;
    assert!(server.objects("services").iter().all(|s| s["metadata"]["name"] != r.key.name()));
    // A training job cannot be scaled.
    let t = job(WorkloadKind::Training, 1, 1, &["gpu-a"], &[]);
    k8s.submit(&t).await.unwrap();
    assert!(matches!(k8s.scale(t.key, 2).await, Err(BackendError::Rejected(_))));
}

#[tokio::test]
async fn pods_that_cannot_be_placed_as_berth_planned_make_the_job_unplaceable() {
    let Fixture { server, k8s } = fixture().await;
    // Someone else took half of gpu-a after Berth's scheduler placed an 8-GPU task there.
    outside_pod(&server, "gpu-a", 4).await;
    let r = job(WorkloadKind::Training, 1, 8, &["gpu-a"], &[]);
    k8s.submit(&r).await.unwrap();
    assert_eq!(k8s.job(r.key).await.unwrap().unwrap().state, JobState::Queued, "not before the gang timeout");
    let stuck = state_of(&k8s, r.key, JobState::Unplaceable).await;
    assert!(stuck.reason.as_deref().unwrap().contains("Insufficient nvidia.com/gpu"), "{stuck:?}");
}

#[tokio::test]
async fn a_wrong_token_or_no_server_is_unreachable_and_the_token_never_shows() {
    let Fixture { server, .. } = fixture().await;
    let forged = server.kubeconfig().replace(TOKEN, "forged-token");
    let k8s = KubernetesCluster::new(&spec(&server.url()), Some(forged)).unwrap();
    let err = k8s.health().await.unwrap_err();
    assert!(matches!(err, BackendError::Unreachable(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("credentials") && !text.contains("forged-token") && !text.contains(TOKEN), "{text}");

    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let k8s = KubernetesCluster::new(&spec(&format!("http://{nowhere}")), Some(server.kubeconfig())).unwrap();
    let err = k8s.inventory().await.unwrap_err();
    assert!(matches!(err, BackendError::Unreachable(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
}
