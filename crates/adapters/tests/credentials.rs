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

/// The review deleted a Kubernetes cluster and its backend kept watching the old endpoint
/// with the credential for minutes. Forgetting deleted clusters drops their backends (and
/// with them, their watch tasks).
#[tokio::test]
async fn a_deleted_clusters_backend_is_dropped_with_its_credential() {
    let spec = json!({"kind": "kubernetes", "endpoint": "https://127.0.0.1:1", "credentials_ref": "BERTH_CREDENTIAL_C",
                      "kubernetes": {"flavors": [{"flavor": "h100", "product": "NVIDIA-H100"}]}});
    let registry = registry_with("apiVersion: v1\nkind: Config\n");
    let (kept, deleted) = (cluster(spec.clone()), cluster(spec));
    let first = registry.backend(&deleted).unwrap();
    assert!(Arc::ptr_eq(&first, &registry.backend(&deleted).unwrap()), "the registry keeps a built backend");
    registry.backend(&kept).unwrap();
    let live = std::collections::HashSet::from([kept.metadata.uid]);
    assert_eq!(registry.retain(&live), 1, "only the deleted cluster's backend goes");
    assert_eq!(Arc::strong_count(&first), 1, "the registry holds the deleted cluster's backend no more");
    assert!(!Arc::ptr_eq(&first, &registry.backend(&deleted).unwrap()));
}

/// A server that answers every request 500, quoting the request's headers back, as a
/// misbehaving backend or proxy might.
async fn echo_server() -> String {
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let text: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?"))).collect();
        let echo = format!("echo: {}", text.join(", "));
        // As slurmrestd words an error (`errors[]`) and as Kubernetes does (a Status).
        let body = serde_json::json!({"errors": [{"error": echo, "description": echo, "error_number": 1}],
                                      "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": echo,
                                      "code": 500});
        (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The review pointed a cluster at a server that repeats request headers: the token came
/// back in the cluster's status, which every caller reads. Every adapter's errors now
/// hide any piece of the credential.
#[tokio::test]
async fn a_backend_that_quotes_the_request_never_puts_the_credential_in_an_error() {
    let url = echo_server().await;
    let slurm = json!({"kind": "slurm", "endpoint": url, "credentials_ref": "BERTH_CREDENTIAL_C",
                       "slurm": {"user": "berth", "working_directory": "/tmp",
                                 "partitions": [{"name": "gpu", "flavor": "h100"}]}});
    let registry = registry_with("cluster-cred-value-TOPSECRET-xyz");
    let message = refusal(registry.backend(&cluster(slurm)).unwrap().inventory().await);
    assert!(message.contains("echo"), "the backend's answer is still quoted: {message}");
    assert!(!message.contains("TOPSECRET"), "the credential leaked: {message}");

    let kubeconfig: &'static str = "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
        contexts: [{name: c, context: {cluster: c, user: u}}]\n\
        clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n\
        users: [{name: u, user: {token: kube-bearer-TOPSECRET-abc}}]\n";
    let k8s = json!({"kind": "kubernetes", "endpoint": url, "credentials_ref": "BERTH_CREDENTIAL_C",
                     "kubernetes": {"flavors": [{"flavor": "h100", "product": "NVIDIA-H100"}]}});
    let registry = registry_with(kubeconfig);
    let message = refusal(registry.backend(&cluster(k8s)).unwrap().health().await);
    assert!(!message.contains("TOPSECRET"), "the credential leaked: {message}");
}
