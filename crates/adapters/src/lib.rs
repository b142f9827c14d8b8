//! Berth's backends. Every kind of cluster (Slurm, Kubernetes, the simulator) implements
//! one small trait, [`ClusterBackend`]; [`Registry`] is the one place that maps a
//! cluster's kind to its implementation.
//!
//! Adapters depend on the domain types only, never on the store or the HTTP layer: the
//! controllers own every decision and call a backend only to observe or to act.

mod backend;
pub mod sim;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use backend::{BackendError, ClusterBackend, Inventory, InventoryNode, JobKey, JobRequest, JobState, JobStatus};
use berth_core::cluster::{Cluster, ClusterKind};
use uuid::Uuid;

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
}

impl Registry {
    pub fn new(sim_state_dir: Option<PathBuf>) -> Self {
        Self::with_sim_clock(sim_state_dir, sim::Clock::System)
    }

    /// A registry whose simulated clusters read `clock` (tests drive time by hand).
    pub fn with_sim_clock(sim_state_dir: Option<PathBuf>, sim_clock: sim::Clock) -> Self {
        Self { sim_state_dir, sim_clock, sims: Mutex::new(HashMap::new()) }
    }

    /// The simulated cluster with this uid, if one was built (for tests and benchmarks).
    pub fn sim(&self, uid: Uuid) -> Option<Arc<sim::SimCluster>> {
        self.sims.lock().expect("sim registry lock").get(&uid).map(|(_, sim)| sim.clone())
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
            ClusterKind::Slurm | ClusterKind::Kubernetes => {
                Err(BackendError::Unsupported(format!("Berth has no {} adapter yet", cluster.spec.kind.as_str())))
            }
        }
    }
}
