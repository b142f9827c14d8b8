//! Helpers shared by the integration tests: a server plus a kube client, bounded polling and
//! object builders.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::time::{Duration, Instant};

use berth_k8s_test_server::{Config, FakeNode, TestApiServer};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use serde_json::{Value, json};

/// How long any polled condition may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Starts a server and a kube client talking to it over plain HTTP.
pub async fn start(config: Config) -> (TestApiServer, Client) {
    let server = TestApiServer::start(config).await.expect("server starts");
    let config = kube::Config::new(server.url().parse().expect("url parses"));
    let client = Client::try_from(config).expect("client builds");
    (server, client)
}

/// A cluster with a CPU-only node (first in name order) and a 2-GPU node.
pub fn gpu_cluster() -> Config {
    Config {
        nodes: vec![FakeNode::gpu("a-cpu", 0, "none"), FakeNode::gpu("gpu-1", 2, "NVIDIA-H100-80GB-HBM3")],
        ..Config::default()
    }
}

/// Polls `check` until it yields a value, failing the test after a bounded deadline.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `env` list of a container from `(name, value)` pairs.
pub fn env(vars: &[(&str, &str)]) -> Value {
    Value::Array(vars.iter().map(|(k, v)| json!({"name": k, "value": v})).collect())
}

/// A bare pod with one container `main`.
pub fn pod(name: &str, image: &str, vars: &[(&str, &str)], gpus: u32) -> Pod {
    let mut container = json!({"name": "main", "image": image, "env": env(vars)});
    if gpus > 0 {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": gpus.to_string()}});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "test"}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }))
    .expect("valid pod")
}

/// An Indexed job of `n` pods with `gpus` GPUs each, and extra job spec fields.
pub fn indexed_job(name: &str, n: i32, gpus: u32, vars: &[(&str, &str)], extra: Value) -> Job {
    let mut container = json!({"name": "main", "image": "busybox", "env": env(vars)});
    if gpus > 0 {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": gpus.to_string()}});
    }
    let mut spec = json!({
        "completionMode": "Indexed",
        "completions": n,
        "parallelism": n,
        "backoffLimit": 0,
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    });
    merge_into(&mut spec, extra);
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("valid job")
}

fn merge_into(target: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(extra)) = (target.as_object_mut(), extra) {
        target.extend(extra);
    }
}

/// Whether a job has condition `type_` = True, and its reason.
pub fn job_condition(job: &Job, type_: &str) -> Option<(String, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| (c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}
