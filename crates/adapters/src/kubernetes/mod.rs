//! The Kubernetes backend: drives a cluster through the Kubernetes API with `kube` and
//! `k8s-openapi`, as a well-behaved controller does.
//!
//! - Connection: the kubeconfig held by the secret the cluster's `credentials_ref` names
//!   (its server replaced by the cluster's `endpoint`), or berthd's in-cluster service
//!   account when the cluster names no secret.
//! - Observation: reflectors (list once, then watch; resumed after a dropped connection,
//!   relisted after `410 Gone`) keep Nodes, Pods and Berth's Jobs and Deployments in
//!   memory, so the inventory and job states cost no API calls. A watch that keeps failing
//!   makes the cluster unreachable rather than silently stale; a job this backend just
//!   applied is listed even before its watch shows it, so it never looks vanished.
//! - Submit: training and batch run as an Indexed Job, inference as a Deployment and a
//!   Service, notebooks as a Deployment (see [`manifest`]); each is created with
//!   server-side apply under the name of its [`JobKey`], so a repeated submit (a retry, a
//!   berthd killed mid-submit) finds the same object instead of making a second one.
//! - Cancel: delete with foreground propagation and the grace period, so pods get SIGTERM
//!   and the object disappears once they are gone. A repeated cancel changes nothing.
//! - Failures: the API refusing a request (4xx other than 401/403/429) is
//!   [`BackendError::Rejected`]; no answer, a timeout, 5xx, 429 and refused credentials are
//!   [`BackendError::Unreachable`].

mod manifest;
mod observe;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::cluster::{ClusterKind, ClusterSpec, KubernetesSpec};
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use self::manifest::{CONTAINER, Manifest, key_of};
pub use self::manifest::{KEY_LABEL, MANAGED_BY, PRODUCT_LABEL, SERVICE_LABEL};
use self::observe::{deployment_status, job_status, key_selector, pods_by_key};
use crate::backend::{BackendError, ClusterBackend, Inventory, JobKey, JobRequest, JobStatus, LogRequest, LogStream};

/// How long one API call may take, and how long a first listing may take to arrive.
const TIMEOUT: Duration = Duration::from_secs(15);
/// How long the inventory's check that the API server answers waits: the clusters'
/// refreshes run one after another, so one that hangs holds up the others this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A watch whose last attempt failed less than this long ago, with no event since, makes
/// the cluster unreachable (the watcher retries with backoff of at most 30 s).
const WATCH_FAILING: Duration = Duration::from_secs(60);
/// How long a job this backend applied is listed even if its watch has not shown it.
const UNSEEN_KEPT: Duration = Duration::from_secs(60);
/// Berth's field manager for server-side apply.
const FIELD_MANAGER: &str = "berth";

/// Where Kubernetes mounts a pod's service-account credentials (`token`, `ca.crt`,
/// `namespace`): berthd's in-cluster identity.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A Kubernetes cluster.
pub struct KubernetesCluster {
    endpoint: String,
    /// The kubeconfig; `None`: in-cluster configuration.
    kubeconfig: Option<Kubeconfig>,
    /// Where the in-cluster service account's files are.
    service_account_dir: std::path::PathBuf,
    spec: KubernetesSpec,
    /// Built on first use (building a client and starting watches needs the runtime).
    connected: tokio::sync::OnceCell<Connected>,
}

/// A kubeconfig (it holds credentials), kept out of `Debug` and logs.
struct Kubeconfig(String);

impl Debug for Kubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A client and the watches that mirror the cluster.
struct Connected {
    client: Client,
    nodes: Watched<Node>,
    pods: Watched<Pod>,
    jobs: Watched<Job>,
    deployments: Watched<Deployment>,
    /// Namespaces this backend has made sure exist.
    namespaces: Mutex<HashSet<String>>,
    /// Jobs this backend applied in the last [`UNSEEN_KEPT`], with their state then: a watch
    /// lags the API a moment, and a job must never look vanished right after its submit.
    unseen: Mutex<HashMap<JobKey, (Instant, JobStatus)>>,
}

