//! A control plane on real Slurm clusters: a fresh database, the `scripts/slurm-dev`
//! clusters registered with their tokens, optionally a Kubernetes cluster served by the
//! test API server, and every controller running in-process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_adapters::Registry;
use berth_adapters::kubernetes::PRODUCT_LABEL;
use berth_adapters::slurm::dev::DevCluster;
use berth_app::context::OpContext;
use berth_controllers::{Config, Context};
use berth_core::cluster::Cluster;
use berth_core::workload::Workload;
use berth_k8s_test_server::{Config as TestServerConfig, FakeNode, TestApiServer};
use berth_store::PgPool;
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// How long the Kubernetes cluster's pods may stay unscheduled before Berth withdraws the job.
pub const KUBE_GANG_TIMEOUT: Duration = Duration::from_secs(2);

/// The cancel grace period the controllers give in these tests.
pub const GRACE: Duration = Duration::from_secs(3);

/// `spec.run` that runs a shell command.
pub fn command(shell: &str) -> Value {
    json!({"command": ["bash", "-c", shell]})
}

pub struct Plane {
    pub ctx: Context,
    devs: HashMap<String, DevCluster>,
    /// The API server of the Kubernetes cluster `kube`, when there is one.
    pub kube: Option<TestApiServer>,
    controllers: JoinSet<()>,
    pub actor: OpContext,
}

impl Plane {
    /// Registers the named dev clusters (each one partition whose flavor is named after
    /// its GPU type) and starts the controllers.
    pub async fn start(db: PgPool, clusters: &[&str]) -> Self {
        Self::start_with_kubernetes(db, clusters, None).await
    }

    /// Like [`start`](Self::start), plus a Kubernetes cluster `kube` on the test API server
    /// with these nodes; its flavors are the nodes' GPU products, lowercased.
    pub async fn start_with_kubernetes(db: PgPool, clusters: &[&str], kube: Option<Vec<FakeNode>>) -> Self {
        let devs: HashMap<String, DevCluster> =
            clusters.iter().map(|n| ((*n).to_owned(), DevCluster::get(n))).collect();
        let mut secrets: HashMap<String, String> =
            devs.values().map(|d| (secret_name(&d.name), d.token.clone())).collect();
        let mut products: Vec<String> = Vec::new();
        let kube = match kube {
            Some(nodes) => {
                for n in &nodes {
                    let product = &n.labels[PRODUCT_LABEL];
                    if !products.contains(product) {
                        products.push(product.clone());
                    }
                }
                let server = TestApiServer::start(TestServerConfig { nodes, ..TestServerConfig::default() })
                    .await
                    .expect("the test API server starts");
                secrets.insert("BERTH_CREDENTIAL_KUBE".into(), server.kubeconfig());
                Some(server)
            }
            None => None,
        };
        let backends = Registry::new(None).with_secrets(Arc::new(move |name: &str| secrets.get(name).cloned()));
        let config = Config {
            resync: Duration::from_secs(2),
            sync_interval: Duration::from_millis(300),
            health_interval: Duration::from_millis(500),
            unreachable_after_failures: 2,
            unknown_timeout: Duration::from_secs(600),
            cancel_grace: GRACE,
            orphan_grace: Duration::from_secs(5),
            ..Config::default()
        };
        let ctx = Context {
            db,
            backends: Arc::new(backends),
            config,
            epoch: None,
            clock: berth_controllers::Clock::default(),
            world: Default::default(),
            dispatch: Default::default(),
            followed: Default::default(),
            // The jobs here do not call it: a test acknowledges for them, with their token.
            job_api: Some(berth_controllers::JobApiConfig { url: "http://127.0.0.1:9".into(), issuer: issuer() }),
        };
        let actor = OpContext::system("test");
        for dev in devs.values() {
            let flavor = serde_json::from_value(json!({"spec": {}})).unwrap();
            berth_app::flavor::flavor_apply(&ctx.db, &actor, &dev.gpu_type, &flavor, None).await.unwrap();
            let body = serde_json::from_value(dev.apply_body(&dev.gpu_type, &secret_name(&dev.name))).unwrap();
            berth_app::cluster::cluster_apply(&ctx.db, &actor, &dev.name, &body, None).await.unwrap();
        }
        if let Some(server) = &kube {
            for product in &products {
                let flavor = serde_json::from_value(json!({"spec": {}})).unwrap();
                berth_app::flavor::flavor_apply(&ctx.db, &actor, &product.to_lowercase(), &flavor, None).await.unwrap();
            }
            let flavors: Vec<Value> =
                products.iter().map(|p| json!({"flavor": p.to_lowercase(), "product": p})).collect();
            let body = serde_json::from_value(json!({"spec": {
                "kind": "kubernetes",
                "endpoint": server.url(),
                "credentials_ref": "BERTH_CREDENTIAL_KUBE",
                "kubernetes": {"flavors": flavors, "gang_timeout_seconds": KUBE_GANG_TIMEOUT.as_secs()},
            }}))
            .unwrap();
            berth_app::cluster::cluster_apply(&ctx.db, &actor, "kube", &body, None).await.unwrap();
        }
        berth_controllers::cluster_health::reconcile(&ctx).await.unwrap();
        let controllers = berth_controllers::runner::start(&ctx, "slurm-test");
        Self { ctx, devs, kube, controllers, actor }
    }

