//! The Kubernetes objects Berth makes for a job request: training and batch work as an
//! Indexed `batch/v1` Job, inference and notebooks as a Deployment (inference also gets a
//! Service). Everything here is pure: a request in, typed `k8s-openapi` objects out.

use std::collections::BTreeMap;

use berth_core::cluster::{KubernetesFlavor, KubernetesSpec};
use berth_core::workload::WorkloadKind;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Service};
use serde_json::{Value, json};

use crate::backend::{BackendError, JobKey, JobRequest};

/// Label on everything Berth makes, so its watches see only its own objects.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "berth");
/// Label carrying the [`JobKey`] name on Berth's objects and their pods.
pub const KEY_LABEL: &str = "berth.dev/job-key";

/// The label on a serving job's pods naming the service (workload uid) they answer for.
pub const SERVICE_LABEL: &str = "berth.dev/service";
/// The notice on a stopping job's pods (before their SIGTERM): when they are stopped for
/// good (RFC 3339), which a container reads through the downward API.
pub const STOP_BY_ANNOTATION: &str = "berth.dev/stop-by";
/// The node label NVIDIA's GPU feature discovery puts on GPU nodes.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// The label every node carries with its own name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The container Berth runs in each pod.
pub const CONTAINER: &str = "main";
/// How long Kubernetes keeps a finished Job (and its pods' statuses) for Berth to read.
const FINISHED_JOB_TTL_SECONDS: u64 = 24 * 3600;
/// The port an inference server or a notebook (Jupyter: `--port 8080`) listens on; its
/// Service answers on port 80.
const SERVE_PORT: u16 = 8080;

/// What Berth creates for one request.
#[derive(Debug, Clone)]
pub enum Manifest {
    Job(Box<Job>),
    Deployment { deployment: Box<Deployment>, service: Option<Box<Service>> },
}

/// The namespace a team's work runs in.
pub fn namespace_of(spec: &KubernetesSpec, team: &str) -> String {
    spec.namespaces.get(team).cloned().unwrap_or_else(|| format!("{}{team}", spec.namespace_prefix))
}

pub fn namespace(name: &str) -> Namespace {
    typed(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
    }))
}

/// The objects for `job`, whose tasks the scheduler placed on nodes of topology block
/// `block` (when they share one).
///
/// # Errors
/// [`BackendError::Rejected`] for what this cluster cannot run: an unmapped flavor, a
/// fraction of a GPU, no container image.
pub fn manifest(spec: &KubernetesSpec, job: &JobRequest, block: Option<&str>) -> Result<Manifest, BackendError> {
    let flavor = spec.flavors.iter().find(|f| f.flavor == job.flavor).ok_or_else(|| {
        BackendError::Rejected(format!("flavor {} is not mapped to nodes on this cluster", job.flavor))
    })?;
    if !job.gpus_per_task.is_multiple_of(100) {
        return Err(BackendError::Rejected(format!(
            "a Kubernetes cluster gives whole devices of {}; {} GPU per task is a fraction (use a MIG flavor)",
            flavor.resource,
            f64::from(job.gpus_per_task) / 100.0
        )));
    }
    let image = job.run.image.as_deref().filter(|i| !i.is_empty()).ok_or_else(|| {
        BackendError::Rejected("a Kubernetes cluster runs containers: the workload must set spec.run.image".into())
    })?;
    let namespace = namespace_of(spec, &job.team);
    let name = job.key.name();
    let serves = matches!(job.kind, WorkloadKind::Inference | WorkloadKind::Notebook);
    // The service its pods answer for: its own, or the one it is a replica of.
    let service_uid = job.service.unwrap_or(job.key.workload).to_string();
    let mut labels = json!({MANAGED_BY.0: MANAGED_BY.1, KEY_LABEL: name});
    if serves {
        labels[SERVICE_LABEL] = json!(service_uid);
    }
    let metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {
            "berth.dev/team": job.team,
            "berth.dev/workload": job.workload,
            "berth.dev/workload-uid": job.key.workload.to_string(),
            "berth.dev/attempt": job.key.attempt.to_string(),
            "berth.dev/flavor": job.flavor,
            "berth.dev/nodes": job.nodes.join(","),
        },
    });
    let pod = pod_spec(spec, flavor, job, image, block, if serves { "Always" } else { "Never" });
    let template = json!({"metadata": {"labels": labels}, "spec": pod});
    if !serves {
        let mut job_spec = json!({
            "completionMode": "Indexed",
            "completions": job.tasks,
            "parallelism": job.tasks,
            // A gang fails as one: any container that exits non-zero, and any pod disrupted
            // (evicted, its node lost), fails the whole Job at once; Berth decides what next.
            "backoffLimit": 0,
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]}},
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_SECONDS,
            "template": template,
        });
        if let Some(limit) = job.max_runtime_seconds {
            job_spec["activeDeadlineSeconds"] = json!(limit);
        }
        return Ok(Manifest::Job(Box::new(typed(json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": metadata,
            "spec": job_spec,
        })))));
    }
    let deployment = Box::new(typed(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": job.tasks,
            "selector": {"matchLabels": {KEY_LABEL: name}},
            "template": template,
        },
    })));
    // Every service is reached through its Service (an inference endpoint, a notebook),
    // which selects the pods of all its replicas; a replica adds pods, not a Service.
    let own = job.service.is_none_or(|s| s == job.key.workload);
    let service = own.then(|| {
        Box::new(typed(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {
                "selector": {SERVICE_LABEL: service_uid},
                "ports": [{"name": "http", "port": 80, "targetPort": SERVE_PORT}],
            },
        })))
    });
    Ok(Manifest::Deployment { deployment, service })
}

