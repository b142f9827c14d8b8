//! The Slurm backend: drives a Slurm cluster through slurmrestd over HTTP, as the user in
//! the cluster's `spec.slurm`, with the JWT its `credentials_ref` names
//! (`X-SLURM-USER-NAME` / `X-SLURM-USER-TOKEN`).
//!
//! - Jobs are named by their [`JobKey`] (`berth-{uid}-{attempt}`), and `jobs` lists only
//!   jobs with such a name. Slurm cannot look a job up by name without listing every job,
//!   so `submit` checks only the keys it has seen; the dispatcher looks a key up first
//!   whenever an earlier submit may have reached Slurm (its dispatch intents).
//! - Cancel with a grace period: the first call writes the deadline into the job's comment
//!   (`cancel-by=<epoch s>`) and sends SIGTERM; a call after the deadline cancels the job
//!   for good (Slurm sends SIGTERM, then SIGKILL after its `KillWait`). The deadline lives
//!   in Slurm, so a restarted berthd neither forgets it nor extends it.
//! - A partition maps to a flavor; a node's GPUs are the `gpu` GRES of the partition's
//!   type; GPUs held by jobs Berth did not start are reported so the scheduler leaves them.
//! - Failures: a request Slurm refuses (`errors[]` with a job or request error) is
//!   [`BackendError::Rejected`]; no answer, a timeout, a 5xx without such an error or
//!   refused credentials are [`BackendError::Unreachable`] (the cluster turns Degraded, then
//!   Unreachable). The token is never logged or put in an error.
//!
//! - API versions: slurmrestd serves one or more data-parser versions (`v0.0.38` on Slurm
//!   22.05, `v0.0.40`–`v0.0.42` on 24.11, `v0.0.42`–`v0.0.45` on 26.05). The backend
//!   uses the newest of [`DIALECTS`] the cluster offers (or the one `spec.slurm.api_version`
//!   pins), found by asking each for `ping`, newest first; a 404 from a known path later
//!   (Slurm upgraded under Berth) makes it look again. A cluster that offers none of them
//!   is [`BackendError::Unsupported`], with what it offers and what Berth speaks.
//!
//! Everything specific to one slurmrestd API version lives in its module ([`v0_0_38`],
//! [`v0_0_40`], [`v0_0_41`]), behind [`wire::Dialect`].

#[cfg(feature = "dev")]
pub mod dev;
mod v0_0_38;
mod v0_0_40;
mod v0_0_41;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::cluster::{ClusterKind, ClusterSpec, SlurmPartition};
use berth_core::workload::Run;
use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use self::v0_0_38::V0038;
use self::v0_0_40::V0040;
use self::v0_0_41::V0041;
use self::wire::{ApiError, Dialect, Gpus, Job, Submission, TimeLimit, describe, errors};
use crate::backend::{BackendError, ClusterBackend, Inventory, InventoryNode, JobKey, JobRequest, JobState, JobStatus};

/// How long one call to slurmrestd may take (slurmrestd answers after about 9 s when
/// slurmctld is down).
const TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The mark a cancel leaves in the job's comment.
const CANCEL_BY: &str = "cancel-by=";

/// Every slurmrestd API version Berth speaks, newest first. Adding a version is one line
/// here (and a module when its JSON differs from the one before).
pub static DIALECTS: [&dyn Dialect; 7] =
    [&V0041("v0.0.45"), &V0041("v0.0.44"), &V0041("v0.0.43"), &V0041("v0.0.42"), &V0041("v0.0.41"), &V0040, &V0038];

/// A Slurm cluster behind slurmrestd.
pub struct SlurmCluster {
    endpoint: String,
    user: String,
    token: Token,
    /// The version `spec.slurm.api_version` pins (`None`: the newest the cluster offers).
    pinned: Option<String>,
    /// The version in use, once found; cleared when the cluster stops serving it.
    api: Mutex<Option<&'static dyn Dialect>>,
    /// "slurmrestd v0.0.45, Slurm 26.05.5": what was found, for the cluster's status.
    found: Mutex<Option<String>>,
    partitions: Vec<SlurmPartition>,
    working_directory: String,
    http: reqwest::Client,
    /// Slurm job ids by key, as last seen (ids never change; a stale entry is checked).
    ids: Mutex<HashMap<JobKey, u64>>,
    /// The last full listing of slurmctld's jobs (one listing at a time).
    listing: tokio::sync::Mutex<Option<Listing>>,
    /// Jobs this backend submitted, with when, so that a reused listing still shows them.
    submitted: Mutex<Vec<(Instant, JobKey, u64)>>,
    /// The partitions as last read (by the inventory, or a submit), with when: a submit
    /// without a runtime limit reads its partition's MaxTime there while it is younger than
    /// [`PARTITIONS_MAX_AGE`], instead of asking slurmrestd each time.
    read_partitions: Mutex<Option<(Instant, Vec<wire::Partition>)>>,
}

/// A full listing of slurmctld's jobs. Listing is Slurm's most expensive call (every job
/// slurmctld remembers, finished ones included, under its job lock), so callers that only
/// follow state reuse one until it is [`LISTING_REUSE`] times as old as it took to make,
/// which keeps listing to a tenth of the time however large the cluster. While this
/// backend is submitting a burst (its last submit less than [`BURST_GAP`] ago) the listing
/// is reused up to [`LISTING_MAX_AGE`]: a fresh one would stall the very submits that are
/// waiting for that lock.
struct Listing {
    started: Instant,
    took: Duration,
    jobs: Vec<Job>,
}

