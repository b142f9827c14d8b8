//! The contract between the controllers and a backend.

use std::time::Duration;

use std::sync::Arc;

use async_trait::async_trait;
use berth_core::cluster::ClusterKind;
use berth_core::workload::{Run, WorkloadKind};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The key every backend job carries (as its name, comment or label): the workload's uid
/// and the attempt. A retry finds the job it already made by this key, and a job whose key
/// matches no live workload is an orphan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobKey {
    pub workload: Uuid,
    pub attempt: u32,
}

impl JobKey {
    const PREFIX: &str = "berth-";

    /// The job name: `berth-{uid}-{attempt}`.
    pub fn name(&self) -> String {
        format!("{}{}-{}", Self::PREFIX, self.workload, self.attempt)
    }

    /// Reads a job name back; `None` for jobs Berth did not make.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(Self::PREFIX)?;
        let (uid, attempt) = rest.rsplit_once('-')?;
        Some(Self { workload: uid.parse().ok()?, attempt: attempt.parse().ok()? })
    }
}

impl std::fmt::Display for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// What a backend is asked to run: one admitted workload, on the flavor and nodes the
/// scheduler chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRequest {
    pub key: JobKey,
    pub team: String,
    pub workload: String,
    pub kind: WorkloadKind,
    pub flavor: String,
    pub tasks: u32,
    /// Per task, in hundredths of a GPU (100 = one GPU).
    pub gpus_per_task: u32,
    pub cpus_per_task: Option<f64>,
    pub memory_mib_per_task: Option<u64>,
    /// One node per task, as the scheduler placed them; a backend that places jobs itself
    /// may treat this as a hint.
    pub nodes: Vec<String>,
    pub run: Run,
    pub max_runtime_seconds: Option<u64>,
    /// How long a simulated cluster runs it (simulated seconds).
    pub sim_duration_seconds: Option<f64>,
    /// A later attempt of resumable work (after a preemption or a lost job): it should
    /// resume from its last checkpoint.
    pub resume: bool,
    /// How long it will have to checkpoint once told to stop (Kubernetes: its pods'
    /// termination grace period, which the kubelet would otherwise cut to 30 s).
    pub grace_seconds: u32,
    /// How the job reaches Berth's API to acknowledge its checkpoint: never serialized (a
    /// journal or a log line must not carry the token).
    #[serde(skip)]
    pub api: Option<JobApi>,
    /// A notebook's access token (Jupyter reads `JUPYTER_TOKEN`); never serialized.
    #[serde(skip)]
    pub notebook_token: Option<String>,
    /// The inference service the job serves (its own workload, or the one it is a replica
    /// of): on Kubernetes every replica's pods carry it, and the service's Service selects
    /// them by it.
    #[serde(default)]
    pub service: Option<Uuid>,
    /// How a simulated cluster makes a service's load: `spec.sim.load`.
    #[serde(default)]
    pub sim_load: Vec<berth_core::workload::LoadStep>,
}

/// Berth's API as a job is told of it: the URL it answers at and the job's own token
/// (good for acknowledging this attempt's checkpoint, nothing else).
#[derive(Clone, PartialEq)]
pub struct JobApi {
    pub url: String,
    pub token: String,
}

impl std::fmt::Debug for JobApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobApi").field("url", &self.url).finish_non_exhaustive()
    }
}

impl JobRequest {
    /// What Berth tells the job about itself in its environment: `BERTH_TEAM`,
    /// `BERTH_WORKLOAD`, `BERTH_WORKLOAD_UID`, `BERTH_ATTEMPT`; for a resumed attempt
    /// `BERTH_RESUME=1` and `BERTH_PREVIOUS_ATTEMPT`; where Berth's API is known,
    /// `BERTH_API_URL`, `BERTH_JOB_TOKEN` and `BERTH_CHECKPOINTED_URL` (the call that says the
    /// checkpoint is written) and `BERTH_ACTIVITY_URL` (the call a notebook makes while it
    /// is used); for a notebook, `JUPYTER_TOKEN`, the token that opens it.
    /// What the job's tasks run with: the workload's `run.env`, Berth's variables over it.
    pub fn environment(&self) -> std::collections::BTreeMap<String, String> {
        let mut env = self.run.env.clone();
        env.extend(self.berth_environment());
        env
    }