/// One reflector: the in-memory copy of a kind of object, kept current by its watch.
struct Watched<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    /// The last failure of the watch and when, cleared by the next event.
    failure: Arc<Mutex<Option<(Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K: Resource + Clone + 'static> Drop for Watched<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn start(api: Api<K>, config: watcher::Config) -> Self {
        let (store, writer) = reflector::store();
        let failure = Arc::new(Mutex::new(None));
        let failed = failure.clone();
        let kind = K::kind(&());
        let task = tokio::spawn(async move {
            let events = reflector::reflector(writer, watcher(api, config).default_backoff());
            futures_util::pin_mut!(events);
            while let Some(event) = events.next().await {
                let mut failure = failed.lock().expect("watch failure lock");
                match event {
                    Ok(_) => *failure = None,
                    // 410 Gone: the watch resumed from a version the server no longer
                    // keeps; the watcher lists again, which is the protocol, not a failure.
                    Err(watcher::Error::WatchError(status)) if status.code == 410 => {}
                    Err(e) => {
                        tracing::debug!(kind = %kind, error = %e, "watch failed; retrying");
                        *failure = Some((Instant::now(), e.to_string()));
                    }
                }
            }
        });
        Self { store, failure, task }
    }

    /// The objects, once the first listing arrived and unless the watch keeps failing.
    async fn current(&self) -> Result<Vec<Arc<K>>, BackendError> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let failure = self.failure.lock().expect("watch failure lock").clone();
            match failure {
                Some((at, why)) if at.elapsed() < WATCH_FAILING => {
                    return Err(BackendError::Unreachable(format!("watching {}s fails: {why}", K::kind(&()))));
                }
                _ => {}
            }
            if tokio::time::timeout(Duration::from_millis(50), self.store.wait_until_ready()).await.is_ok() {
                return Ok(self.store.state());
            }
            if Instant::now() > deadline {
                return Err(BackendError::Unreachable(format!(
                    "no listing of {}s within {}s",
                    K::kind(&()),
                    TIMEOUT.as_secs()
                )));
            }
        }
    }
}