/// One task's pod: pinned to the nodes Berth's scheduler chose (by hostname), on the
/// flavor's product, with the GPUs as a limit of the flavor's resource.
fn pod_spec(
    spec: &KubernetesSpec,
    flavor: &KubernetesFlavor,
    job: &JobRequest,
    image: &str,
    block: Option<&str>,
    restart: &str,
) -> Value {
    let mut env = job.environment();
    if job.gpus_per_task == 0 {
        // A container with no GPU limit gets no devices from the device plugin, but the
        // NVIDIA runtime's default (envvar) strategy still gives it those its image names:
        // the CUDA images name "all". "void" leaves it no GPU.
        env.insert("NVIDIA_VISIBLE_DEVICES".into(), "void".into());
    }
    let mut limits = serde_json::Map::new();
    let mut requests = serde_json::Map::new();
    if job.gpus_per_task > 0 {
        limits.insert(flavor.resource.clone(), json!((job.gpus_per_task / 100).to_string()));
    }
    if let Some(cpus) = job.cpus_per_task {
        requests.insert("cpu".into(), json!(format!("{}m", (cpus * 1000.0).ceil() as u64)));
    }
    if let Some(mib) = job.memory_mib_per_task {
        let memory = json!(format!("{mib}Mi"));
        requests.insert("memory".into(), memory.clone());
        limits.insert("memory".into(), memory);
    }
    let mut container = json!({
        "name": CONTAINER,
        "image": image,
        "env": env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
        "resources": {"limits": limits, "requests": requests},
    });
    if let Some(script) = &job.run.script {
        container["command"] = json!(["/bin/sh", "-c", script]);
    } else if !job.run.command.is_empty() {
        container["command"] = json!(job.run.command);
    }
    if restart == "Always" {
        container["ports"] = json!([{"name": "http", "containerPort": SERVE_PORT}]);
    }
    let mut node_selector = json!({PRODUCT_LABEL: flavor.product});
    if let Some(block) = block {
        node_selector[&spec.topology_label] = json!(block);
    }
    let mut pod = json!({
        "restartPolicy": restart,
        // The time to checkpoint Berth gives it when it stops the job.
        "terminationGracePeriodSeconds": job.grace_seconds,
        "nodeSelector": node_selector,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    });
    let mut nodes: Vec<&String> = job.nodes.iter().collect();
    nodes.sort();
    nodes.dedup();
    if !nodes.is_empty() {
        pod["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": nodes}]}],
        }}});
    }
    // Berth placed one task per node: the pods of the gang go to distinct nodes of that set,
    // not stacked on the first one with room. (Serving replicas may share nodes: Berth
    // scales them beyond the first placement.)
    if restart == "Never" && nodes.len() > 1 && nodes.len() == job.nodes.len() {
        pod["affinity"]["podAntiAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {KEY_LABEL: job.key.name()}},
            "topologyKey": HOSTNAME_LABEL,
        }]});
    }
    pod
}

