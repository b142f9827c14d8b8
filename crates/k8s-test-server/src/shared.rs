//! State shared by the HTTP handlers, the watches, the controllers and the [`TestApiServer`](crate::TestApiServer) handle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::sync::{Notify, watch};

use crate::cluster::Cluster;
use crate::config::Config;
use crate::status::ApiError;

/// A request counter key: method, resource plural (the path for non-resource requests), watch.
type RequestKey = (String, String, bool);

/// Shared server state.
pub(crate) struct Shared {
    cluster: Mutex<Cluster>,
    /// Notified on every store change (wakes the controllers).
    pub wake: Arc<Notify>,
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// Service-account tokens issued by TokenRequest: token → (namespace, name). Accepted
    /// as long as the account exists (when a token is required at all).
    issued: Mutex<HashMap<String, (String, String)>>,
    /// Whether the JobSet resource is served.
    pub serve_jobsets: bool,
    /// Period of watch bookmarks.
    pub bookmark_interval: Duration,
    /// The address the server listens on.
    pub address: SocketAddr,
    requests: Mutex<HashMap<RequestKey, u64>>,
    /// Bumped to end every open watch.
    pub watch_epoch: watch::Sender<u64>,
    /// Set to true when the server shuts down.
    pub shutdown: watch::Sender<bool>,
    /// While true, requests get no answer (a hung API server: connections open, nothing
    /// said); those waiting are answered once it is false again.
    pub hung: watch::Sender<bool>,
}

impl Shared {
    /// State for a server listening on `address`.
    pub fn new(config: &Config, address: SocketAddr) -> Self {
        let wake = Arc::new(Notify::new());
        Self {
            cluster: Mutex::new(Cluster::new(config, wake.clone())),
            wake,
            token: config.token.clone(),
            issued: Mutex::new(HashMap::new()),
            serve_jobsets: config.serve_jobsets,
            bookmark_interval: config.bookmark_interval,
            address,
            requests: Mutex::new(HashMap::new()),
            watch_epoch: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            hung: watch::Sender::new(false),
        }
    }

    /// Locks the cluster (a panicked holder does not poison it for everyone else).
    pub fn lock(&self) -> MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one request.
    pub fn count(&self, method: &str, plural: &str, watch: bool) {
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        *requests.entry((method.to_ascii_uppercase(), plural.to_string(), watch)).or_default() += 1;
    }

    /// How many requests were counted under a key.
    pub fn counted(&self, method: &str, plural: &str, watch: bool) -> u64 {
        let requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        requests.get(&(method.to_ascii_uppercase(), plural.to_string(), watch)).copied().unwrap_or(0)
    }

    /// Checks the bearer token when one is required.
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let presented = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if presented == Some(token.as_str()) {
            return Ok(());
        }
        let account =
            presented.and_then(|p| self.issued.lock().unwrap_or_else(PoisonError::into_inner).get(p).cloned());
        match account {
            Some((namespace, name))
                if self.lock().get(crate::resources::SERVICE_ACCOUNTS, &namespace, &name).is_ok() =>
            {
                Ok(())
            }
            _ => Err(ApiError::unauthorized()),
        }
    }

    /// A new token for service account `namespace/name`.
    pub fn issue_token(&self, namespace: &str, name: &str) -> String {
        let token = format!("sa.{namespace}.{name}.{}", uuid::Uuid::new_v4().simple());
        self.issued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), (namespace.to_owned(), name.to_owned()));
        token
    }
}