impl KubernetesCluster {
    /// A backend for a `kubernetes` cluster's spec, with the kubeconfig its
    /// `credentials_ref` names (`None`: in-cluster configuration).
    ///
    /// # Errors
    /// [`BackendError::Rejected`] when the spec has no endpoint or Kubernetes settings.
    pub fn new(spec: &ClusterSpec, kubeconfig: Option<String>) -> Result<Self, BackendError> {
        let endpoint = spec.endpoint.as_deref().ok_or_else(|| BackendError::Rejected("no endpoint".into()))?;
        let k8s = spec.kubernetes.as_ref().ok_or_else(|| BackendError::Rejected("no spec.kubernetes".into()))?;
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            kubeconfig: kubeconfig.map(Kubeconfig),
            service_account_dir: SERVICE_ACCOUNT_DIR.into(),
            spec: k8s.clone(),
            connected: tokio::sync::OnceCell::new(),
        })
    }

    /// Reads the in-cluster service account from `dir` instead of [`SERVICE_ACCOUNT_DIR`].
    #[must_use]
    pub fn service_account_dir(mut self, dir: &std::path::Path) -> Self {
        dir.clone_into(&mut self.service_account_dir);
        self
    }

    fn gang_timeout(&self) -> Duration {
        Duration::from_secs(self.spec.gang_timeout_seconds)
    }

    async fn connected(&self) -> Result<&Connected, BackendError> {
        self.connected.get_or_try_init(|| self.connect()).await
    }

    async fn connect(&self) -> Result<Connected, BackendError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| BackendError::Unreachable(format!("{what}: {e}"));
        // Errors about the kubeconfig say which step failed and never the parser's text,
        // which quotes the lines around the fault: the credential itself.
        let unreadable = |step: &str| {
            BackendError::Unreachable(format!(
                "the kubeconfig in the cluster's credential {step} (the parser's message is not shown: it would quote \
                 the credential)"
            ))
        };
        let mut config = match &self.kubeconfig {
            Some(Kubeconfig(text)) => {
                let kubeconfig =
                    kube::config::Kubeconfig::from_yaml(text).map_err(|_| unreadable("is not a valid kubeconfig"))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|_| unreadable("cannot be used (its context, cluster or user entries are incomplete)"))?
            }
            None => kube::Config::from_custom_kubeconfig(
                in_cluster(&self.service_account_dir)?,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| bad("the in-cluster service account", &e))?,
        };
        config.cluster_url = self.endpoint.parse().map_err(|e| bad("the endpoint", &e))?;
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        let client =
            Client::try_from(config).map_err(|_| unreadable("holds a certificate or key that does not load"))?;
        let ours = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
        Ok(Connected {
            nodes: Watched::start(Api::all(client.clone()), watcher::Config::default()),
            pods: Watched::start(Api::all(client.clone()), watcher::Config::default()),
            jobs: Watched::start(Api::all(client.clone()), ours.clone()),
            deployments: Watched::start(Api::all(client.clone()), ours),
            namespaces: Mutex::new(HashSet::new()),
            unseen: Mutex::new(HashMap::new()),
            client,
        })
    }

    /// Creates or finds `object` by server-side apply.
    async fn apply<K>(&self, client: &Client, object: &K) -> Result<K, BackendError>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
        K::Scope: NamespacedOrNot,
    {
        self.apply_raw(client, object).await.map_err(classify)
    }

    /// [`Self::apply`], keeping the raw error (an apply answers 404 only where the object's
    /// namespace is missing).
    async fn apply_raw<K>(&self, client: &Client, object: &K) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
        K::Scope: NamespacedOrNot,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let api = K::Scope::api::<K>(client, object.meta().namespace.as_deref());
        call_raw(api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))).await
    }

    /// Applies a job's objects: its Job, or its Service (if it has one) and Deployment.
    async fn apply_job(&self, c: &Connected, job: &JobRequest, manifest: &Manifest) -> Result<JobStatus, kube::Error> {
        Ok(match manifest {
            Manifest::Job(object) => {
                let applied = self.apply_raw(&c.client, &**object).await?;
                job_status(job.key, &applied, &[], self.gang_timeout())
            }
            Manifest::Deployment { deployment, service } => {
                if let Some(service) = service {
                    self.apply_raw::<Service>(&c.client, service).await?;
                }
                let applied = self.apply_raw(&c.client, &**deployment).await?;
                deployment_status(job.key, &applied, &[], self.gang_timeout())
            }
        })
    }

    async fn ensure_namespace(&self, c: &Connected, name: &str) -> Result<(), BackendError> {
        if c.namespaces.lock().expect("namespaces lock").contains(name) {
            return Ok(());
        }
        self.apply::<Namespace>(&c.client, &manifest::namespace(name)).await?;
        c.namespaces.lock().expect("namespaces lock").insert(name.to_owned());
        Ok(())
    }

    /// The topology block all of `nodes` share, if they share one.
    async fn block_of(&self, c: &Connected, nodes: &[String]) -> Result<Option<String>, BackendError> {
        if nodes.is_empty() {
            return Ok(None);
        }
        let all = c.nodes.current().await?;
        let blocks: HashSet<Option<&String>> = nodes
            .iter()
            .map(|n| {
                all.iter()
                    .find(|node| node.metadata.name.as_ref() == Some(n))
                    .and_then(|node| node.metadata.labels.as_ref()?.get(&self.spec.topology_label))
            })
            .collect();
        Ok(match blocks.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(block)] => Some((*block).clone()),
            _ => None,
        })
    }
}

/// Cluster-scoped and namespaced objects are reached through different [`Api`]s.
trait NamespacedOrNot {
    fn api<K: Resource<Scope = Self, DynamicType = ()>>(client: &Client, namespace: Option<&str>) -> Api<K>;
}

impl NamespacedOrNot for k8s_openapi::NamespaceResourceScope {
    fn api<K: Resource<Scope = Self, DynamicType = ()>>(client: &Client, namespace: Option<&str>) -> Api<K> {
        Api::namespaced(client.clone(), namespace.unwrap_or("default"))
    }
}

impl NamespacedOrNot for k8s_openapi::ClusterResourceScope {
    fn api<K: Resource<Scope = Self, DynamicType = ()>>(client: &Client, _: Option<&str>) -> Api<K> {
        Api::all(client.clone())
    }
}