/// The typed object for a manifest written here; the shapes above are fixed, so a failure
/// is a bug in this file.
fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("Berth's manifests match the Kubernetes types")
}

/// The key of one of Berth's objects or pods, from its labels.
pub fn key_of(labels: Option<&BTreeMap<String, String>>) -> Option<JobKey> {
    labels?.get(KEY_LABEL).and_then(|k| JobKey::parse(k))
}

#[cfg(test)]
mod tests {
    use berth_core::workload::Run;
    use uuid::Uuid;

    use super::*;

    fn spec() -> KubernetesSpec {
        serde_json::from_value(json!({
            "flavors": [{"flavor": "h100", "product": "NVIDIA-H100-80GB-HBM3"}],
            "namespaces": {"vision": "cv"},
        }))
        .unwrap()
    }

    fn request(kind: WorkloadKind) -> JobRequest {
        JobRequest {
            key: JobKey { workload: Uuid::nil(), attempt: 2 },
            team: "nlp".into(),
            workload: "train".into(),
            kind,
            flavor: "h100".into(),
            tasks: 2,
            gpus_per_task: 400,
            cpus_per_task: Some(1.5),
            memory_mib_per_task: Some(2048),
            nodes: vec!["n2".into(), "n1".into()],
            run: Run {
                command: vec!["python".into(), "train.py".into()],
                script: None,
                image: Some("ghcr.io/acme/train:1".into()),
                env: BTreeMap::from([("EPOCHS".into(), "3".into())]),
            },
            max_runtime_seconds: Some(3600),
            sim_duration_seconds: None,
            resume: false,
            grace_seconds: 30,
            api: None,
            notebook_token: None,
            service: None,
            sim_load: Vec::new(),
        }
    }

