//! The demo world a fresh install starts with (`berthd serve --demo`): two simulated
//! clusters (and, when given an API server, a Kubernetes cluster), two flavors, a small
//! team tree with quotas, and a trickle of workloads, so a newcomer sees work flow at once.
//! Applying it again changes nothing.

use std::time::Duration;

use berth_core::Error;
use serde_json::{Value, json};

use crate::PgPool;
use crate::context::OpContext;

fn actor() -> OpContext {
    OpContext::system("berth-demo")
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Error> {
    serde_json::from_value(v).map_err(|e| Error::Internal(format!("demo object does not parse: {e}")))
}

/// The secret holding the demo Kubernetes cluster's kubeconfig.
pub const DEMO_KUBECONFIG: &str = "BERTH_CREDENTIAL_DEMO_KUBE";

/// The GPU products of the demo flavors' nodes (`nvidia.com/gpu.product`).
pub const DEMO_PRODUCTS: [(&str, &str); 2] =
    [("h100-80gb", "NVIDIA-H100-80GB-HBM3"), ("a100-80gb", "NVIDIA-A100-SXM4-80GB")];

/// Applies the demo flavors, clusters and teams; with `kubernetes`, also the Kubernetes
/// cluster `kube-demo` whose API server listens there.
///
/// # Errors
/// Whatever applying them reports.
pub async fn seed(db: &PgPool, kubernetes: Option<&str>) -> Result<(), Error> {
    let a = actor();
    // Prices per GPU-hour: on-demand capacity (sim-west) costs more than the reservation.
    let prices = [
        ("h100-80gb", json!({"per_gpu_hour": 2.5, "clusters": {"sim-west": 4.0}})),
        ("a100-80gb", json!({"per_gpu_hour": 1.5})),
    ];
    for (name, price) in prices {
        let body =
            parse(json!({"spec": {"description": format!("demo {name}"), "gpu_memory_gib": 80, "price": price}}))?;
        crate::flavor::flavor_apply(db, &a, name, &body, None).await?;
    }
    let clusters = [
        (
            "sim-east",
            "reservation",
            json!([
                {"name": "h100-a", "count": 4, "flavor": "h100-80gb", "gpus_per_node": 8, "topology_block": "nvl-a"},
                {"name": "h100-b", "count": 4, "flavor": "h100-80gb", "gpus_per_node": 8, "topology_block": "nvl-b"}
            ]),
        ),
        (
            "sim-west",
            "on-demand",
            json!([
                {"name": "a100", "count": 6, "flavor": "a100-80gb", "gpus_per_node": 8},
                {"name": "h100", "count": 2, "flavor": "h100-80gb", "gpus_per_node": 8}
            ]),
        ),
    ];
    for (name, tier, groups) in clusters {
        let body = parse(json!({
            "metadata": {"labels": {"tier": tier, "demo": "true"}},
            "spec": {"kind": "sim", "sim": {"node_groups": groups, "time_scale": 60, "seed": 1}}
        }))?;
        crate::cluster::cluster_apply(db, &a, name, &body, None).await?;
    }
    if let Some(endpoint) = kubernetes {
        let flavors: Vec<Value> = DEMO_PRODUCTS.iter().map(|(f, p)| json!({"flavor": f, "product": p})).collect();
        let body = parse(json!({
            "metadata": {"labels": {"tier": "on-demand", "demo": "true"}},
            "spec": {"kind": "kubernetes", "endpoint": endpoint, "credentials_ref": DEMO_KUBECONFIG,
                "kubernetes": {"flavors": flavors}}
        }))?;
        crate::cluster::cluster_apply(db, &a, "kube-demo", &body, None).await?;
    }
    let teams = [
        (
            "research",
            None,
            json!([{"flavor": "h100-80gb", "guaranteed": 40}, {"flavor": "a100-80gb", "guaranteed": 24}]),
        ),
        ("nlp", Some("research"), json!([{"flavor": "h100-80gb", "guaranteed": 24, "weight": 2}])),
        (
            "vision",
            Some("research"),
            json!([{"flavor": "h100-80gb", "guaranteed": 16}, {"flavor": "a100-80gb", "guaranteed": 24}]),
        ),
        ("platform", None, json!([{"flavor": "a100-80gb", "guaranteed": 16, "limit": 32}])),
    ];
    for (name, parent, quotas) in teams {
        let mut body = json!({"spec": {"parent": parent, "description": "demo team", "quotas": quotas}});
        if name == "platform" {
            body["spec"]["budgets"] =
                json!([{"flavor": "a100-80gb", "gpu_hours": 5000, "period": "month", "action": "warn"}]);
        }
        let body = parse(body)?;
        crate::team::team_apply(db, &a, name, &body, None).await?;
    }
    Ok(())
}

/// What a demo workload prints on the demo Kubernetes cluster, over its run.
const DEMO_LOG: &str = "loading the dataset\nepoch 1/5 loss=2.31\nepoch 2/5 loss=1.74\nepoch 3/5 loss=1.32\nepoch 4/5 loss=1.08\nepoch 5/5 loss=0.97\nsaved checkpoint step-5000";

/// Submits a demo workload every `every`, forever: varied teams, sizes, priorities and
/// durations (on the demo clusters' 60× clock, minutes of real time).
pub async fn trickle(db: PgPool, every: Duration) {
    const TEAMS: [(&str, &str); 3] = [("nlp", "h100-80gb"), ("vision", "a100-80gb"), ("platform", "a100-80gb")];
    let mut n: u64 = chrono::Utc::now().timestamp().unsigned_abs();
    loop {
        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let pick = |bits: u32, of: u64| (n >> bits) % of;
        let (team, flavor) = TEAMS[pick(10, 3) as usize];
        let gpus = [1, 2, 4, 8][pick(14, 4) as usize];
        let count = if gpus == 8 { 1 + pick(18, 2) } else { 1 };
        let duration = 600 + pick(34, 3000);
        let body = json!({"metadata": {"labels": {"demo": "true"}}, "spec": {
            "kind": if pick(22, 4) == 0 { "inference" } else { "training" },
            "priority": pick(26, 3) * 10,
            "resumable": pick(30, 2) == 0,
            "tasks": {"count": count, "resources": {"flavors": [flavor], "gpus": gpus}},
            "sim": {"duration_seconds": duration},
            // On the demo Kubernetes cluster the test API server's fake kubelet runs it
            // for the same time (the sim clusters run 60× faster than real time), printing
            // a line per epoch (its log: `berth logs -f`).
            "run": {"image": "registry.example/demo/train:1", "command": ["python", "train.py"],
                "env": {"FAKE_RUN_SECONDS": (duration / 60).to_string(), "FAKE_LOG": DEMO_LOG}},
        }});
        let name = format!("demo-{}", n % 1_000_000_000);
        match parse(body) {
            Ok(input) => {
                if let Err(e) = crate::workload::workload_apply(&db, &actor(), team, &name, &input, None).await {
                    tracing::warn!(error = %e, "demo workload not submitted");
                }
            }
            Err(e) => tracing::error!(error = %e, "demo workload does not parse"),
        }
        tokio::time::sleep(every).await;
    }
}
