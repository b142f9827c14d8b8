use serde_json::json;

use crate::common::{Server, check_declarative_contract, collect_pages, sim_cluster};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn cluster_keeps_the_declarative_contract(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let v1 = sim_cluster("h100");
    let mut v2 = sim_cluster("h100");
    v2["spec"]["cordoned"] = json!(true);
    check_declarative_contract(&s, "/api/v1/clusters/sim-a", &v1, &v2, 200).await;
}

/// A Kubernetes cluster with one flavor entry and `more` Kubernetes settings.
fn kubernetes(flavor: serde_json::Value, more: serde_json::Value) -> serde_json::Value {
    let mut settings = json!({"flavors": [flavor]});
    settings.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
    json!({"spec": {"kind": "kubernetes", "endpoint": "https://k8s.internal:6443", "credentials_ref": "BERTH_CREDENTIAL_K8S",
                    "kubernetes": settings}})
}

fn slurm(endpoint: &str) -> serde_json::Value {
    json!({"metadata": {"labels": {"tier": "reservation"}},
           "spec": {"kind": "slurm", "endpoint": endpoint, "credentials_ref": "BERTH_CREDENTIAL_SLURM_A",
                    "slurm": {"user": "berth", "partitions": [{"name": "gpu", "flavor": "h100"}]}}})
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn cluster_list_pages_and_filters_by_kind(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    for name in ["sim-b", "sim-a"] {
        s.put_ok(&format!("/api/v1/clusters/{name}"), &sim_cluster("h100"), 201).await;
    }
    s.put_ok("/api/v1/clusters/slurm-a", &slurm("http://127.0.0.1:6820"), 201).await;
    assert_eq!(collect_pages(&s, "/api/v1/clusters", 2).await, ["sim-a", "sim-b", "slurm-a"]);
    assert_eq!(collect_pages(&s, "/api/v1/clusters?kind=sim", 1).await, ["sim-a", "sim-b"]);
    assert_eq!(collect_pages(&s, "/api/v1/clusters?kind=slurm", 5).await, ["slurm-a"]);
    s.get("/api/v1/clusters?kind=mainframe").await.assert_problem(400, Some("kind"));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn cluster_rules_are_enforced_naming_the_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let mut unknown_flavor = sim_cluster("tpu");
    unknown_flavor["spec"]["sim"]["node_groups"][0]["flavor"] = json!("tpu");
    let mut bad_tier = sim_cluster("h100");
    bad_tier["metadata"]["labels"]["tier"] = json!("gold");
    let mut zero_nodes = sim_cluster("h100");
    zero_nodes["spec"]["sim"]["node_groups"][0]["count"] = json!(0);
    let cases = [
        (unknown_flavor, "/spec/sim/node_groups/0/flavor"),
        (bad_tier, "/metadata/labels/tier"),
        (zero_nodes, "/spec/sim/node_groups/0/count"),
        (json!({"spec": {"kind": "sim"}}), "/spec/sim"),
        (json!({"spec": {"kind": "slurm"}}), "/spec/endpoint"),
        (json!({"spec": {"kind": "kubernetes", "endpoint": "ftp://x"}}), "/spec/endpoint"),
        (
            json!({"spec": {"kind": "slurm", "endpoint": "http://x", "credentials_ref": "secret value"}}),
            "/spec/credentials_ref",
        ),
        (json!({"spec": {"kind": "nomad"}}), "/spec/kind"),
        (json!({"spec": {"kind": "kubernetes", "endpoint": "http://x"}}), "/spec/kubernetes"),
        (kubernetes(json!({"flavor": "tpu", "product": "TPU"}), json!({})), "/spec/kubernetes/flavors/0/flavor"),
        (
            kubernetes(json!({"flavor": "h100", "product": "not a label!"}), json!({})),
            "/spec/kubernetes/flavors/0/product",
        ),
        (
            kubernetes(json!({"flavor": "h100", "product": "H100", "resource": "amd.com/gpu"}), json!({})),
            "/spec/kubernetes/flavors/0/resource",
        ),
        (
            kubernetes(json!({"flavor": "h100", "product": "H100"}), json!({"namespaces": {"nlp": "Not_A_Namespace"}})),
            "/spec/kubernetes/namespaces/nlp",
        ),
        (
            json!({"spec": {"kind": "sim", "sim": {"node_groups": []}, "kubernetes": {"flavors": []}}}),
            "/spec/kubernetes",
        ),
    ];
    for (body, field) in cases {
        s.put("/api/v1/clusters/c1", &body).await.assert_problem(422, Some(field));
    }
    let k8s = s
        .put_ok("/api/v1/clusters/k1", &kubernetes(json!({"flavor": "h100", "product": "H100"}), json!({})), 201)
        .await
        .body;
    assert_eq!(k8s["spec"]["kubernetes"]["namespace_prefix"], "berth-", "{k8s}");
    assert_eq!(k8s["spec"]["kubernetes"]["flavors"][0]["resource"], "nvidia.com/gpu", "{k8s}");
    // The kind of an existing cluster is immutable.
    s.put_ok("/api/v1/clusters/c1", &sim_cluster("h100"), 201).await;
    s.put("/api/v1/clusters/c1", &slurm("http://127.0.0.1:6820")).await.assert_problem(422, Some("/spec/kind"));
    // So are a simulated cluster's nodes (its jobs are placed on them); its faults are not.
    let mut grown = sim_cluster("h100");
    grown["spec"]["sim"]["node_groups"][0]["count"] = json!(4);
    s.put("/api/v1/clusters/c1", &grown).await.assert_problem(422, Some("/spec/sim/node_groups"));
    let mut failed = sim_cluster("h100");
    failed["spec"]["sim"]["failed_nodes"] = json!(["g1-0"]);
    assert_eq!(s.put_ok("/api/v1/clusters/c1", &failed, 200).await.body["metadata"]["generation"], 2);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn cluster_credentials_are_a_reference_never_a_secret(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let created = s.put_ok("/api/v1/clusters/slurm-a", &slurm("https://slurm.internal:6820"), 201).await;
    assert_eq!(created.body["spec"]["credentials_ref"], "BERTH_CREDENTIAL_SLURM_A");
    // There is no field that takes a secret, and the refusal does not echo it.
    let secret = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig";
    let mut with_secret = slurm("https://slurm.internal:6820");
    with_secret["spec"]["credentials"] = json!(secret);
    let refused = s.put("/api/v1/clusters/slurm-b", &with_secret).await;
    refused.assert_problem(422, Some("/spec/credentials"));
    assert!(!refused.body.to_string().contains(secret));
    let stored: Vec<String> = sqlx::query_scalar("SELECT spec::text FROM clusters").fetch_all(&s.db).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert!(!stored[0].contains(secret));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_clusters_nodes_show_the_gpus_berth_placed_on_them(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let ctx = crate::common::two_teams_on_one_cluster(&s, 8).await;
    let body = crate::common::WorkloadBody::new().gpus(4.0).count(3).json();
    s.put_ok("/api/v1/teams/a/workloads/three", &body, 201).await;
    assert_eq!(berth_controllers::scheduler::reconcile(&ctx).await.expect("cycle").admitted, 1);

    let nodes = s.get("/api/v1/clusters/c1/nodes").await;
    assert_eq!(nodes.status, 200, "{}", nodes.body);
    let items = nodes.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{}", nodes.body);
    for n in items {
        assert_eq!(
            (n["flavor"].as_str(), n["gpus"].as_u64(), n["block"].as_str()),
            (Some("h100"), Some(8), Some("nvl-a"))
        );
        assert_eq!(n["schedulable"], true);
    }
    // Three 4-GPU tasks on two 8-GPU nodes: 8 on one, 4 on the other.
    let mut allocated: Vec<f64> = items.iter().map(|n| n["allocated_gpus"].as_f64().unwrap()).collect();
    allocated.sort_by(f64::total_cmp);
    assert_eq!(allocated, [4.0, 8.0]);
    s.get("/api/v1/clusters/nope/nodes").await.assert_problem(404, None);
}