/// The kubeconfig of a pod's service account, as the official clients read it: the token
/// file (re-read as the kubelet rotates it), the cluster's CA when mounted, the namespace.
/// Its server is a placeholder: the cluster's `endpoint` replaces it.
fn in_cluster(dir: &std::path::Path) -> Result<kube::config::Kubeconfig, BackendError> {
    use kube::config::{AuthInfo, Context, NamedAuthInfo, NamedCluster, NamedContext};
    let token = dir.join("token");
    if !token.is_file() {
        return Err(BackendError::Unreachable(format!(
            "no service-account token at {}: berthd is not running in a pod with a service account; give the \
             cluster a credentials_ref naming a kubeconfig",
            token.display()
        )));
    }
    let ca = dir.join("ca.crt");
    let cluster = kube::config::Cluster {
        server: Some("https://kubernetes.default.svc".into()),
        certificate_authority: ca.is_file().then(|| ca.display().to_string()),
        ..Default::default()
    };
    let user = AuthInfo { token_file: Some(token.display().to_string()), ..Default::default() };
    let context = Context {
        cluster: "in-cluster".into(),
        user: Some("service-account".into()),
        namespace: std::fs::read_to_string(dir.join("namespace")).ok().map(|n| n.trim().to_owned()),
        ..Default::default()
    };
    Ok(kube::config::Kubeconfig {
        clusters: vec![NamedCluster { name: "in-cluster".into(), cluster: Some(cluster), ..Default::default() }],
        auth_infos: vec![NamedAuthInfo { name: "service-account".into(), auth_info: Some(user), ..Default::default() }],
        contexts: vec![NamedContext { name: "in-cluster".into(), context: Some(context), ..Default::default() }],
        current_context: Some("in-cluster".into()),
        ..Default::default()
    })
}