    /// Lets the cluster's jobs ask for up to `seconds` to checkpoint.
    pub async fn max_checkpoint_grace(&self, cluster: &str, seconds: u32) {
        let c = berth_app::cluster::cluster_get(&self.ctx.db, &self.actor, cluster).await.unwrap();
        let mut spec = serde_json::to_value(&c.spec).unwrap();
        spec["max_checkpoint_grace_seconds"] = seconds.into();
        let body = serde_json::from_value(json!({ "spec": spec })).unwrap();
        berth_app::cluster::cluster_apply(&self.ctx.db, &self.actor, cluster, &body, None).await.unwrap();
    }

    /// Points the Kubernetes cluster at a Prometheus.
    pub async fn prometheus(&self, cluster: &str, url: &str) {
        let c = berth_app::cluster::cluster_get(&self.ctx.db, &self.actor, cluster).await.unwrap();
        let mut spec = serde_json::to_value(&c.spec).unwrap();
        spec["kubernetes"]["prometheus_url"] = url.into();
        let body = serde_json::from_value(json!({ "spec": spec })).unwrap();
        berth_app::cluster::cluster_apply(&self.ctx.db, &self.actor, cluster, &body, None).await.unwrap();
    }

    /// The caller a job is when it calls the API with `token`, authenticated as berthd
    /// does it.
    pub async fn caller(&self, token: &str) -> OpContext {
        let verifier = berth_auth::Verifier { berth: Some(issuer()), oidc: None, leeway: Duration::from_secs(5) };
        let verified = verifier.verify(token).await.unwrap();
        let principal = berth_app::identity::principal(&self.ctx.db, token, verified).await.unwrap().unwrap();
        OpContext::for_request(&self.ctx.db, principal, None, "berth").await.unwrap()
    }

    pub fn dev(&self, name: &str) -> &DevCluster {
        &self.devs[name]
    }

    /// A team with these guarantees (flavor, GPUs).
    pub async fn team(&self, name: &str, guaranteed: &[(&str, u32)]) {
        let quotas: Vec<Value> = guaranteed.iter().map(|(f, g)| json!({"flavor": f, "guaranteed": g})).collect();
        self.team_quotas(name, quotas).await;
    }

    /// A team with these quotas (`{"flavor", "guaranteed", "limit", "weight"}`).
    pub async fn team_quotas(&self, name: &str, quotas: Vec<Value>) {
        let input = serde_json::from_value(json!({"spec": {"quotas": quotas}})).unwrap();
        berth_app::team::team_apply(&self.ctx.db, &self.actor, name, &input, None).await.unwrap();
    }

    /// Submits a batch workload with this spec (`kind` defaults to batch).
    pub async fn submit(&self, team: &str, name: &str, spec: Value) -> Workload {
        let mut full = json!({"kind": "batch"});
        full.as_object_mut().unwrap().extend(spec.as_object().cloned().unwrap());
        let input = serde_json::from_value(json!({"spec": full})).unwrap();
        berth_app::workload::workload_apply(&self.ctx.db, &self.actor, team, name, &input, None).await.unwrap().0
    }

