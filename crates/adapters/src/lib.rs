//! Berth's backends. Every kind of cluster (Slurm, Kubernetes, the simulator) implements
//! one small trait, [`ClusterBackend`]; [`Registry`] is the one place that maps a
//! cluster's kind to its implementation.
//!
//! Adapters depend on the domain types only, never on the store or the HTTP layer: the
//! controllers own every decision and call a backend only to observe or to act.

mod backend;
pub mod kubernetes;
mod prometheus;
mod scrub;
pub mod sim;
pub mod slurm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use backend::{
    BackendError, ClusterBackend, Inventory, InventoryNode, JobApi, JobKey, JobRequest, JobState, JobStatus,
    LogRequest, LogStream, last_lines,
};
use berth_core::cluster::{Cluster, ClusterKind, ClusterSpec};
use uuid::Uuid;

/// Where backends' credentials come from: the value of the credential a cluster's
/// `credentials_ref` names (`BERTH_CREDENTIAL_<NAME>`), or `None`.
pub type Secrets = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Credentials given to berthd for clusters, and nothing else of its configuration: for a
/// name `BERTH_CREDENTIAL_<NAME>`, the environment variable of that name, else the file
/// named by `<name>_FILE`, else the file of that name in `BERTH_CREDENTIALS_DIR`. Any other
/// name (the signing secret, the database URL) finds nothing, whatever the environment
/// holds. Files are read again whenever the backend is rebuilt, so a rotated one is picked
/// up.
pub fn secrets_from_env() -> Secrets {
    Arc::new(|name: &str| {
        if !berth_core::cluster::is_credential_name(name) {
            return None;
        }
        let from_file = |path: PathBuf| std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned());
        std::env::var(name)
            .ok()
            .or_else(|| from_file(std::env::var_os(format!("{name}_FILE"))?.into()))
            .or_else(|| from_file(PathBuf::from(std::env::var_os("BERTH_CREDENTIALS_DIR")?).join(name)))
    })
}

/// How long a built backend keeps the secret it read; after that it is read again and the
/// backend rebuilt if the secret changed (a rotated token).
const SECRET_REREAD: std::time::Duration = std::time::Duration::from_secs(60);

/// A backend built from a cluster's spec and secret.
struct Built {
    /// The spec it was built from, cordon aside (cordoning is the scheduler's business, and
    /// a rebuilt backend loses what it remembers, such as Slurm's last job listing).
    spec: ClusterSpec,
    secret: Option<String>,
    read_at: std::time::Instant,
    backend: Arc<dyn ClusterBackend>,
}

/// Builds and caches the backend of each cluster.
///
/// The one list of backend kinds is the `match` in [`Registry::backend`].
pub struct Registry {
    /// Where simulated clusters keep their journals; `None`: in memory only.
    sim_state_dir: Option<PathBuf>,
    sim_clock: sim::Clock,
    /// Each simulated cluster, with the cluster generation (spec version) it was last
    /// configured from.
    sims: Mutex<HashMap<Uuid, (i64, Arc<sim::SimCluster>)>>,
    secrets: Secrets,
    /// Backends of real clusters.
    remote: Mutex<HashMap<Uuid, Built>>,
    /// Where berthd's own service account is mounted (Kubernetes clusters without a
    /// `credentials_ref`).
    service_account_dir: PathBuf,
}

impl Registry {
    pub fn new(sim_state_dir: Option<PathBuf>) -> Self {
        Self::with_sim_clock(sim_state_dir, sim::Clock::System)
    }

    /// A registry whose simulated clusters read `clock` (tests drive time by hand).
    pub fn with_sim_clock(sim_state_dir: Option<PathBuf>, sim_clock: sim::Clock) -> Self {
        Self {
            sim_state_dir,
            sim_clock,
            sims: Mutex::new(HashMap::new()),
            secrets: secrets_from_env(),
            remote: Mutex::new(HashMap::new()),
            service_account_dir: kubernetes::SERVICE_ACCOUNT_DIR.into(),
        }
    }

    /// Reads clusters' credentials from `secrets` instead of the environment.
    #[must_use]
    pub fn with_secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// Reads berthd's in-cluster service account from `dir` instead of where Kubernetes
    /// mounts it.
    #[must_use]
    pub fn with_service_account_dir(mut self, dir: PathBuf) -> Self {
        self.service_account_dir = dir;
        self
    }

    /// The simulated cluster with this uid, if one was built (for tests and benchmarks).
    pub fn sim(&self, uid: Uuid) -> Option<Arc<sim::SimCluster>> {
        self.sims.lock().expect("sim registry lock").get(&uid).map(|(_, sim)| sim.clone())
    }