    pub fn berth_environment(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("BERTH_TEAM".to_owned(), self.team.clone()),
            ("BERTH_WORKLOAD".to_owned(), self.workload.clone()),
            ("BERTH_WORKLOAD_UID".to_owned(), self.key.workload.to_string()),
            ("BERTH_ATTEMPT".to_owned(), self.key.attempt.to_string()),
        ];
        if self.resume {
            env.push(("BERTH_RESUME".to_owned(), "1".to_owned()));
            env.push(("BERTH_PREVIOUS_ATTEMPT".to_owned(), self.key.attempt.saturating_sub(1).to_string()));
        }
        if let Some(api) = &self.api {
            let url = api.url.trim_end_matches('/');
            let call = |verb: &str| format!("{url}/api/v1/teams/{}/workloads/{}/{verb}", self.team, self.workload);
            env.push(("BERTH_API_URL".to_owned(), url.to_owned()));
            env.push(("BERTH_JOB_TOKEN".to_owned(), api.token.clone()));
            env.push(("BERTH_CHECKPOINTED_URL".to_owned(), call("checkpointed")));
            env.push(("BERTH_ACTIVITY_URL".to_owned(), call("activity")));
        }
        if let Some(token) = &self.notebook_token {
            env.push(("JUPYTER_TOKEN".to_owned(), token.clone()));
        }
        env
    }
}

/// A backend job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// Accepted, waiting for resources on the backend.
    Queued,
    Running,
    /// Never started: the backend could not run its tasks on the nodes Berth chose within
    /// the cluster's gang timeout (the cluster changed under Berth's placement). It holds no
    /// GPUs; the controllers requeue the workload, and the job, now of an old attempt, is
    /// withdrawn as an orphan.
    Unplaceable,
    Succeeded,
    Failed,
    /// Ended by its time limit (`max_runtime_seconds`): Slurm's `TIMEOUT`, a Kubernetes
    /// Job's `DeadlineExceeded`.
    TimedOut,
    Cancelled,
}

impl JobState {
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::TimedOut | Self::Cancelled)
    }
}

/// One of Berth's jobs as the backend sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub key: JobKey,
    /// The backend's own id for the job (Slurm job id, Kubernetes Job name, sim number).
    pub job_id: String,
    pub state: JobState,
    pub exit_code: Option<i32>,
    /// Why it failed or was cancelled, in the backend's words.
    pub reason: Option<String>,
    pub submitted_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// A cancel was requested and the grace period is running.
    pub cancelling: bool,
    /// Where the job writes its output on the cluster (Slurm: its standard output file),
    /// when the backend knows.
    #[serde(default)]
    pub output: Option<String>,
    /// Where its service answers (inference, notebook), when the backend serves one.
    #[serde(default)]
    pub url: Option<String>,
}

/// The nodes of a cluster, as the backend reports them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub nodes: Vec<InventoryNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InventoryNode {
    pub name: String,
    /// Berth's flavor name for the node's GPUs; `None` for nodes of no known flavor.
    pub flavor: Option<String>,
    pub gpus: u32,
    /// GPUs in use, in hundredths, by any job (Berth's or not).
    pub gpus_used: u32,
    /// Of those, the hundredths held by jobs Berth did not start.
    pub gpus_used_outside_berth: u32,
    pub cpus: u32,
    pub memory_mib: u64,
    /// Topology block (NVLink domain, IB switch).
    pub block: Option<String>,
    /// False for a node that is down, drained or failed.
    pub schedulable: bool,
}

/// Why a backend call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend did not answer (down, network, timeout). Worth retrying later.
    #[error("backend unreachable: {0}")]
    Unreachable(String),
    /// The backend refused the request; retrying the same request will not help.
    #[error("backend rejected the request: {0}")]
    Rejected(String),
    /// Berth cannot drive this kind of backend (yet).
    #[error("{0}")]
    Unsupported(String),
}

/// What a caller wants of a job's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRequest {
    /// Which task (0-based: a training job's rank, a serving job's replica).
    pub task: u32,
    /// Only the last this many lines.
    pub tail: Option<u32>,
    /// Keep the stream open and send each new line as it is printed, until the task ends.
    pub follow: bool,
}