/// One API call, bounded by [`TIMEOUT`], its error classified.
async fn call<T>(request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, BackendError> {
    match tokio::time::timeout(TIMEOUT, request).await {
        Ok(result) => result.map_err(classify),
        Err(_) => {
            Err(BackendError::Unreachable(format!("the Kubernetes API did not answer within {}s", TIMEOUT.as_secs())))
        }
    }
}

/// The API refused the request ([`BackendError::Rejected`]) or could not be used
/// ([`BackendError::Unreachable`]).
fn classify(e: kube::Error) -> BackendError {
    match e {
        kube::Error::Api(status) => {
            let what = format!("{} ({} {})", status.message, status.code, status.reason);
            match status.code {
                401 | 403 => {
                    BackendError::Unreachable(format!("the Kubernetes API refused Berth's credentials: {what}"))
                }
                429 | 500.. => BackendError::Unreachable(format!("the Kubernetes API failed: {what}")),
                _ => BackendError::Rejected(what),
            }
        }
        other => BackendError::Unreachable(format!("the Kubernetes API cannot be reached: {other}")),
    }
}

/// Deletes a job's pods again with a one-second grace period (what `kubectl delete
/// --grace-period=0` sends without `--force`): a pod still in its grace period is killed
/// now instead of when that ends.
async fn stop_pods_now(pods: &Api<Pod>, names: &[String]) -> Result<(), BackendError> {
    let now = DeleteParams { grace_period_seconds: Some(1), ..DeleteParams::default() };
    for name in names {
        gone(call_raw(pods.delete(name, &now)).await)?;
    }
    Ok(())
}

#[async_trait]
impl ClusterBackend for KubernetesCluster {
    fn kind(&self) -> ClusterKind {
        ClusterKind::Kubernetes
    }

    async fn health(&self) -> Result<(), BackendError> {
        let c = self.connected().await?;
        call(c.client.apiserver_version()).await.map(|_| ())
    }

    async fn inventory(&self) -> Result<Inventory, BackendError> {
        let c = self.connected().await?;
        // The watches keep what they last saw while an API server that hangs says nothing:
        // read from them alone, a cluster whose server stopped answering stayed Healthy
        // (and took new work) for minutes. The server itself is asked too.
        match tokio::time::timeout(PROBE_TIMEOUT, c.client.apiserver_version()).await {
            Ok(answered) => answered.map(|_| ()).map_err(classify)?,
            Err(_) => {
                return Err(BackendError::Unreachable(format!(
                    "the Kubernetes API did not answer within {}s",
                    PROBE_TIMEOUT.as_secs()
                )));
            }
        }
        let nodes = c.nodes.current().await?;
        let pods = c.pods.current().await?;
        let nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        Ok(Inventory { nodes: observe::inventory(&self.spec, &nodes, &pods) })
    }

    async fn submit(&self, job: &JobRequest) -> Result<JobStatus, BackendError> {
        let c = self.connected().await?;
        let block = self.block_of(c, &job.nodes).await?;
        let manifest = manifest::manifest(&self.spec, job, block.as_deref())?;
        let namespace = manifest::namespace_of(&self.spec, &job.team);
        self.ensure_namespace(c, &namespace).await?;
        let status = match self.apply_job(c, job, &manifest).await {
            // The namespace Berth made is gone (deleted, or the cluster rebuilt): made
            // again, once. Remembered as made, every job of the team failed until a restart.
            Err(kube::Error::Api(status)) if status.code == 404 => {
                c.namespaces.lock().expect("namespaces lock").remove(&namespace);
                self.ensure_namespace(c, &namespace).await?;
                self.apply_job(c, job, &manifest).await.map_err(classify)?
            }
            applied => applied.map_err(classify)?,
        };
        c.unseen.lock().expect("unseen jobs lock").insert(job.key, (Instant::now(), status.clone()));
        Ok(status)
    }

    async fn jobs(&self) -> Result<Vec<JobStatus>, BackendError> {
        let c = self.connected().await?;
        let (jobs, deployments, pods) =
            (c.jobs.current().await?, c.deployments.current().await?, c.pods.current().await?);
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        let pods = pods_by_key(&pods);
        let pods_of = |key: &JobKey| pods.get(key).map_or(&[][..], Vec::as_slice);
        let jobs = jobs.iter().filter_map(|j| {
            let key = key_of(j.metadata.labels.as_ref())?;
            Some(job_status(key, j, pods_of(&key), self.gang_timeout()))
        });
        let deployments = deployments.iter().filter_map(|d| {
            let key = key_of(d.metadata.labels.as_ref())?;
            Some(deployment_status(key, d, pods_of(&key), self.gang_timeout()))
        });
        let mut all: Vec<JobStatus> = jobs.chain(deployments).collect();
        // Jobs applied a moment ago that the watches have not shown yet.
        let mut unseen = c.unseen.lock().expect("unseen jobs lock");
        unseen.retain(|_, (at, _)| at.elapsed() < UNSEEN_KEPT);
        let listed: HashSet<JobKey> = all.iter().map(|j| j.key).collect();
        all.extend(unseen.iter().filter(|(key, _)| !listed.contains(key)).map(|(_, (_, job))| job.clone()));
        Ok(all)
    }

    async fn job(&self, key: JobKey) -> Result<Option<JobStatus>, BackendError> {
        let c = self.connected().await?;
        Ok(find(c, key, self.gang_timeout()).await?.map(|(_, status)| status))
    }

    async fn cancel(&self, key: JobKey, grace: Duration) -> Result<(), BackendError> {
        let c = self.connected().await?;
        c.unseen.lock().expect("unseen jobs lock").remove(&key);
        let Some((found, job)) = find(c, key, self.gang_timeout()).await? else { return Ok(()) };
        if job.state.is_final() || (job.cancelling && !grace.is_zero()) {
            return Ok(());
        }
        let (namespace, name) = job.job_id.split_once('/').unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), namespace);
        let pod_names: Vec<String> = call(pods.list(&ListParams::default().labels(&key_selector(key))))
            .await?
            .items
            .into_iter()
            .filter_map(|pod| pod.metadata.name)
            .collect();
        if job.cancelling {
            return stop_pods_now(&pods, &pod_names).await;
        }
        // The notice first, then the deletion (SIGTERM, and the grace to checkpoint).
        let stop_by = chrono::Utc::now() + chrono::Duration::from_std(grace).unwrap_or_default();
        let stop_by = stop_by.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let notice = serde_json::json!({"metadata": {"annotations": {manifest::STOP_BY_ANNOTATION: stop_by}}});
        for pod_name in &pod_names {
            gone(call_raw(pods.patch(pod_name, &PatchParams::default(), &Patch::Merge(&notice))).await)?;
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            grace_period_seconds: Some(u32::try_from(grace.as_secs()).unwrap_or(u32::MAX)),
            ..DeleteParams::default()
        };
        let client = c.client.clone();
        match found {
            Found::Job => gone(call_raw(Api::<Job>::namespaced(client, namespace).delete(name, &params)).await)?,
            Found::Deployment => {
                gone(call_raw(Api::<Service>::namespaced(client.clone(), namespace).delete(name, &params)).await)?;
                gone(call_raw(Api::<Deployment>::namespaced(client, namespace).delete(name, &params)).await)?;
            }
        }
        // The garbage collector deletes the pods with their own grace period, whatever
        // the owner's deletion said.
        if grace.is_zero() { stop_pods_now(&pods, &pod_names).await } else { Ok(()) }
    }

    async fn load(&self, key: JobKey, query: Option<&str>) -> Result<Option<f64>, BackendError> {
        let url = self.spec.prometheus_url.as_deref().ok_or_else(|| {
            BackendError::Unsupported("the cluster names no Prometheus (spec.kubernetes.prometheus_url)".into())
        })?;
        let query = query.ok_or_else(|| {
            BackendError::Unsupported(format!("job {key} names no query for its load (spec.inference.query)"))
        })?;
        crate::prometheus::instant(url, query).await
    }

    async fn logs(self: Arc<Self>, key: JobKey, request: LogRequest) -> Result<LogStream, BackendError> {
        let c = self.connected().await?;
        let selector = ListParams::default().labels(&key_selector(key));
        let pods = call(Api::<Pod>::all(c.client.clone()).list(&selector)).await?.items;
        let pod = task_pod(pods, request.task).ok_or_else(|| {
            BackendError::Rejected(format!("job {key} has no pod for task {} (yet, or any more)", request.task))
        })?;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(c.client.clone(), &namespace);
        let params = LogParams {
            container: Some(CONTAINER.to_owned()),
            follow: request.follow,
            tail_lines: request.tail.map(i64::from),
            ..LogParams::default()
        };
        if !request.follow {
            let text = call(api.logs(&name, &params)).await?;
            return Ok(futures_util::stream::once(async move { Ok(text) }).boxed());
        }
        // Opening the stream is bounded; reading it is not (it lasts as long as the task).
        let reader = call(api.log_stream(&name, &params)).await?;
        let lines = futures_util::io::AsyncBufReadExt::lines(reader);
        Ok(lines
            .map(|line| {
                line.map(|mut l| {
                    l.push('\n');
                    l
                })
                .map_err(|e| BackendError::Unreachable(format!("reading the pod's log: {e}")))
            })
            .boxed())
    }

    async fn scale(&self, key: JobKey, replicas: u32) -> Result<(), BackendError> {
        let c = self.connected().await?;
        let Some((Found::Deployment, status)) = find(c, key, self.gang_timeout()).await? else {
            return Err(BackendError::Rejected(format!("job {key} is not a Deployment of Berth's")));
        };
        let (namespace, name) = status.job_id.split_once('/').unwrap_or_default();
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        let api: Api<Deployment> = Api::namespaced(c.client.clone(), namespace);
        call(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await.map(|_| ())
    }
}

