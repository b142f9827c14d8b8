//! The whole simulated cluster behind one lock: the object store plus what the built-in
//! controllers remember between passes.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Notify;

use crate::config::Config;
use crate::controllers::jobs::JobTrack;
use crate::controllers::kubelet::PodClock;
use crate::nodes;
use crate::operations::Target;
use crate::resources;
use crate::store::Store;

/// The simulated cluster.
pub(crate) struct Cluster {
    /// Objects, resourceVersions and change history.
    pub store: Store,
    /// How long containers run without FAKE_RUN_SECONDS.
    pub default_run_seconds: f64,
    /// Per pod uid: when the fake kubelet bound, started and was asked to stop it.
    pub pod_clocks: HashMap<String, PodClock>,
    /// Per job uid: which pods the job controller has counted.
    pub job_tracks: HashMap<String, JobTrack>,
    /// Last allocated address suffix, for pod IPs and service cluster IPs.
    last_address: u32,
}

impl Cluster {
    /// A cluster with namespace `default` and the configured nodes; `wake` is notified on every
    /// change.
    pub fn new(config: &Config, wake: Arc<Notify>) -> Self {
        let mut cluster = Self {
            store: Store::new(config.history_limit, wake),
            default_run_seconds: config.default_run_seconds,
            pod_clocks: HashMap::new(),
            job_tracks: HashMap::new(),
            last_address: 0,
        };
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        if let Err(err) = cluster.create(resources::NAMESPACES, "", namespace) {
            tracing::error!(message = %err.message, "creating namespace default");
        }
        for node in &config.nodes {
            cluster.put_node(node);
        }
        cluster
    }

    /// Creates or replaces the Node object of a fake node.
    pub fn put_node(&mut self, node: &crate::FakeNode) {
        let existing = self.store.get(resources::NODES.plural, "", &node.name);
        let address = match existing.and_then(|n| n["status"]["addresses"][0]["address"].as_str()) {
            Some(address) => address.to_string(),
            None => self.next_address("10.0"),
        };
        let obj = nodes::node_object(node, &address);
        let result = match self.store.get(resources::NODES.plural, "", &node.name) {
            Some(_) => self.replace(resources::NODES, "", &node.name, obj.clone(), Target::Object).and_then(|_| {
                // Node status only changes through the status subresource.
                self.replace(resources::NODES, "", &node.name, obj, Target::Status)
            }),
            None => self.create(resources::NODES, "", obj),
        };
        if let Err(err) = result {
            tracing::error!(node = %node.name, message = %err.message, "adding node");
        }
    }

    /// A fresh address in `prefix` (e.g. `10.244`), unique within the cluster.
    pub fn next_address(&mut self, prefix: &str) -> String {
        self.last_address += 1;
        format!("{prefix}.{}.{}", self.last_address / 250, self.last_address % 250 + 1)
    }
}