    pub async fn workload(&self, team: &str, name: &str) -> Workload {
        berth_app::workload::workload_get(&self.ctx.db, &self.actor, team, name).await.unwrap()
    }

    /// Waits (up to two minutes) until the workload satisfies `done`.
    pub async fn wait(&self, team: &str, name: &str, what: &str, done: impl Fn(&Workload) -> bool) -> Workload {
        eventually(&format!("{team}/{name} becomes {what}"), || async {
            let w = self.workload(team, name).await;
            if done(&w) { Some(w) } else { None }
        })
        .await
    }

    /// Waits (up to two minutes) until the cluster satisfies `done`.
    pub async fn wait_cluster(&self, name: &str, done: impl Fn(&Cluster) -> bool) -> Cluster {
        eventually(&format!("cluster {name} gets there"), || async {
            let c = berth_app::cluster::cluster_get(&self.ctx.db, &self.actor, name).await.unwrap();
            if done(&c) { Some(c) } else { None }
        })
        .await
    }

    /// The reasons of a workload's events, oldest first.
    pub async fn events(&self, w: &Workload) -> Vec<String> {
        sqlx::query_scalar("SELECT reason FROM events WHERE object_uid = $1 ORDER BY id")
            .bind(w.metadata.uid)
            .fetch_all(&self.ctx.db)
            .await
            .unwrap()
    }

    /// Deletes every workload and waits until their jobs are gone and they are removed.
    pub async fn delete_all(&self) {
        let all: Vec<(String, String)> =
            sqlx::query_as("SELECT team_name, name FROM workloads").fetch_all(&self.ctx.db).await.unwrap();
        for (team, name) in &all {
            berth_app::workload::workload_delete(&self.ctx.db, &self.actor, team, name, None).await.unwrap();
        }
        eventually("every workload is removed", || async {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads").fetch_one(&self.ctx.db).await.unwrap();
            (left == 0).then_some(())
        })
        .await;
    }

    pub async fn stop(mut self) {
        self.controllers.shutdown().await;
    }
}

/// Polls `check` every 200 ms until it gives a value; fails after two minutes, saying what
/// it waited for.
pub async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within two minutes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn secret_name(cluster: &str) -> String {
    format!("BERTH_CREDENTIAL_SLURM_{}", cluster.to_ascii_uppercase())
}

/// The issuer of the tokens jobs get here.
fn issuer() -> berth_auth::BerthIssuer {
    berth_auth::BerthIssuer::new("berth", "berth", &[7; 32]).unwrap()
}

/// A stand-in for Prometheus: every instant query answers one sample, the value the test
/// sets, in Prometheus' own format; the queries asked are kept.
pub struct FakePrometheus {
    pub url: String,
    value: Arc<std::sync::Mutex<f64>>,
    pub queries: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakePrometheus {
    pub fn start(value: f64) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(std::sync::Mutex::new(value));
        let queries = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (v, q) = (shared.clone(), queries.clone());
        std::thread::spawn(move || {
            for socket in listener.incoming() {
                let Ok(mut socket) = socket else { continue };
                let (v, q) = (v.clone(), q.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 8192];
                    let n = socket.read(&mut buf).unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).to_string();
                    let target = request.split_whitespace().nth(1).unwrap_or_default().to_owned();
                    q.lock().unwrap().push(target.clone());
                    let body = if target.starts_with("/api/v1/query?") {
                        let value = *v.lock().unwrap();
                        json!({"status": "success", "data": {"resultType": "vector",
                            "result": [{"metric": {}, "value": [1_700_000_000.0, value.to_string()]}]}})
                    } else {
                        json!({"status": "error", "errorType": "bad_data", "error": "unknown path"})
                    };
                    let body = body.to_string();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes());
                });
            }
        });
        Self { url, value: shared, queries }
    }

    pub fn set(&self, value: f64) {
        *self.value.lock().unwrap() = value;
    }
}