/// The pod of a task: an Indexed Job's pod whose completion index is the task (the newest,
/// when a pod was replaced), or a Deployment's `task`-th pod by age.
fn task_pod(mut pods: Vec<Pod>, task: u32) -> Option<Pod> {
    let index = |p: &Pod| p.metadata.labels.as_ref()?.get(COMPLETION_INDEX)?.parse::<u32>().ok();
    pods.sort_by(|a, b| {
        let created = |p: &Pod| p.metadata.creation_timestamp.clone().map(|t| t.0);
        created(a).cmp(&created(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    if pods.iter().any(|p| index(p).is_some()) {
        return pods.into_iter().rev().find(|p| index(p) == Some(task));
    }
    pods.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).nth(task as usize)
}

/// The label an Indexed Job's pods carry with their index.
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// What kind of object a job is.
enum Found {
    Job,
    Deployment,
}

/// A job read fresh from the API (not from the watches, which may lag a moment).
async fn find(c: &Connected, key: JobKey, gang_timeout: Duration) -> Result<Option<(Found, JobStatus)>, BackendError> {
    let selector = ListParams::default().labels(&key_selector(key));
    let jobs = call(Api::<Job>::all(c.client.clone()).list(&selector)).await?.items;
    let deployments = if jobs.is_empty() {
        call(Api::<Deployment>::all(c.client.clone()).list(&selector)).await?.items
    } else {
        Vec::new()
    };
    if jobs.is_empty() && deployments.is_empty() {
        return Ok(None);
    }
    // Pods only for a job that exists: an unknown key costs two calls, not three.
    let pods = call(Api::<Pod>::all(c.client.clone()).list(&selector)).await?.items;
    let pods: Vec<&Pod> = pods.iter().collect();
    Ok(match (jobs.first(), deployments.first()) {
        (Some(j), _) => Some((Found::Job, job_status(key, j, &pods, gang_timeout))),
        (None, Some(d)) => Some((Found::Deployment, deployment_status(key, d, &pods, gang_timeout))),
        (None, None) => None,
    })
}

/// Like [`call`], keeping the raw error so a 404 can be told apart.
async fn call_raw<T>(request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
    match tokio::time::timeout(TIMEOUT, request).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service("the Kubernetes API did not answer in time".into())),
    }
}

/// A delete of something already gone is done.
fn gone<T>(result: Result<T, kube::Error>) -> Result<(), BackendError> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(classify(e)),
    }
}