const LISTING_REUSE: u32 = 9;
const LISTING_MAX_AGE: Duration = Duration::from_secs(15);
const BURST_GAP: Duration = Duration::from_secs(1);
/// How long a partition's MaxTime, once read, is used for submits (a change by Slurm's
/// admin reaches new jobs within it; the inventory reads partitions every few seconds).
const PARTITIONS_MAX_AGE: Duration = Duration::from_secs(30);

/// The JWT, kept out of `Debug` and logs.
struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl SlurmCluster {
    /// A backend for a `slurm` cluster's spec, with its token.
    ///
    /// # Errors
    /// [`BackendError::Rejected`] when the spec has no endpoint or Slurm settings;
    /// [`BackendError::Unreachable`] when the token could not be sent as a header (the
    /// message never quotes it).
    pub fn new(spec: &ClusterSpec, token: String) -> Result<Self, BackendError> {
        let endpoint = spec.endpoint.as_deref().ok_or_else(|| BackendError::Rejected("no endpoint".into()))?;
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(BackendError::Unreachable(
                "the cluster's credential is not a usable slurmrestd token: it must be printable ASCII without \
                 spaces (its content is not shown)"
                    .into(),
            ));
        }
        let slurm = spec.slurm.as_ref().ok_or_else(|| BackendError::Rejected("no spec.slurm".into()))?;
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| BackendError::Rejected(format!("HTTP client: {e}")))?;
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            user: slurm.user.clone(),
            token: Token(token),
            pinned: (slurm.api_version != berth_core::cluster::SLURM_API_AUTO).then(|| slurm.api_version.clone()),
            api: Mutex::new(None),
            found: Mutex::new(None),
            partitions: slurm.partitions.clone(),
            working_directory: slurm.working_directory.clone(),
            http,
            ids: Mutex::new(HashMap::new()),
            listing: tokio::sync::Mutex::new(None),
            submitted: Mutex::new(Vec::new()),
            read_partitions: Mutex::new(None),
        })
    }

    /// The API version to speak, found on first use.
    async fn api(&self) -> Result<&'static dyn Dialect, BackendError> {
        if let Some(dialect) = *self.api.lock().expect("api lock") {
            return Ok(dialect);
        }
        for dialect in DIALECTS.iter().filter(|d| self.pinned.as_deref().is_none_or(|p| p == d.version())) {
            let (status, body) = self.send(Method::GET, &format!("/slurm/{}/ping", dialect.version()), None).await?;
            if status == StatusCode::NOT_FOUND {
                continue;
            }
            if !status.is_success() {
                return Err(failure(status, &errors(&body)));
            }
            let release = wire::release(&body).map(|r| format!(", Slurm {r}")).unwrap_or_default();
            tracing::info!(endpoint = %self.endpoint, version = dialect.version(), "slurmrestd API found");
            *self.found.lock().expect("found lock") = Some(format!("slurmrestd {}{release}", dialect.version()));
            *self.api.lock().expect("api lock") = Some(*dialect);
            return Ok(*dialect);
        }
        let offered = self.offered().await;
        let speaks: Vec<&str> = DIALECTS.iter().map(|d| d.version()).collect();
        let wanted = match &self.pinned {
            Some(p) => format!("spec.slurm.api_version pins {p}"),
            None => format!("Berth speaks {}", speaks.join(", ")),
        };
        Err(BackendError::Unsupported(format!(
            "slurmrestd at {} offers no API version Berth can use: it offers {}; {wanted}",
            self.endpoint,
            if offered.is_empty() { "none it names in /openapi/v3".to_owned() } else { offered.join(", ") }
        )))
    }

    /// The data-parser versions slurmrestd's OpenAPI document has paths for.
    async fn offered(&self) -> Vec<String> {
        let Ok((status, body)) = self.send(Method::GET, "/openapi/v3", None).await else { return Vec::new() };
        let Some(paths) = status
            .is_success()
            .then(|| serde_json::from_slice::<Value>(&body).ok())
            .flatten()
            .and_then(|d| d["paths"].as_object().map(|p| p.keys().cloned().collect::<Vec<_>>()))
        else {
            return Vec::new();
        };
        let mut versions: Vec<String> = paths
            .iter()
            .filter_map(|p| p.strip_prefix("/slurm/")?.split('/').next().map(str::to_owned))
            .filter(|v| v.starts_with('v'))
            .collect();
        versions.sort_unstable();
        versions.dedup();
        versions.reverse();
        versions
    }

    /// One call on a path of the API in use (`jobs`, `job/7`…); any 2xx answer's body,
    /// else the error its status and `errors[]` call for.
    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Vec<u8>, BackendError> {
        let api = self.api().await?;
        let (status, bytes) = self.send(method, &format!("/slurm/{}/{path}", api.version()), body).await?;
        if status.is_success() {
            return Ok(bytes);
        }
        let errors = errors(&bytes);
        if status == StatusCode::NOT_FOUND && errors.is_empty() {
            // The version is no longer served (Slurm was upgraded): find it again next time.
            *self.api.lock().expect("api lock") = None;
            return Err(BackendError::Unreachable(format!(
                "slurmrestd no longer serves API {} (404 Not Found); the next call looks for the version it offers",
                api.version()
            )));
        }
        Err(failure(status, &errors))
    }

    /// One request; its status and body.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Vec<u8>), BackendError> {
        let started = Instant::now();
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.endpoint))
            .header("X-SLURM-USER-NAME", &self.user)
            .header("X-SLURM-USER-TOKEN", &self.token.0);
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request.send().await.map_err(|e| unreachable(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| unreachable(&e))?.to_vec();
        tracing::debug!(%method, path, status = status.as_u16(), elapsed_ms = started.elapsed().as_millis() as u64, "slurmrestd");
        Ok((status, bytes))
    }

    /// The API version in use and the body of its `POST job/submit` for `job`.
    async fn submission_body(&self, job: &JobRequest) -> Result<(&'static dyn Dialect, Value), BackendError> {
        let api = self.api().await?;
        // Work without a runtime limit runs as long as its partition allows: left out, the
        // time limit would be the partition's DefaultTime (an hour, often), and asked for as
        // unlimited above a MaxTime, the job would pend for good.
        let longest = match job.max_runtime_seconds {
            Some(_) => None,
            None => self.longest_on(api, &job.flavor).await?,
        };
        Ok((api, api.submit_body(&self.submission(job, longest)?)))
    }

    /// The path and body a submit of `job` posts to slurmrestd, for `bench/slurm` to post the
    /// very same job straight to it.
    ///
    /// # Errors
    /// As [`ClusterBackend::submit`] before it posts.
    pub async fn submit_request(&self, job: &JobRequest) -> Result<(String, Value), BackendError> {
        let (api, body) = self.submission_body(job).await?;
        Ok((format!("/slurm/{}/job/submit", api.version()), body))
    }

    async fn get(&self, path: &str) -> Result<Vec<u8>, BackendError> {
        self.call(Method::GET, path, None).await
    }

    /// Every job slurmctld still holds, Berth's or not.
    async fn all_jobs(&self) -> Result<Vec<Job>, BackendError> {
        let body = self.get("jobs").await?;
        self.api().await?.parse_jobs(&body).map_err(|e| self.bad_answer("jobs", &e))
    }

    fn bad_answer(&self, what: &str, e: &serde_json::Error) -> BackendError {
        let version = self.api.lock().expect("api lock").map_or("?", |d| d.version());
        BackendError::Unreachable(format!("slurmrestd's {what} answer is not what API {version} returns: {e}"))
    }

    /// The job with this key, by its remembered id or else from a fresh listing.
    async fn find(&self, key: JobKey) -> Result<Option<Job>, BackendError> {
        let known = self.ids.lock().expect("ids lock").get(&key).copied();
        if let Some(id) = known
            && let Ok(body) = self.get(&format!("job/{id}")).await
            && let Ok(jobs) = self.api().await?.parse_jobs(&body)
            && let Some(job) = jobs.into_iter().find(|j| j.id == id && j.name == key.name())
        {
            return Ok(Some(job));
        }
        let jobs = self.listed(true).await?;
        Ok(jobs.into_iter().find(|j| j.name == key.name()))
    }

    /// Every job slurmctld holds: freshly listed, or (`fresh` false) from a recent listing
    /// plus the jobs this backend submitted since it began.
    async fn listed(&self, fresh: bool) -> Result<Vec<Job>, BackendError> {
        let mut last = self.listing.lock().await;
        let bursting =
            self.submitted.lock().expect("submitted lock").last().is_some_and(|(at, ..)| at.elapsed() < BURST_GAP);
        let reusable = last.as_ref().filter(|l| {
            let age = l.started.elapsed();
            !fresh && age < LISTING_MAX_AGE && (bursting || age < l.took * LISTING_REUSE)
        });
        let (mut jobs, since) = match reusable {
            Some(l) => (l.jobs.clone(), l.started),
            None => {
                let started = Instant::now();
                let jobs = self.all_jobs().await?;
                let mut submitted = self.submitted.lock().expect("submitted lock");
                // A submission answered before the listing began is in it.
                submitted.retain(|(at, ..)| *at >= started);
                let mut ids: HashMap<JobKey, u64> =
                    jobs.iter().filter_map(|j| JobKey::parse(&j.name).map(|k| (k, j.id))).collect();
                ids.extend(submitted.iter().map(|(_, key, id)| (*key, *id)));
                *self.ids.lock().expect("ids lock") = ids;
                *last = Some(Listing { started, took: started.elapsed(), jobs: jobs.clone() });
                (jobs, started)
            }
        };
        let now = Utc::now().timestamp();
        let listed: std::collections::HashSet<u64> = jobs.iter().map(|j| j.id).collect();
        for (_, key, id) in self.submitted.lock().expect("submitted lock").iter().filter(|(at, ..)| *at >= since) {
            if !listed.contains(id) {
                jobs.push(Job {
                    id: *id,
                    name: key.name(),
                    state: "PENDING".into(),
                    reason: None,
                    exit_code: None,
                    comment: String::new(),
                    submit_time: now,
                    start_time: 0,
                    end_time: 0,
                    was_running: false,
                    gres_by_node: Vec::new(),
                    output: wire::output_path("", &self.working_directory, *id, &key.name(), &self.user),
                });
            }
        }
        Ok(jobs)
    }

    fn partition_of(&self, flavor: &str) -> Option<&SlurmPartition> {
        self.partitions.iter().find(|p| p.flavor == flavor)
    }

    /// The cluster's partitions, read now (and kept for [`Self::longest_on`]).
    async fn partitions_now(&self, api: &dyn Dialect) -> Result<Vec<wire::Partition>, BackendError> {
        let partitions =
            api.parse_partitions(&self.get("partitions").await?).map_err(|e| self.bad_answer("partitions", &e))?;
        *self.read_partitions.lock().expect("partitions lock") = Some((Instant::now(), partitions.clone()));
        Ok(partitions)
    }

    /// The MaxTime of `flavor`'s partition in minutes (`None`: unlimited), as read at most
    /// [`PARTITIONS_MAX_AGE`] ago.
    async fn longest_on(&self, api: &dyn Dialect, flavor: &str) -> Result<Option<u64>, BackendError> {
        let name = self.partition_of(flavor).map(|p| p.name.as_str());
        let longest = |partitions: &[wire::Partition]| {
            partitions.iter().find(|p| Some(p.name.as_str()) == name).and_then(|p| p.max_time_minutes)
        };
        if let Some((at, partitions)) = &*self.read_partitions.lock().expect("partitions lock")
            && at.elapsed() < PARTITIONS_MAX_AGE
        {
            return Ok(longest(partitions));
        }
        Ok(longest(&self.partitions_now(api).await?))
    }

    /// What the job request becomes in Slurm. `longest` is the partition's `MaxTime` (in
    /// minutes; `None`: unlimited), asked for work without a runtime limit.
    fn submission(&self, job: &JobRequest, longest: Option<u64>) -> Result<Submission, BackendError> {
        let partition = self.partition_of(&job.flavor).ok_or_else(|| {
            BackendError::Rejected(format!("this cluster maps no partition to flavor {}", job.flavor))
        })?;
        let shards_per_task = if job.gpus_per_task.is_multiple_of(100) {
            None
        } else {
            let fraction = f64::from(job.gpus_per_task) / 100.0;
            let Some(per_gpu) = partition.shards_per_gpu else {
                return Err(BackendError::Rejected(format!(
                    "partition {} has no GPU shards (spec.slurm.partitions[].shards_per_gpu), so {fraction} GPU per \
                     task cannot be requested",
                    partition.name
                )));
            };
            let hundredths = job.gpus_per_task * per_gpu;
            if job.gpus_per_task > 100 || !hundredths.is_multiple_of(100) {
                return Err(BackendError::Rejected(format!(
                    "{fraction} GPU per task is not a whole number of shards on partition {} ({per_gpu} per GPU)",
                    partition.name
                )));
            }
            Some(hundredths / 100)
        };
        let gpus = job.gpus_per_task / 100;
        let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
        for n in &job.nodes {
            *per_node.entry(n.as_str()).or_default() += 1;
        }
        let nodes = u32::try_from(per_node.len()).unwrap_or(u32::MAX).max(1);
        let most_tasks_on_a_node =
            per_node.values().copied().max().unwrap_or_else(|| u64::from(job.tasks.div_ceil(nodes)));
        let mut environment = BTreeMap::from([("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned())]);
        environment.extend(job.environment());
        Ok(Submission {
            script: script(&job.run, job.tasks)?,
            name: job.key.name(),
            comment: format!("berth {}/{}", job.team, job.workload),
            partition: partition.name.clone(),
            nodes,
            tasks: job.tasks,
            gpus_per_task: (gpus > 0).then(|| Gpus { gpu_type: partition.gpu_type.clone(), count: gpus }),
            shards_per_task,
            shards_per_node: shards_per_task.map(|s| s * u32::try_from(most_tasks_on_a_node).unwrap_or(u32::MAX)),
            cpus_per_task: job.cpus_per_task.map(|c| c.ceil() as u32),
            memory_mib_per_node: job.memory_mib_per_task.map(|m| m * most_tasks_on_a_node),
            time_limit: match job.max_runtime_seconds {
                Some(s) => TimeLimit::Minutes(s.div_ceil(60)),
                None => longest.map_or(TimeLimit::Unlimited, TimeLimit::Minutes),
            },
            environment,
            working_directory: self.working_directory.clone(),
        })
    }

    /// Cancels the job now (SIGTERM, then SIGKILL after Slurm's `KillWait`). A job that
    /// finished meanwhile is fine.
    async fn cancel_now(&self, job: &Job) -> Result<(), BackendError> {
        match self.call(Method::DELETE, &format!("job/{}", job.id), None).await {
            Err(BackendError::Rejected(why)) => {
                match self.find(JobKey::parse(&job.name).expect("a Berth job")).await? {
                    Some(now) if !status(&now).state.is_final() => Err(BackendError::Rejected(why)),
                    _ => Ok(()),
                }
            }
            other => other.map(|_| ()),
        }
    }
}

/// Berth's jobs among all, as Berth sees them.
fn berths(jobs: &[Job]) -> Vec<JobStatus> {
    jobs.iter().filter(|j| JobKey::parse(&j.name).is_some()).map(status).collect()
}

/// The batch script: the workload's own, or one that runs its command (through `srun`
/// on every task of a multi-task job).
fn script(run: &Run, tasks: u32) -> Result<String, BackendError> {
    if let Some(s) = &run.script {
        return Ok(if s.starts_with("#!") { s.clone() } else { format!("#!/bin/bash\n{s}") });
    }
    if run.command.is_empty() {
        return Err(BackendError::Rejected("a Slurm job needs spec.run.script or spec.run.command".into()));
    }
    let quoted: Vec<String> = run.command.iter().map(|a| format!("'{}'", a.replace('\'', r"'\''"))).collect();
    let launcher = if tasks > 1 { "srun " } else { "" };
    Ok(format!("#!/bin/bash\nexec {launcher}{}\n", quoted.join(" ")))
}

/// The deadline a cancel wrote into the job's comment.
fn cancel_deadline(comment: &str) -> Option<i64> {
    comment.split_whitespace().find_map(|w| w.strip_prefix(CANCEL_BY)?.parse().ok())
}

fn at(epoch_seconds: i64) -> Option<DateTime<Utc>> {
    (epoch_seconds > 0).then(|| DateTime::from_timestamp(epoch_seconds, 0)).flatten()
}

/// Berth's view of one of its Slurm jobs.
fn status(job: &Job) -> JobStatus {
    let state = wire::job_state(&job.state, job.was_running);
    // A pending job's start time is an estimate, and a job cancelled before it started
    // gets its cancel time as both start and end; Slurm's "was running" flag is not kept
    // on every finished job.
    let started = match state {
        JobState::Queued | JobState::Unplaceable => false,
        JobState::Running => true,
        JobState::Cancelled => job.was_running || (job.start_time > 0 && job.start_time < job.end_time),
        JobState::Succeeded | JobState::Failed | JobState::TimedOut => job.start_time > 0,
    };
    let is_final = state.is_final();
    JobStatus {
        key: JobKey::parse(&job.name).expect("only Berth's jobs"),
        job_id: job.id.to_string(),
        state,
        exit_code: if is_final { job.exit_code } else { None },
        reason: if is_final { wire::final_reason(&job.state, job.reason.as_deref()) } else { job.reason.clone() },
        submitted_at: at(job.submit_time).unwrap_or_else(Utc::now),
        started_at: if started { at(job.start_time) } else { None },
        finished_at: if is_final { at(job.end_time) } else { None },
        cancelling: !is_final && cancel_deadline(&job.comment).is_some(),
        output: job.output.clone(),
        url: None,
    }
}

fn unreachable(e: &reqwest::Error) -> BackendError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "refused the connection"
    } else {
        "failed"
    };
    // reqwest's message names the URL and the cause, never the headers.
    BackendError::Unreachable(format!("slurmrestd {what}: {e}"))
}