    #[test]
    fn training_is_an_indexed_job_pinned_to_its_nodes() {
        let Manifest::Job(job) = manifest(&spec(), &request(WorkloadKind::Training), Some("nvl-a")).unwrap() else {
            panic!("training makes a Job")
        };
        let v = serde_json::to_value(&job).unwrap();
        let name = "berth-00000000-0000-0000-0000-000000000000-2";
        assert_eq!(v["metadata"]["name"], name);
        assert_eq!(v["metadata"]["namespace"], "berth-nlp");
        assert_eq!(v["metadata"]["labels"][KEY_LABEL], name);
        assert_eq!(v["spec"]["completionMode"], "Indexed");
        assert_eq!((v["spec"]["completions"].clone(), v["spec"]["parallelism"].clone()), (json!(2), json!(2)));
        assert_eq!(v["spec"]["backoffLimit"], 0);
        assert_eq!(v["spec"]["activeDeadlineSeconds"], 3600);
        let pod = &v["spec"]["template"]["spec"];
        assert_eq!(v["spec"]["template"]["metadata"]["labels"][KEY_LABEL], name);
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["terminationGracePeriodSeconds"], 30);
        assert_eq!(
            pod["nodeSelector"],
            json!({PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", "berth.dev/topology-block": "nvl-a"})
        );
        let term =
            &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
        assert_eq!(
            term["matchExpressions"][0],
            json!({"key": HOSTNAME_LABEL, "operator": "In", "values": ["n1", "n2"]})
        );
        let apart = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(apart, &json!({"labelSelector": {"matchLabels": {KEY_LABEL: name}}, "topologyKey": HOSTNAME_LABEL}));
        let c = &pod["containers"][0];
        assert_eq!(c["resources"]["limits"], json!({"nvidia.com/gpu": "4", "memory": "2048Mi"}));
        assert_eq!(c["resources"]["requests"], json!({"cpu": "1500m", "memory": "2048Mi"}));
        assert_eq!(c["command"], json!(["python", "train.py"]));
        let env: Vec<&str> = c["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(env, ["BERTH_ATTEMPT", "BERTH_TEAM", "BERTH_WORKLOAD", "BERTH_WORKLOAD_UID", "EPOCHS"]);

        // A resumed attempt (attempt 2 of resumable work) is told so, with the one before.
        let resumed = JobRequest { resume: true, ..request(WorkloadKind::Training) };
        let Manifest::Job(job) = manifest(&spec(), &resumed, Some("nvl-a")).unwrap() else { panic!() };
        let v = serde_json::to_value(&job).unwrap();
        let env = &v["spec"]["template"]["spec"]["containers"][0]["env"];
        let value = |name: &str| env.as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
        assert_eq!((value("BERTH_RESUME"), value("BERTH_PREVIOUS_ATTEMPT")), (Some(json!("1")), Some(json!("1"))));
        assert_eq!(value("NVIDIA_VISIBLE_DEVICES"), None, "with GPUs, the device plugin names them");

        // A task given no GPU on a GPU node sees none, whatever its image names (the CUDA
        // images name "all", which the NVIDIA runtime would give it).
        let none = JobRequest { gpus_per_task: 0, ..request(WorkloadKind::Training) };
        let Manifest::Job(job) = manifest(&spec(), &none, Some("nvl-a")).unwrap() else { panic!() };
        let v = serde_json::to_value(&job).unwrap();
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["resources"]["limits"], json!({"memory": "2048Mi"}));
        let void = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES");
        assert_eq!(void.map(|e| e["value"].clone()), Some(json!("void")));
    }

    #[test]
    fn inference_is_a_deployment_with_a_service_in_the_mapped_namespace() {
        let mut r = request(WorkloadKind::Inference);
        r.team = "vision".into();
        let Manifest::Deployment { deployment, service } = manifest(&spec(), &r, None).unwrap() else {
            panic!("inference makes a Deployment")
        };
        let d = serde_json::to_value(&deployment).unwrap();
        assert_eq!(d["metadata"]["namespace"], "cv");
        assert_eq!(d["spec"]["replicas"], 2);
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert!(d["spec"]["template"]["spec"]["nodeSelector"].get("berth.dev/topology-block").is_none());
        let s = serde_json::to_value(service.expect("its own Service")).unwrap();
        let uid = r.key.workload.to_string();
        assert_eq!(s["spec"]["selector"][SERVICE_LABEL], uid.as_str());
        assert_eq!(d["spec"]["template"]["metadata"]["labels"][SERVICE_LABEL], uid.as_str());
        // A replica of another service: its pods answer for that one, and it has no Service.
        let parent = uuid::Uuid::now_v7();
        let replica = JobRequest { service: Some(parent), ..r };
        let Manifest::Deployment { deployment, service } = manifest(&spec(), &replica, None).unwrap() else {
            panic!("a replica makes a Deployment")
        };
        assert!(service.is_none());
        let d = serde_json::to_value(&deployment).unwrap();
        assert_eq!(d["spec"]["template"]["metadata"]["labels"][SERVICE_LABEL], parent.to_string());
    }

    #[test]
    fn what_the_cluster_cannot_run_is_rejected_with_the_reason() {
        let mut r = request(WorkloadKind::Batch);
        r.gpus_per_task = 50;
        let err = manifest(&spec(), &r, None).unwrap_err().to_string();
        assert!(err.contains("fraction"), "{err}");
        let mut r = request(WorkloadKind::Batch);
        r.flavor = "a100".into();
        assert!(manifest(&spec(), &r, None).unwrap_err().to_string().contains("flavor a100 is not mapped"));
        let mut r = request(WorkloadKind::Batch);
        r.run.image = None;
        assert!(manifest(&spec(), &r, None).unwrap_err().to_string().contains("spec.run.image"));
    }
}
