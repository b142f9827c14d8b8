//! The [`TestApiServer`] handle: starting the server and the controllers, and the hooks tests use
//! to inspect and disturb the cluster.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::{Config, FakeNode};
use crate::resources;
use crate::shared::Shared;
use crate::{controllers, http, kubeconfig};

/// A running test Kubernetes API server with its built-in controllers. Dropping it stops the
/// server and its background tasks.
pub struct TestApiServer {
    shared: Arc<Shared>,
    controllers: JoinHandle<()>,
}

impl TestApiServer {
    /// Starts a server on `127.0.0.1` with a free port.
    pub async fn start(config: Config) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), config).await
    }

    /// Starts a server on `addr`.
    pub async fn start_on(addr: SocketAddr, config: Config) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let shared = Arc::new(Shared::new(&config, listener.local_addr()?));
        let mut shutdown = shared.shutdown.subscribe();
        let app = http::router(shared.clone());
        tokio::spawn(async move {
            let stopped = async move {
                // Either a shutdown signal or the sender's drop ends the server.
                let _ = shutdown.wait_for(|stop| *stop).await;
            };
            if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
                tracing::error!(%err, "test API server stopped");
            }
        });
        let controllers = tokio::spawn(controllers::run(shared.clone()));
        tracing::info!(url = %format!("http://{}", shared.address), "test Kubernetes API server started");
        Ok(Self { shared, controllers })
    }

    /// The server's base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.address)
    }

    /// A kubeconfig YAML for the server: its URL, the token (if any) and one current context.
    pub fn kubeconfig(&self) -> String {
        kubeconfig::render(&self.url(), self.shared.token.as_deref())
    }

    /// Ends every open watch response stream now, as a dropped connection would.
    pub fn drop_watches(&self) {
        self.shared.watch_epoch.send_modify(|epoch| *epoch += 1);
    }

    /// Hangs the server (`true`): requests are taken but not answered, as by an API server
    /// that stopped without closing its connections; `false` answers them and goes on.
    pub fn hang(&self, hung: bool) {
        self.shared.hung.send_replace(hung);
    }

    /// Forgets all retained events: a watch from any resourceVersion older than the current one
    /// gets 410 Gone.
    pub fn compact(&self) {
        self.shared.lock().store.compact();
    }

    /// Evicts a pod: phase Failed, reason `Evicted`, condition DisruptionTarget=True
    /// (reason EvictionByEvictionAPI).
    pub fn evict(&self, namespace: &str, pod: &str) {
        self.shared.lock().evict(namespace, pod);
    }

    /// Loses a node: Ready=False (reason NodeStatusUnknown); its running pods fail with reason
    /// `NodeLost` and condition DisruptionTarget=True.
    pub fn lose_node(&self, node: &str) {
        self.shared.lock().lose_node(node);
    }

    /// Adds a node (or replaces the node of that name).
    pub fn add_node(&self, node: FakeNode) {
        self.shared.lock().put_node(&node);
    }

    /// Removes a node; pods bound to it fail and are deleted.
    pub fn remove_node(&self, name: &str) {
        self.shared.lock().store.remove(resources::NODES.plural, "", name);
    }

    /// The current objects of a resource (`pods`, `jobs`, `deployments`, `services`,
    /// `namespaces`, `nodes`, `jobsets`) in all namespaces; empty for an unknown plural.
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        match resources::by_plural(plural) {
            Some(rt) => self.shared.lock().store.snapshot(rt.plural),
            None => Vec::new(),
        }
    }

    /// How many requests were served with `method` on `plural`; `watch` selects watch requests
    /// (e.g. `requests("GET", "pods", false)` counts list and get calls on pods). Non-resource
    /// requests count under their path, e.g. `/version`.
    pub fn requests(&self, method: &str, plural: &str, watch: bool) -> u64 {
        self.shared.counted(method, plural, watch)
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        self.controllers.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_can_be_shared_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TestApiServer>();
    }
}
