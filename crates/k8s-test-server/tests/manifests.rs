//! The manifests Berth is deployed with (`deploy/kubernetes/`) against this server, which
//! types every object with the real k8s-openapi structs: each object of the base
//! kustomization is created in a fresh cluster and must come back with every field it was
//! sent (a misspelt or misplaced field is dropped by typing, and fails here, as the real
//! server's strict field validation refuses it); the example overlay may only name what
//! the base has.

mod common;

use std::path::{Path, PathBuf};

use berth_k8s_test_server::Config;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, GroupVersionKind, PostParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn kustomization(dir: &Path) -> Value {
    yaml_documents(&dir.join("kustomization.yaml")).remove(0)
}

/// Every leaf of `v` with its JSON pointer (an empty object or list is a leaf).
fn leaves(v: &Value, path: String, out: &mut Vec<(String, Value)>) {
    let key = |k: &str| k.replace('~', "~0").replace('/', "~1");
    match v {
        Value::Object(m) if !m.is_empty() => m.iter().for_each(|(k, v)| leaves(v, format!("{path}/{}", key(k)), out)),
        Value::Array(a) if !a.is_empty() => {
            a.iter().enumerate().for_each(|(i, v)| leaves(v, format!("{path}/{i}"), out))
        }
        _ => out.push((path, v.clone())),
    }
}

/// The base's objects, in the kustomization's order, with its namespace set.
fn base_objects() -> Vec<Value> {
    let base = deploy_dir().join("base");
    let k = kustomization(&base);
    let namespace = k["namespace"].as_str().expect("the base names its namespace");
    let mut objects = Vec::new();
    for file in k["resources"].as_array().expect("resources") {
        for mut obj in yaml_documents(&base.join(file.as_str().unwrap())) {
            if obj["metadata"]["namespace"].is_string() {
                assert_eq!(obj["metadata"]["namespace"], namespace, "{file}: the kustomization's namespace");
            }
            obj["metadata"]["namespace"] = json!(namespace);
            objects.push(obj);
        }
    }
    objects
}

#[tokio::test]
async fn every_manifest_is_accepted_whole_by_the_api_server() {
    let (_server, client) = common::start(Config::default()).await;
    let objects = base_objects();
    let namespace = objects[0]["metadata"]["namespace"].as_str().unwrap().to_owned();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap())
        .await
        .unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut kinds = Vec::new();
    for obj in objects {
        let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), obj["apiVersion"].as_str().unwrap().to_owned()),
        };
        let kind = obj["kind"].as_str().unwrap().to_owned();
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let (ar, caps) = discovery
            .resolve_gvk(&GroupVersionKind::gvk(&group, &version, &kind))
            .unwrap_or_else(|| panic!("{kind} is not served"));
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(client.clone(), &namespace, &ar),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let mut sent = obj.clone();
        if caps.scope == Scope::Cluster {
            sent["metadata"].as_object_mut().unwrap().remove("namespace");
        }
        let typed: DynamicObject = serde_json::from_value(sent.clone()).unwrap();
        let created = api
            .create(&PostParams::default(), &typed)
            .await
            .unwrap_or_else(|e| panic!("{kind} {name} was refused: {e}"));
        let stored = serde_json::to_value(&created).unwrap();
        let mut sent_leaves = Vec::new();
        leaves(&sent, String::new(), &mut sent_leaves);
        for (path, value) in sent_leaves {
            assert_eq!(
                stored.pointer(&path),
                Some(&value),
                "{kind} {name}: {path} was not kept as sent (unknown or misplaced?)"
            );
        }
        kinds.push(kind);
    }
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "the base has a {kind}");
    }
}

#[test]
fn the_deployment_runs_two_replicas_probed_as_a_site_needs() {
    let objects = base_objects();
    let of = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}")).clone();
    let deployment = of("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(
        container["resources"]["requests"]["cpu"].is_string()
            && container["resources"]["requests"]["memory"].is_string()
    );
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/scrape"], "true");
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    // Each replica names itself in the lease; the secrets come from the Secret.
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "BERTH_REPLICA_ID" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name")
    );
    let secret = of("Secret");
    assert_eq!(container["envFrom"][0]["secretRef"]["name"], secret["metadata"]["name"]);
    for key in ["DATABASE_URL", "BERTH_JWT_SECRET"] {
        assert!(secret["stringData"][key].is_string(), "the Secret holds {key}");
    }
    assert!(secret["stringData"].as_object().unwrap().keys().any(|k| k.starts_with("BERTH_CREDENTIAL_")));
    // The pods run as the account the RBAC binds, and the budget and Service select them.
    let account = of("ServiceAccount")["metadata"]["name"].clone();
    assert_eq!(pod["spec"]["serviceAccountName"], account);
    let binding = of("ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["name"], account);
    assert_eq!(binding["roleRef"]["name"], of("ClusterRole")["metadata"]["name"]);
    let labels = &pod["metadata"]["labels"];
    for selector in [&of("PodDisruptionBudget")["spec"]["selector"]["matchLabels"], &of("Service")["spec"]["selector"]]
    {
        for (k, v) in selector.as_object().unwrap() {
            assert_eq!(&labels[k], v, "{k} selects the pods");
        }
    }
    assert_eq!(of("Service")["spec"]["ports"][0]["targetPort"], container["ports"][0]["name"]);
}

#[test]
fn the_example_overlay_names_only_what_the_base_has() {
    let overlay = deploy_dir().join("overlays/example");
    let k = kustomization(&overlay);
    for r in k["resources"].as_array().unwrap() {
        assert!(overlay.join(r.as_str().unwrap()).join("kustomization.yaml").is_file(), "{r}");
    }
    let objects = base_objects();
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap();
    for i in k["images"].as_array().unwrap() {
        assert_eq!(Some(i["name"].as_str().unwrap()), image.split(':').next(), "the overlay's image is the base's");
    }
    for p in k["patches"].as_array().unwrap() {
        let target = objects
            .iter()
            .find(|o| o["kind"] == p["target"]["kind"] && o["metadata"]["name"] == p["target"]["name"])
            .unwrap_or_else(|| panic!("no {} in the base", p["target"]));
        let ops: Vec<Value> = serde_norway::from_str(p["patch"].as_str().unwrap()).unwrap();
        for op in ops {
            assert!(target.pointer(op["path"].as_str().unwrap()).is_some(), "{op} names a field the base sets");
        }
    }
}