fn failure(status: StatusCode, errors: &[ApiError]) -> BackendError {
    let why = describe(errors);
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        return BackendError::Unreachable(format!(
            "slurmrestd refused the credentials ({status}); check the user and the token credentials_ref names"
        ));
    }
    if status.is_client_error() || errors.iter().any(ApiError::is_rejection) {
        return BackendError::Rejected(format!("Slurm refused the request ({status}): {why}"));
    }
    BackendError::Unreachable(format!(
        "slurmrestd answered {status}: {why} (slurmctld down, or a wrong or expired token, which slurmrestd reports the same way)"
    ))
}

#[async_trait]
impl ClusterBackend for SlurmCluster {
    fn kind(&self) -> ClusterKind {
        ClusterKind::Slurm
    }

    fn api_in_use(&self) -> Option<String> {
        self.found.lock().expect("found lock").clone()
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.get("ping").await.map(|_| ())
    }

    async fn inventory(&self) -> Result<Inventory, BackendError> {
        let api = self.api().await?;
        let nodes = api.parse_nodes(&self.get("nodes").await?).map_err(|e| self.bad_answer("nodes", &e))?;
        let partitions = self.partitions_now(api).await?;
        let jobs = self.listed(false).await?;
        // A shard is its share of a GPU of the partition the node is in.
        let shards_per_gpu: HashMap<&str, u32> = nodes
            .iter()
            .filter_map(|n| {
                let per_gpu = self.partitions.iter().find(|p| n.partitions.contains(&p.name))?.shards_per_gpu?;
                Some((n.name.as_str(), per_gpu))
            })
            .collect();
        let share = |shards: u32, node: &str| shards_per_gpu.get(node).map_or(0, |k| (shards * 100).div_ceil(*k));
        // Shards held on each node, from the jobs (a node's `gres_used` miscounts them on
        // 22.05), and GPUs (in hundredths) held by jobs that are not Berth's.
        let mut shards: HashMap<&str, u32> = HashMap::new();
        let mut outside: HashMap<&str, u32> = HashMap::new();
        for j in &jobs {
            let berths = JobKey::parse(&j.name).is_some();
            for (node, gres) in &j.gres_by_node {
                let held = wire::shards_in(gres);
                *shards.entry(node.as_str()).or_default() += held;
                if !berths {
                    *outside.entry(node.as_str()).or_default() += wire::gpus_in(gres, None) * 100 + share(held, node);
                }
            }
        }
        let up = |name: &str| partitions.iter().any(|p| p.name == name && p.up);
        let nodes = nodes
            .iter()
            .map(|n| {
                let mapped = self.partitions.iter().find(|p| {
                    n.partitions.contains(&p.name)
                        && (p.gpu_type.is_none() || wire::gpus_in(&n.gres, p.gpu_type.as_deref()) > 0)
                });
                let gpu_type = mapped.and_then(|p| p.gpu_type.as_deref());
                let gpus = wire::gpus_in(&n.gres, gpu_type);
                let sharing = share(shards.get(n.name.as_str()).copied().unwrap_or(0), &n.name);
                let used = (wire::gpus_in(&n.gres_used, gpu_type) * 100 + sharing).min(gpus * 100);
                InventoryNode {
                    name: n.name.clone(),
                    flavor: mapped.map(|p| p.flavor.clone()),
                    gpus,
                    gpus_used: used,
                    gpus_used_outside_berth: outside.get(n.name.as_str()).copied().unwrap_or(0).min(used),
                    cpus: n.cpus,
                    memory_mib: n.memory_mib,
                    block: n.features.iter().find_map(|f| f.strip_prefix("block=")).map(str::to_owned),
                    schedulable: wire::schedulable(n) && mapped.is_some_and(|p| up(&p.name)),
                }
            })
            .collect();
        Ok(Inventory { nodes })
    }

