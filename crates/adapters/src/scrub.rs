//! Backends' errors never carry their credential.
//!
//! A backend's error often quotes what the backend answered, and a backend (or a proxy,
//! or a mistyped endpoint) may answer with the request it was sent, headers and all: the
//! token in them would reach the cluster's status, which every caller reads, and the logs.
//! [`Scrubbed`] wraps every backend the registry builds and replaces any piece of the
//! credential in an error's text before the error leaves the adapter.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::cluster::ClusterKind;

use futures_util::StreamExt;

use crate::backend::{LogRequest, LogStream};
use crate::{BackendError, ClusterBackend, Inventory, JobKey, JobRequest, JobStatus};

/// What stands in for a piece of a credential.
const HIDDEN: &str = "<credential>";

/// A backend whose errors are scrubbed of its credential.
pub struct Scrubbed {
    inner: Arc<dyn ClusterBackend>,
    /// The credential and each long piece of it (a kubeconfig's token, key or certificate
    /// data), longest first.
    pieces: Vec<String>,
}

impl Scrubbed {
    pub fn new(inner: Arc<dyn ClusterBackend>, secret: Option<&str>) -> Self {
        Self { inner, pieces: secret.map(pieces).unwrap_or_default() }
    }

    fn clean(&self, e: BackendError) -> BackendError {
        scrub(&self.pieces, e)
    }
}

/// `e` with every piece of the credential replaced.
fn scrub(pieces: &[String], e: BackendError) -> BackendError {
    let text = |mut s: String| {
        for piece in pieces {
            if s.contains(piece.as_str()) {
                s = s.replace(piece.as_str(), HIDDEN);
            }
        }
        s
    };
    match e {
        BackendError::Unreachable(m) => BackendError::Unreachable(text(m)),
        BackendError::Rejected(m) => BackendError::Rejected(text(m)),
        BackendError::Unsupported(m) => BackendError::Unsupported(text(m)),
    }
}

/// The pieces of a credential worth hiding: the whole text, and every run of 8 or more
/// characters between separators (so a token inside a kubeconfig is found on its own).
fn pieces(secret: &str) -> Vec<String> {
    let secret = secret.trim();
    let separators = |c: char| c.is_whitespace() || matches!(c, ':' | '"' | '\'' | ',' | '{' | '}' | '[' | ']' | '=');
    let mut pieces: Vec<String> = secret
        .split(separators)
        .filter(|p| p.chars().count() >= 8)
        .chain((secret.chars().count() >= 4).then_some(secret))
        .map(str::to_owned)
        .collect();
    pieces.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    pieces.dedup();
    pieces
}

#[async_trait]
impl ClusterBackend for Scrubbed {
    fn kind(&self) -> ClusterKind {
        self.inner.kind()
    }

    fn api_in_use(&self) -> Option<String> {
        self.inner.api_in_use()
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.inner.health().await.map_err(|e| self.clean(e))
    }

    async fn inventory(&self) -> Result<Inventory, BackendError> {
        self.inner.inventory().await.map_err(|e| self.clean(e))
    }

    async fn submit(&self, job: &JobRequest) -> Result<JobStatus, BackendError> {
        // A refusal that quotes the job (its environment) would show the job's own tokens
        // in the workload's status.
        let tokens: Vec<String> =
            job.api.iter().map(|api| api.token.clone()).chain(job.notebook_token.clone()).collect();
        self.inner.submit(job).await.map_err(|e| scrub(&tokens, self.clean(e)))
    }

    async fn jobs(&self) -> Result<Vec<JobStatus>, BackendError> {
        self.inner.jobs().await.map_err(|e| self.clean(e))
    }

    async fn jobs_recent(&self) -> Result<Vec<JobStatus>, BackendError> {
        self.inner.jobs_recent().await.map_err(|e| self.clean(e))
    }

    async fn job(&self, key: JobKey) -> Result<Option<JobStatus>, BackendError> {
        self.inner.job(key).await.map_err(|e| self.clean(e))
    }

    async fn cancel(&self, key: JobKey, grace: Duration) -> Result<(), BackendError> {
        self.inner.cancel(key, grace).await.map_err(|e| self.clean(e))
    }

    async fn load(&self, key: JobKey, query: Option<&str>) -> Result<Option<f64>, BackendError> {
        self.inner.load(key, query).await.map_err(|e| self.clean(e))
    }

    async fn scale(&self, key: JobKey, replicas: u32) -> Result<(), BackendError> {
        self.inner.scale(key, replicas).await.map_err(|e| self.clean(e))
    }

    async fn logs(self: Arc<Self>, key: JobKey, request: LogRequest) -> Result<LogStream, BackendError> {
        let stream = self.inner.clone().logs(key, request).await.map_err(|e| self.clean(e))?;
        let pieces = self.pieces.clone();
        Ok(stream.map(move |chunk| chunk.map_err(|e| scrub(&pieces, e))).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_inside_a_kubeconfig_is_a_piece_of_its_own() {
        let kubeconfig = "users: [{name: u, user: {token: kube-bearer-TOPSECRET-abc}}]";
        let found = pieces(kubeconfig);
        assert!(found.contains(&"kube-bearer-TOPSECRET-abc".to_owned()), "{found:?}");
        assert!(!found.iter().any(|p| p == "users" || p == "name"), "short words are not secrets: {found:?}");
    }

    /// A backend that refuses every job quoting its environment, as an API server's
    /// validation error may.
    struct Quoting;

    #[async_trait]
    impl ClusterBackend for Quoting {
        fn kind(&self) -> ClusterKind {
            ClusterKind::Sim
        }
        async fn health(&self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn inventory(&self) -> Result<Inventory, BackendError> {
            Err(BackendError::Unsupported("none".into()))
        }
        async fn submit(&self, job: &JobRequest) -> Result<JobStatus, BackendError> {
            Err(BackendError::Rejected(format!("invalid pod: env {:?}", job.berth_environment())))
        }
        async fn jobs(&self) -> Result<Vec<JobStatus>, BackendError> {
            Ok(Vec::new())
        }
        async fn job(&self, _: JobKey) -> Result<Option<JobStatus>, BackendError> {
            Ok(None)
        }
        async fn cancel(&self, _: JobKey, _: Duration) -> Result<(), BackendError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_refused_job_does_not_show_its_own_token() {
        let backend = Scrubbed::new(Arc::new(Quoting), Some("cluster-credential"));
        let job: JobRequest = serde_json::from_value(serde_json::json!({
            "key": {"workload": uuid::Uuid::nil(), "attempt": 0}, "team": "t", "workload": "w",
            "kind": "training", "flavor": "h100", "tasks": 1, "gpus_per_task": 100, "cpus_per_task": null,
            "memory_mib_per_task": null, "nodes": [], "run": {}, "max_runtime_seconds": null,
            "sim_duration_seconds": null, "resume": false, "grace_seconds": 30,
        }))
        .unwrap();
        let job = JobRequest {
            api: Some(crate::JobApi { url: "http://berth".into(), token: "eyJ.job-token.sig".into() }),
            ..job
        };
        let BackendError::Rejected(why) = backend.submit(&job).await.unwrap_err() else { panic!("rejected") };
        assert!(why.contains("BERTH_WORKLOAD") && !why.contains("eyJ.job-token.sig"), "{why}");
        assert!(why.contains(HIDDEN), "{why}");
    }
}