/// A job's output as it arrives: chunks of whole lines.
pub type LogStream = futures_util::stream::BoxStream<'static, Result<String, BackendError>>;

/// The last `tail` lines of `lines` (all when `None`), as one text.
pub fn last_lines(lines: &[String], tail: Option<u32>) -> String {
    let skip = tail.map_or(0, |t| lines.len().saturating_sub(t as usize));
    lines[skip..].concat()
}

/// What every backend implements.
///
/// # Guarantees an implementation gives
/// - `submit` of a key the backend has already seen returns that job instead of making a
///   second one. A backend that cannot find a key cheaply (Slurm) checks only the keys it
///   has seen itself, so a caller that may have submitted the key from an earlier process
///   looks it up with `job` or `jobs` first (the dispatcher's intents say when).
/// - `jobs` lists every job carrying a Berth key that the backend still knows, finished
///   ones included for as long as the backend keeps them.
/// - `cancel` of a finished or unknown job succeeds and does nothing; a second cancel does
///   not extend the grace period.
#[async_trait]
pub trait ClusterBackend: Send + Sync {
    fn kind(&self) -> ClusterKind;

    /// The API the backend speaks with its cluster, once known ("slurmrestd v0.0.45,
    /// Slurm 26.05.5"), for the cluster's status.
    fn api_in_use(&self) -> Option<String> {
        None
    }

    /// Whether the backend answers at all.
    async fn health(&self) -> Result<(), BackendError>;

    async fn inventory(&self) -> Result<Inventory, BackendError>;

    async fn submit(&self, job: &JobRequest) -> Result<JobStatus, BackendError>;

    async fn jobs(&self) -> Result<Vec<JobStatus>, BackendError>;

    /// Like [`jobs`](Self::jobs), but it may answer from a listing made a moment ago by a
    /// backend whose listing is expensive (Slurm); every job this backend object submitted
    /// since is still included, so a job never looks vanished. For callers that follow
    /// state (status sync, preemption, orphans); a caller that must know whether a job
    /// exists right now uses `jobs` or `job`.
    async fn jobs_recent(&self) -> Result<Vec<JobStatus>, BackendError> {
        self.jobs().await
    }

    async fn job(&self, key: JobKey) -> Result<Option<JobStatus>, BackendError>;

    /// Asks the job to stop; it gets `grace` to checkpoint before it is killed. A cancel
    /// with no grace stops it now, even while an earlier grace period runs (its checkpoint
    /// was acknowledged); another cancel with a grace never extends one.
    async fn cancel(&self, key: JobKey, grace: Duration) -> Result<(), BackendError>;

    /// What a task of the job printed: all of it, or its last `tail` lines; with `follow`,
    /// the stream goes on with each new line until the task ends. Backends whose jobs write
    /// to files on the cluster (Slurm) have no such call: their output is read from the file.
    async fn logs(self: Arc<Self>, key: JobKey, request: LogRequest) -> Result<LogStream, BackendError> {
        let _ = request;
        Err(BackendError::Unsupported(format!("{} clusters serve no logs of job {key}", self.kind().as_str())))
    }

    /// The load of the inference service the job runs, as its autoscaler reads it: the
    /// value of `query` from the cluster's metrics source (a simulated cluster follows the
    /// job's `sim_load` and needs no query); `None` while there is none.
    async fn load(&self, key: JobKey, query: Option<&str>) -> Result<Option<f64>, BackendError> {
        let _ = query;
        Err(BackendError::Unsupported(format!("{} clusters read no load of job {key}", self.kind().as_str())))
    }

    /// Sets how many replicas a serving job (inference, notebook) runs.
    async fn scale(&self, key: JobKey, replicas: u32) -> Result<(), BackendError> {
        let _ = replicas;
        Err(BackendError::Unsupported(format!("{} clusters cannot scale job {key}", self.kind().as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_keys_round_trip_through_their_names() {
        let key = JobKey { workload: Uuid::now_v7(), attempt: 3 };
        assert_eq!(JobKey::parse(&key.name()), Some(key));
        assert_eq!(JobKey::parse("train-job-1"), None);
        assert_eq!(JobKey::parse("berth-not-a-uuid-1"), None);
    }
}