    async fn submit(&self, job: &JobRequest) -> Result<JobStatus, BackendError> {
        // A key this backend submitted before is returned, not made again; a key submitted
        // by an earlier process is the caller's to look up first (see the trait).
        let known = self.ids.lock().expect("ids lock").get(&job.key).copied();
        if known.is_some()
            && let Some(found) = self.find(job.key).await?
        {
            return Ok(status(&found));
        }
        let (api, body) = self.submission_body(job).await?;
        let answer = self.call(Method::POST, "job/submit", Some(&body)).await?;
        let id = api.submitted_job_id(&answer).ok_or_else(|| {
            BackendError::Rejected(format!("Slurm returned no job id: {}", describe(&errors(&answer))))
        })?;
        self.ids.lock().expect("ids lock").insert(job.key, id);
        self.submitted.lock().expect("submitted lock").push((Instant::now(), job.key, id));
        // Accepted with remarks (a time limit above the partition's: the job pends).
        let remarks = errors(&answer);
        Ok(JobStatus {
            key: job.key,
            job_id: id.to_string(),
            state: JobState::Queued,
            exit_code: None,
            reason: (!remarks.is_empty()).then(|| describe(&remarks)),
            submitted_at: Utc::now(),
            started_at: None,
            finished_at: None,
            cancelling: false,
            output: wire::output_path("", &self.working_directory, id, &job.key.name(), &self.user),
            url: None,
        })
    }

