//! Credentials are a closed namespace, and no error about one quotes it: for every adapter
//! that takes a credential, a malformed one with a secret planted in it yields a message
//! that names the problem and never any part of the value.

use std::sync::Arc;

use berth_adapters::{Registry, secrets_from_env};
use berth_core::cluster::Cluster;
use serde_json::json;

const PLANTED: &str = "PLANTED-s3cret-9f2c";

fn cluster(spec: serde_json::Value) -> Cluster {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "uid": uuid::Uuid::new_v4(), "generation": 1, "resource_version": "1",
                     "creation_timestamp": "2026-01-01T00:00:00Z", "update_timestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
        "status": {},
    }))
    .expect("a cluster")
}

fn registry_with(value: &'static str) -> Registry {
    Registry::new(None).with_secrets(Arc::new(move |name: &str| (name == "BERTH_CREDENTIAL_C").then(|| value.into())))
}

fn refusal(result: Result<impl Sized, berth_adapters::BackendError>) -> String {
    match result {
        Ok(_) => panic!("a malformed credential was accepted"),
        Err(e) => format!("{e} {e:?}"),
    }
}

#[tokio::test]
async fn a_malformed_kubeconfig_never_appears_in_the_error() {
    let spec = json!({"kind": "kubernetes", "endpoint": "https://127.0.0.1:1", "credentials_ref": "BERTH_CREDENTIAL_C",
                      "kubernetes": {"flavors": [{"flavor": "h100", "product": "NVIDIA-H100"}]}});
    // Not YAML at all, YAML that is not a kubeconfig, and a kubeconfig whose user entry
    // holds a certificate that does not load: each parser quotes what it read.
    let malformed: [&'static str; 3] = [
        "apiVersion: v1\nclusters: [\n  PLANTED-s3cret-9f2c: {{{\n",
        "apiVersion: v1\nkind: Config\nusers: PLANTED-s3cret-9f2c\n",
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n\
         clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {client-certificate-data: PLANTED-s3cret-9f2c, client-key-data: PLANTED-s3cret-9f2c}}]\n",
    ];
    for kubeconfig in malformed {
        let registry = registry_with(kubeconfig);
        let backend = registry.backend(&cluster(spec.clone())).expect("built lazily");
        let message = refusal(backend.health().await);
        assert!(message.contains("kubeconfig"), "the message names the problem: {message}");
        assert!(!message.contains(PLANTED) && !message.contains("s3cret"), "the credential leaked: {message}");
    }
}

#[tokio::test]
async fn a_malformed_slurm_token_never_appears_in_the_error() {
    let spec = json!({"kind": "slurm", "endpoint": "http://127.0.0.1:1", "credentials_ref": "BERTH_CREDENTIAL_C",
                      "slurm": {"user": "berth", "working_directory": "/tmp",
                                "partitions": [{"name": "gpu", "flavor": "h100"}]}});
    for token in ["PLANTED-s3cret-9f2c\nX-Injected: 1", "PLANTED-s3cret-9f2c with spaces", "PLANTED-s3cret-9f2c\u{7f}"]
    {
        let registry = registry_with(token);
        let message = refusal(registry.backend(&cluster(spec.clone())));
        assert!(message.contains("credential"), "the message names the problem: {message}");
        assert!(!message.contains(PLANTED) && !message.contains("s3cret"), "the credential leaked: {message}");
    }
}

#[test]
fn only_settings_given_for_clusters_can_be_named() {
    let secrets = secrets_from_env();
    let dir = std::env::temp_dir().join(format!("berth-credentials-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("BERTH_CREDENTIAL_FROM_DIR"), "from-dir\n").unwrap();
    std::fs::write(dir.join("BERTH_JWT_SECRET"), "never").unwrap();
    let file = dir.join("token-file");
    std::fs::write(&file, "from-file\n").unwrap();
    // SAFETY: this test binary's other tests never read these variables.
    unsafe {
        std::env::set_var("BERTH_JWT_SECRET", "the-signing-secret");
        std::env::set_var("DATABASE_URL", "postgres://user:password@db/berth");
        std::env::set_var("BERTH_CREDENTIAL_ENV", "from-env");
        std::env::set_var("BERTH_CREDENTIAL_FILE_FILE", &file);
        std::env::set_var("BERTH_CREDENTIALS_DIR", &dir);
    }
    assert_eq!(secrets("BERTH_CREDENTIAL_ENV").as_deref(), Some("from-env"));
    assert_eq!(secrets("BERTH_CREDENTIAL_FILE").as_deref(), Some("from-file"));
    assert_eq!(secrets("BERTH_CREDENTIAL_FROM_DIR").as_deref(), Some("from-dir"));
    for other in ["BERTH_JWT_SECRET", "DATABASE_URL", "PATH", "HOME", "../BERTH_JWT_SECRET", "BERTH_CREDENTIAL_../x"] {
        assert_eq!(secrets(other), None, "{other} is outside the namespace");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