    /// Forgets the backends of clusters not in `live` (deleted ones) and returns how many:
    /// a deleted cluster's connections and watches stop with its backend, so its
    /// credential is not sent anywhere again.
    pub fn retain(&self, live: &std::collections::HashSet<Uuid>) -> usize {
        let mut remote = self.remote.lock().expect("backend registry lock");
        let mut sims = self.sims.lock().expect("sim registry lock");
        let before = remote.len() + sims.len();
        remote.retain(|uid, _| live.contains(uid));
        sims.retain(|uid, _| live.contains(uid));
        before - remote.len() - sims.len()
    }

    /// The backend for `cluster`, configured from its current spec (a cached backend is
    /// reconfigured only when the cluster's generation moved).
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] for a kind whose adapter is not built yet, and
    /// whatever the backend's constructor reports (a sim journal that cannot be read).
    pub fn backend(&self, cluster: &Cluster) -> Result<Arc<dyn ClusterBackend>, BackendError> {
        match cluster.spec.kind {
            ClusterKind::Sim => {
                let spec = cluster.spec.sim.as_ref().ok_or_else(|| BackendError::Rejected("no sim spec".into()))?;
                let mut sims = self.sims.lock().expect("sim registry lock");
                let generation = cluster.metadata.generation;
                match sims.get_mut(&cluster.metadata.uid) {
                    Some((configured, sim)) => {
                        if *configured != generation {
                            sim.configure(spec);
                            *configured = generation;
                        }
                        Ok(sim.clone())
                    }
                    None => {
                        let journal =
                            self.sim_state_dir.as_ref().map(|d| d.join(format!("{}.jsonl", cluster.metadata.uid)));
                        let sim = Arc::new(sim::SimCluster::open(spec, journal, self.sim_clock.clone())?);
                        sims.insert(cluster.metadata.uid, (generation, sim.clone()));
                        Ok(sim)
                    }
                }
            }
            ClusterKind::Slurm => self.remote(cluster, |token| {
                let token = token.ok_or_else(|| missing_secret(cluster))?;
                Ok(Arc::new(slurm::SlurmCluster::new(&cluster.spec, token)?))
            }),
            ClusterKind::Kubernetes => self.remote(cluster, |kubeconfig| {
                if kubeconfig.is_none() && cluster.spec.credentials_ref.is_some() {
                    return Err(missing_secret(cluster));
                }
                let backend = kubernetes::KubernetesCluster::new(&cluster.spec, kubeconfig)?;
                Ok(Arc::new(backend.service_account_dir(&self.service_account_dir)))
            }),
        }
    }

    /// The cached backend of a real cluster, rebuilt by `build` (given the secret) when
    /// the cluster's spec (cordon aside) or its secret changed.
    fn remote(
        &self,
        cluster: &Cluster,
        build: impl FnOnce(Option<String>) -> Result<Arc<dyn ClusterBackend>, BackendError>,
    ) -> Result<Arc<dyn ClusterBackend>, BackendError> {
        let mut remote = self.remote.lock().expect("backend registry lock");
        let spec = ClusterSpec { cordoned: false, ..cluster.spec.clone() };
        let uid = cluster.metadata.uid;
        if let Some(b) = remote.get_mut(&uid)
            && b.spec == spec
        {
            if b.read_at.elapsed() < SECRET_REREAD {
                return Ok(b.backend.clone());
            }
            let secret = cluster.spec.credentials_ref.as_deref().and_then(|r| (self.secrets)(r));
            b.read_at = std::time::Instant::now();
            if secret == b.secret {
                return Ok(b.backend.clone());
            }
        }
        let secret = cluster.spec.credentials_ref.as_deref().and_then(|r| (self.secrets)(r));
        let backend = build(secret.clone())?;
        let backend: Arc<dyn ClusterBackend> = Arc::new(scrub::Scrubbed::new(backend, secret.as_deref()));
        remote.insert(uid, Built { spec, secret, read_at: std::time::Instant::now(), backend: backend.clone() });
        Ok(backend)
    }
}

fn missing_secret(cluster: &Cluster) -> BackendError {
    BackendError::Unreachable(format!(
        "berthd has no credential {} (neither the environment variable, nor {0}_FILE, nor a file of that name in \
         BERTH_CREDENTIALS_DIR)",
        cluster.spec.credentials_ref.as_deref().unwrap_or("(credentials_ref is not set)")
    ))
}