    async fn jobs(&self) -> Result<Vec<JobStatus>, BackendError> {
        Ok(berths(&self.listed(true).await?))
    }

    async fn jobs_recent(&self) -> Result<Vec<JobStatus>, BackendError> {
        Ok(berths(&self.listed(false).await?))
    }

    async fn job(&self, key: JobKey) -> Result<Option<JobStatus>, BackendError> {
        Ok(self.find(key).await?.as_ref().map(status))
    }

    async fn cancel(&self, key: JobKey, grace: Duration) -> Result<(), BackendError> {
        let Some(job) = self.find(key).await? else { return Ok(()) };
        let current = status(&job);
        if current.state.is_final() {
            return Ok(());
        }
        let now = Utc::now().timestamp();
        match cancel_deadline(&job.comment) {
            // Within the grace period a repeated cancel waits, unless it asks to stop now.
            Some(deadline) if now < deadline && !grace.is_zero() => Ok(()),
            Some(_) => self.cancel_now(&job).await,
            // Nothing to checkpoint before it runs.
            None if current.state == JobState::Queued || grace.is_zero() => self.cancel_now(&job).await,
            None => {
                let deadline = now + i64::try_from(grace.as_secs()).unwrap_or(i64::MAX / 2).max(1);
                // The deadline is written before the signal, so a crash in between
                // cannot leave a signalled job with no deadline.
                let comment = format!("{} {CANCEL_BY}{deadline}", job.comment).trim().to_owned();
                let api = self.api().await?;
                self.call(Method::POST, &format!("job/{}", job.id), Some(&api.update_comment_body(&comment))).await?;
                self.call(Method::DELETE, &format!("job/{}?signal=TERM", job.id), None).await.map(|_| ())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use berth_core::workload::WorkloadKind;
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    fn cluster(gpu_type: Option<&str>) -> SlurmCluster {
        let spec: ClusterSpec = serde_json::from_value(json!({
            "kind": "slurm", "endpoint": "http://127.0.0.1:1/", "credentials_ref": "BERTH_CREDENTIAL_T",
            "slurm": {"user": "berth", "working_directory": "/scratch",
                      "partitions": [{"name": "gpu", "flavor": "h100", "gpu_type": gpu_type}]},
        }))
        .unwrap();
        SlurmCluster::new(&spec, "secret-token".into()).unwrap()
    }

    fn request(tasks: u32, gpus: u32, nodes: &[&str]) -> JobRequest {
        JobRequest {
            key: JobKey { workload: Uuid::nil(), attempt: 2 },
            team: "nlp".into(),
            workload: "train".into(),
            kind: WorkloadKind::Training,
            flavor: "h100".into(),
            tasks,
            gpus_per_task: gpus,
            cpus_per_task: Some(3.5),
            memory_mib_per_task: Some(4096),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            run: Run {
                command: vec!["python".into(), "train.py".into(), "--name=it's".into()],
                script: None,
                image: None,
                env: BTreeMap::from([("EPOCHS".into(), "3".into())]),
            },
            max_runtime_seconds: Some(3601),
            sim_duration_seconds: None,
            resume: false,
            grace_seconds: 30,
            api: None,
            notebook_token: None,
            service: None,
            sim_load: Vec::new(),
        }
    }

    #[test]
    fn a_two_node_gang_becomes_this_exact_submit_body() {
        let c = cluster(Some("h100"));
        let body = V0038.submit_body(&c.submission(&request(2, 800, &["n1", "n2"]), None).unwrap());
        let uid = Uuid::nil();
        assert_eq!(
            body,
            json!({
                "script": "#!/bin/bash\nexec srun 'python' 'train.py' '--name=it'\\''s'\n",
                "job": {
                    "name": format!("berth-{uid}-2"),
                    "comment": "berth nlp/train",
                    "partition": "gpu",
                    "nodes": 2,
                    "tasks": 2,
                    "gpus_per_task": "h100:8",
                    "cpus_per_task": 4,
                    "memory_per_node": 4096,
                    "time_limit": 61,
                    "current_working_directory": "/scratch",
                    "environment": {
                        "PATH": "/usr/local/bin:/usr/bin:/bin", "EPOCHS": "3", "BERTH_TEAM": "nlp",
                        "BERTH_WORKLOAD": "train", "BERTH_WORKLOAD_UID": uid.to_string(), "BERTH_ATTEMPT": "2",
                    },
                },
            })
        );
    }

    /// Work without a runtime limit asks for its partition's MaxTime (left out, Slurm would
    /// give it the DefaultTime: killed after an hour on the dev clusters), or for no limit
    /// where the partition has none (asked above a MaxTime, the job would pend for good).
    #[test]
    fn work_without_a_limit_asks_for_the_partitions_longest_time() {
        let c = cluster(Some("h100"));
        let unlimited = JobRequest { max_runtime_seconds: None, ..request(1, 100, &["n1"]) };
        let capped = c.submission(&unlimited, Some(1440)).unwrap();
        assert_eq!(capped.time_limit, TimeLimit::Minutes(1440));
        let open = c.submission(&unlimited, None).unwrap();
        assert_eq!(open.time_limit, TimeLimit::Unlimited);
        assert_eq!(c.submission(&request(1, 100, &["n1"]), Some(1440)).unwrap().time_limit, TimeLimit::Minutes(61));
        assert_eq!(V0038.submit_body(&open)["job"]["time_limit"], json!(4_294_967_295_u64));
        for dialect in DIALECTS.iter().filter(|d| d.version() != "v0.0.38") {
            let job = &dialect.submit_body(&open)["job"];
            assert_eq!(job["time_limit"], json!({"set": true, "infinite": true, "number": 0}), "{}", dialect.version());
        }
        // The partitions' MaxTime as 22.05 and 24.11 or later answer it.
        let v38 = br#"{"partitions": [{"name": "gpu", "state": "UP", "max_time_limit": 1440},
                                      {"name": "open", "state": "UP", "max_time_limit": 4294967295}]}"#;
        let max = |p: Vec<wire::Partition>| p.into_iter().map(|p| p.max_time_minutes).collect::<Vec<_>>();
        assert_eq!(max(V0038.parse_partitions(v38).unwrap()), [Some(1440), None]);
        let v40 = br#"{"partitions": [{"name": "gpu", "partition": {"state": ["UP"]},
                                       "maximums": {"time": {"set": true, "infinite": false, "number": 1440}}},
                                      {"name": "open", "maximums": {"time": {"set": true, "infinite": true, "number": 0}}}]}"#;
        for dialect in DIALECTS.iter().filter(|d| d.version() != "v0.0.38") {
            assert_eq!(max(dialect.parse_partitions(v40).unwrap()), [Some(1440), None], "{}", dialect.version());
        }
    }

    #[test]
    fn from_v0_0_40_on_the_script_is_in_the_job_and_gpus_are_tres() {
        let c = cluster(Some("h100"));
        let submission = c.submission(&request(2, 800, &["n1", "n2"]), None).unwrap();
        for dialect in DIALECTS.iter().filter(|d| d.version() != "v0.0.38") {
            let body = dialect.submit_body(&submission);
            let job = &body["job"];
            assert_eq!(body.as_object().unwrap().len(), 1, "{}: only the job", dialect.version());
            assert!(job["script"].as_str().unwrap().starts_with("#!/bin/bash\nexec srun"));
            assert_eq!(job["tres_per_task"], "gres/gpu:h100:8");
            assert_eq!(job["nodes"], "2");
            assert_eq!(job["memory_per_node"], json!({"set": true, "infinite": false, "number": 4096}));
            assert_eq!(job["time_limit"], json!({"set": true, "infinite": false, "number": 61}));
            assert!(job["environment"].as_array().unwrap().contains(&json!("EPOCHS=3")));
        }
    }

    #[test]
    fn a_fraction_of_a_gpu_becomes_shards_per_task_or_per_node() {
        let spec: ClusterSpec = serde_json::from_value(json!({
            "kind": "slurm", "endpoint": "http://127.0.0.1:1/", "credentials_ref": "BERTH_CREDENTIAL_T",
            "slurm": {"user": "berth", "partitions": [{"name": "gpu", "flavor": "h100", "gpu_type": "h100", "shards_per_gpu": 8}]},
        }))
        .unwrap();
        let c = SlurmCluster::new(&spec, "secret-token".into()).unwrap();
        // Three quarter-GPU tasks, two of them on one node: 2 shards each, 4 on that node.
        let s = c.submission(&request(3, 25, &["n1", "n1", "n2"]), None).unwrap();
        assert_eq!((&s.gpus_per_task, s.shards_per_task, s.shards_per_node), (&None, Some(2), Some(4)));
        assert_eq!(V0038.submit_body(&s)["job"]["gres"], "shard:4");
        assert_eq!(V0041("v0.0.45").submit_body(&s)["job"]["tres_per_task"], "gres/shard:2");
        let Err(BackendError::Rejected(why)) = c.submission(&request(1, 30, &["n1"]), None) else { panic!() };
        assert!(why.contains("0.3 GPU per task is not a whole number of shards"), "{why}");
        // Whole GPUs stay GPUs.
        assert_eq!(c.submission(&request(1, 200, &["n1"]), None).unwrap().shards_per_task, None);
    }

    #[test]
    fn berth_core_accepts_exactly_the_versions_this_adapter_speaks() {
        let mut speaks: Vec<&str> = DIALECTS.iter().map(|d| d.version()).collect();
        speaks.push(berth_core::cluster::SLURM_API_AUTO);
        let mut accepted = berth_core::cluster::SLURM_API_VERSIONS.to_vec();
        speaks.sort_unstable();
        accepted.sort_unstable();
        assert_eq!(speaks, accepted);
    }

    #[test]
    fn tasks_sharing_a_node_ask_for_its_memory_together_and_untyped_gpus_have_no_type() {
        let c = cluster(None);
        let s = c.submission(&request(3, 200, &["n1", "n1", "n2"]), None).unwrap();
        assert_eq!(
            (s.nodes, s.tasks, s.gpus_per_task.map(|g| g.typed_count()), s.memory_mib_per_node),
            (2, 3, Some("2".to_owned()), Some(8192))
        );
        let cpu_only = c.submission(&request(1, 0, &["n1"]), None).unwrap();
        assert_eq!(cpu_only.gpus_per_task, None);
        assert!(cpu_only.script.starts_with("#!/bin/bash\nexec 'python'"), "one task runs without srun");
    }

    #[test]
    fn requests_slurm_cannot_express_are_rejected_with_the_reason() {
        let c = cluster(Some("h100"));
        let Err(BackendError::Rejected(why)) = c.submission(&request(1, 50, &["n1"]), None) else { panic!() };
        assert!(why.contains("has no GPU shards") && why.contains("shards_per_gpu"), "{why}");
        let mut other = request(1, 100, &["n1"]);
        other.flavor = "a100".into();
        let Err(BackendError::Rejected(why)) = c.submission(&other, None) else { panic!() };
        assert!(why.contains("a100"), "{why}");
        let mut nothing = request(1, 100, &["n1"]);
        nothing.run.command.clear();
        assert!(matches!(c.submission(&nothing, None), Err(BackendError::Rejected(_))));
    }

    #[test]
    fn a_script_without_a_shebang_gets_bash() {
        let run = Run { command: vec![], script: Some("echo hi\n".into()), image: None, env: BTreeMap::new() };
        assert_eq!(script(&run, 1).unwrap(), "#!/bin/bash\necho hi\n");
    }

    #[test]
    fn answers_become_rejections_or_outages() {
        let rejected = errors(br#"{"errors": [{"error_code": 2000, "error": "Invalid partition name specified"}]}"#);
        assert!(
            matches!(failure(StatusCode::INTERNAL_SERVER_ERROR, &rejected), BackendError::Rejected(m) if m.contains("Invalid partition"))
        );
        let down = errors(
            br#"{"errors": [{"description": "Failed while looking for jobs", "error_number": -1, "error": "Unspecified error", "source": "slurm_load_jobs"}]}"#,
        );
        assert!(
            matches!(failure(StatusCode::INTERNAL_SERVER_ERROR, &down), BackendError::Unreachable(m) if m.contains("Failed while looking for jobs: Unspecified error"))
        );
        assert!(
            matches!(failure(StatusCode::UNAUTHORIZED, &[]), BackendError::Unreachable(m) if m.contains("credentials"))
        );
        assert!(matches!(failure(StatusCode::BAD_REQUEST, &[]), BackendError::Rejected(_)));
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let c = cluster(None);
        assert_eq!(format!("{:?}", c.token), "<redacted>");
    }

    #[test]
    fn a_job_cancelled_with_grace_reports_cancelling_until_it_ends() {
        let job = Job {
            id: 7,
            name: JobKey { workload: Uuid::nil(), attempt: 0 }.name(),
            state: "RUNNING".into(),
            reason: None,
            exit_code: Some(0),
            comment: "berth nlp/train cancel-by=1800000000".into(),
            submit_time: 1_700_000_000,
            start_time: 1_700_000_001,
            end_time: 0,
            was_running: true,
            gres_by_node: vec![],
            output: None,
        };
        let s = status(&job);
        assert!(s.cancelling && s.state == JobState::Running && s.exit_code.is_none() && s.started_at.is_some());
        let done = status(&Job { state: "FAILED".into(), exit_code: Some(3), end_time: 1_700_000_100, ..job });
        assert_eq!((done.state, done.exit_code, done.cancelling), (JobState::Failed, Some(3), false));
        assert_eq!(cancel_deadline("berth a/b cancel-by=42"), Some(42));
    }
}
