//! Berth's controllers: the reconcilers that turn declared workloads into backend jobs and
//! keep the two in sync, and the lease that lets only one replica run them.
//!
//! Each reconciler (one module each) reads desired and observed state and moves one step
//! toward desired; it takes no description of what changed, is safe to repeat after a
//! crash anywhere, does not retry inside itself (its loop runs it again) and returns a
//! small typed status, which [`runner`] stores for `/api/v1/controllers`.
//!
//! - [`scheduler`]: pending → admitted, preemption marks, reasons and queue positions;
//! - [`dispatcher`]: admitted → a backend job (looked up by key first) → dispatched;
//! - [`status_sync`]: backend job state → running / succeeded / failed; drift;
//! - [`preemption`]: cancels preempted jobs with a grace period, then requeues or fails;
//! - [`deletion`]: cancels the job of a deleted or cancelled workload, then removes the
//!   workload or ends it `Cancelled`;
//! - [`estimates`]: when each pending workload should start (the scheduler run forward);
//! - [`budgets`]: each team's GPU-hours this week or month against its budgets;
//! - [`fair_sharing`]: each team's recent GPU-hours, where its tree shares over time;
//! - [`retention`]: removes workloads that ended longer ago than the retention period;
//! - [`orphans`]: cancels backend jobs carrying Berth's key that no workload owns;
//! - [`cluster_health`]: inventory refresh, unreachable clusters, re-placement.
//!
//! Every workload write is a compare-and-set on the version the reconciler read, and every
//! transition is recorded as an event. Every controller write goes through
//! [`Context::begin`], which fences it with the lease's epoch ([`leader`]): a replica that
//! lost the lease cannot write.

pub mod autoscaler;
pub mod budgets;
mod clock;
pub mod cluster_health;
pub mod deletion;
pub mod dispatcher;
pub mod estimates;
mod explain;
pub mod fair_sharing;
pub mod idle;
pub mod leader;
pub mod orphans;
pub mod preemption;
pub mod preview;
pub mod retention;
pub mod runner;
pub mod scheduler;
pub mod snapshot;
pub mod status_sync;
pub mod world;

use std::sync::Arc;
use std::time::Duration;

use berth_adapters::{ClusterBackend, JobKey, Registry};
use berth_core::Error;
use berth_core::cluster::{Cluster, ClusterHealth, ClusterSpec};
use berth_core::workload::{Phase, Workload, WorkloadStatus};
use berth_store::PgPool;
use chrono::{DateTime, Utc};

pub use crate::clock::Clock;

/// The kind events about workloads are recorded under.
pub const EVENT_KIND: &str = "workload";

/// How the controllers behave; every field has a production default.
#[derive(Debug, Clone)]
pub struct Config {
    /// Full pass of every controller even when nothing woke it.
    pub resync: Duration,
    /// Least time between two scheduling cycles: wake-ups within it coalesce.
    pub min_cycle_interval: Duration,
    /// How often backend job states are read.
    pub sync_interval: Duration,
    /// How often each cluster's inventory is refreshed.
    pub health_interval: Duration,
    /// Failed refreshes in a row after which a cluster is `Unreachable`.
    pub unreachable_after_failures: u32,
    /// How long running work on an unreachable cluster stays `Unknown` before it is
    /// requeued (resumable) or failed.
    pub unknown_timeout: Duration,
    /// Time a cancelled job gets to checkpoint before it is killed.
    pub cancel_grace: Duration,
    /// Age below which a backend job without a workload is not yet an orphan (its
    /// workload's write may still be in flight).
    pub orphan_grace: Duration,
    /// Pending time after which capacity is reserved for a workload.
    pub starvation_after: Duration,
    /// How long an ended workload is kept before it is removed.
    pub retention: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(10),
            min_cycle_interval: Duration::from_millis(100),
            sync_interval: Duration::from_millis(500),
            health_interval: Duration::from_secs(2),
            unreachable_after_failures: 3,
            unknown_timeout: Duration::from_secs(120),
            cancel_grace: Duration::from_secs(30),
            orphan_grace: Duration::from_secs(60),
            starvation_after: Duration::from_secs(3600),
            retention: Duration::from_secs(30 * 86_400),
        }
    }
}

/// What every reconciler reaches.
#[derive(Clone)]
pub struct Context {
    pub db: PgPool,
    pub backends: Arc<Registry>,
    pub config: Config,
    /// The lease epoch every write is fenced with; `None` outside a lease (a test or a
    /// tool driving the reconcilers by hand, alone on its database).
    pub epoch: Option<i64>,
    /// The time as the controllers read it.
    pub clock: Clock,
    /// The world the scheduler read last, kept between its cycles.
    pub world: world::WorldCache,
    /// Where the dispatcher's last pass left the change feed.
    pub dispatch: dispatcher::Feed,
    /// Where each workload on a backend stood at status sync's last pass.
    pub followed: status_sync::Followed,
    /// What dispatched jobs are told of Berth's API; `None`: nothing (they cannot
    /// acknowledge a checkpoint, and get their whole grace period).
    pub job_api: Option<JobApiConfig>,
}

/// Berth's API as dispatched jobs reach it: the URL they are told and the issuer that
/// signs each attempt's own token.
#[derive(Clone, Debug)]
pub struct JobApiConfig {
    pub url: String,
    pub issuer: berth_auth::BerthIssuer,
}

/// How long a job's token is good for. A job that runs longer cannot acknowledge its
/// checkpoint any more and gets its whole grace period.
pub const JOB_TOKEN_TTL: Duration = Duration::from_secs(30 * 86_400);

impl JobApiConfig {
    /// The URL and a fresh token for the workload's current attempt.
    pub fn for_attempt(&self, w: &Workload) -> berth_adapters::JobApi {
        let scope = berth_core::auth::WorkloadScope::of(w);
        berth_adapters::JobApi { url: self.url.clone(), token: self.issuer.mint_workload(scope, JOB_TOKEN_TTL).token }
    }
}

impl Context {
    /// Begins a transaction for a controller write, fenced with the lease's epoch: it fails
    /// (`Unavailable`) if another replica has taken the lease, and while it is open no
    /// other replica can take it.
    ///
    /// # Errors
    /// Store errors; `Unavailable` when deposed.
    pub async fn begin(&self) -> Result<berth_store::Tx<'static>, Error> {
        let mut tx = berth_store::begin(&self.db).await?;
        if let Some(epoch) = self.epoch {
            berth_store::controller::leader_fence(&mut tx, epoch).await?;
        }
        Ok(tx)
    }
}

/// The backend of a cluster that is worth calling: `None` while the cluster is
/// `Unreachable` (cluster health alone keeps probing it) or has no adapter.
fn reachable_backend(ctx: &Context, cluster: &Cluster) -> Option<Arc<dyn ClusterBackend>> {
    if cluster.status.health == ClusterHealth::Unreachable {
        return None;
    }
    ctx.backends.backend(cluster).ok()
}

/// The workload's resource version as the compare-and-set value.
/// Runs CPU-bound work (a snapshot, a plan) on the runtime's blocking threads, so that its
/// workers stay free for requests and other tasks meanwhile.
///
/// # Errors
/// `Internal` if the work panicked.
async fn off_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Internal(format!("a controller's computation failed: {e}")))
}

fn version(w: &Workload) -> Result<i64, Error> {
    w.metadata
        .resource_version
        .parse()
        .map_err(|_| Error::Internal(format!("resource_version {:?} is not a number", w.metadata.resource_version)))
}

/// The key of the backend job for the workload's current attempt.
pub fn job_key(w: &Workload) -> JobKey {
    JobKey { workload: w.metadata.uid, attempt: w.status.attempt }
}

/// Back to `Pending` for another attempt, keeping the original submit time (its place in
/// the queue) and the workload it was preempted for, if it was.
fn requeued(w: &Workload, reason: &str, message: String) -> WorkloadStatus {
    WorkloadStatus {
        phase: Phase::Pending,
        attempt: w.status.attempt + 1,
        submitted_at: w.status.submitted_at,
        preempted_for: w.status.preempted_for,
        cancellation: w.status.cancellation.clone(),
        reason: Some(reason.into()),
        message: Some(message),
        ..WorkloadStatus::default()
    }
}

/// Requeued (attempt + 1) when the workload can resume, else `Failed`: what the workload's
/// policy says when its job is lost.
fn requeued_or_failed(w: &Workload, reason: &str, message: String, now: DateTime<Utc>) -> WorkloadStatus {
    if w.spec.resumable { requeued(w, reason, message) } else { finished(w, Phase::Failed, reason, message, None, now) }
}

/// Asks the backend to stop the workload's job: the first call sends the cancel and
/// records `cancel_requested_at`; once the grace period is over each call asks again,
/// which a backend that leaves the final kill to its caller (Slurm) takes as the hard
/// cancel, and others ignore (a repeated cancel never extends the grace period).
/// `transition` is `None` when nothing is to be written; `error` says why the backend
/// refused the cancel (asked again on the next pass).
async fn request_cancel<'a>(
    ctx: &Context,
    backend: &dyn ClusterBackend,
    cluster: &Cluster,
    w: &'a Workload,
    key: JobKey,
) -> Cancel<'a> {
    let refused = |e: berth_adapters::BackendError| {
        let name = format!("{}/{}", w.metadata.team.as_deref().unwrap_or_default(), w.metadata.name);
        Some(format!("cancelling {name} on cluster {}: {e}", cluster.metadata.name))
    };
    if w.status.checkpointed_at.is_some() {
        // The job said its checkpoint is written: it is stopped now, whatever is left of
        // its grace period (asked again each pass until it is gone).
        let error = backend.cancel(key, Duration::ZERO).await.err().and_then(refused);
        let transition = w.status.cancel_requested_at.is_none().then(|| {
            Transition::new(w, WorkloadStatus { cancel_requested_at: Some(ctx.clock.now()), ..w.status.clone() })
        });
        return Cancel { transition, error };
    }
    let grace = cancel_grace(&ctx.config, w, &cluster.spec);
    if let Some(at) = w.status.cancel_requested_at {
        let mut error = None;
        if (ctx.clock.now() - at).to_std().unwrap_or_default() >= grace {
            error = backend.cancel(key, grace).await.err().and_then(refused);
        }
        return Cancel { transition: None, error };
    }
    if let Err(e) = backend.cancel(key, grace).await {
        return Cancel { transition: None, error: refused(e) };
    }
    let status = WorkloadStatus { cancel_requested_at: Some(ctx.clock.now()), ..w.status.clone() };
    Cancel { transition: Some(Transition { told_to_stop: Some(grace), ..Transition::new(w, status) }), error: None }
}

/// What asking a backend to stop a job came to.
struct Cancel<'a> {
    transition: Option<Transition<'a>>,
    error: Option<String>,
}

/// How long the workload's job gets to checkpoint on `cluster` when it is told to stop:
/// what it asks for (`spec.checkpoint`) up to the cluster's maximum (the server's cancel
/// grace period where the cluster sets none), else the server's cancel grace period.
pub fn cancel_grace(config: &Config, w: &Workload, cluster: &ClusterSpec) -> Duration {
    let server = config.cancel_grace;
    w.spec.checkpoint.map_or(server, |c| cluster.checkpoint_grace(c.grace_seconds, server))
}

/// When a workload told to stop (at its cancel, or `now` if not yet sent) is stopped at the
/// latest: the end of its grace period on `cluster`.
pub fn stops_by(config: &Config, w: &Workload, cluster: &ClusterSpec, now: DateTime<Utc>) -> DateTime<Utc> {
    let grace = cancel_grace(config, w, cluster);
    w.status.cancel_requested_at.unwrap_or(now) + chrono::TimeDelta::from_std(grace).unwrap_or_default()
}

/// A final phase.
fn finished(
    w: &Workload,
    phase: Phase,
    reason: &str,
    message: String,
    exit_code: Option<i32>,
    at: DateTime<Utc>,
) -> WorkloadStatus {
    WorkloadStatus {
        phase,
        reason: Some(reason.into()),
        message: Some(message),
        exit_code,
        finished_at: Some(at),
        pending_reason: None,
        queue_position: None,
        estimated_start: None,
        ..w.status.clone()
    }
}

/// The event reason recorded when a workload enters `phase`.
fn event_reason(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "Requeued",
        Phase::Admitted => "Admitted",
        Phase::Dispatched => "Dispatched",
        Phase::Running => "Running",
        Phase::Preempting => "Preempted",
        Phase::Unknown => "Unknown",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
        Phase::Cancelled => "Cancelled",
    }
}

/// A new status for a workload, as read.
pub(crate) struct Transition<'a> {
    pub workload: &'a Workload,
    pub status: WorkloadStatus,
    /// When the attempt it ends stopped, where the backend said (a preempted job's end);
    /// else its `finished_at`, else now.
    pub ended_at: Option<DateTime<Utc>>,
    /// The job was just told to stop, with this long to checkpoint.
    pub told_to_stop: Option<Duration>,
}

impl<'a> Transition<'a> {
    pub fn new(workload: &'a Workload, status: WorkloadStatus) -> Self {
        Self { workload, status, ended_at: None, told_to_stop: None }
    }
}

/// The ledger record of the attempt a transition ends: a workload that held GPUs (from
/// `Admitted` on) going back to `Pending` or to a final phase.
fn ended_attempt(t: &Transition<'_>, now: DateTime<Utc>) -> Option<berth_store::ledger::Attempt> {
    use berth_store::ledger::Outcome;
    let (w, from, to) = (t.workload, t.workload.status.phase, t.status.phase);
    let held =
        matches!(from, Phase::Admitted | Phase::Dispatched | Phase::Running | Phase::Preempting | Phase::Unknown);
    if !held || !(to.is_final() || to == Phase::Pending) {
        return None;
    }
    let outcome = match to {
        Phase::Succeeded => Outcome::Succeeded,
        Phase::Failed => Outcome::Failed,
        Phase::Cancelled => Outcome::Cancelled,
        _ if from == Phase::Preempting => Outcome::Preempted,
        _ => Outcome::Requeued,
    };
    let started = t.status.started_at.or(w.status.started_at);
    berth_store::ledger::Attempt::of(w, outcome, started, t.ended_at.or(t.status.finished_at).unwrap_or(now))
}

/// Writes transitions in one transaction (each a compare-and-set on the version read) with
/// an event for each phase change. Returns how many were written; the rest lost a race
/// and are left for the next pass.
async fn commit(ctx: &Context, transitions: &[Transition<'_>]) -> Result<usize, Error> {
    if transitions.is_empty() {
        return Ok(0);
    }
    let mut tx = ctx.begin().await?;
    let written = write(&mut tx, transitions, ctx.clock.now()).await?;
    berth_store::commit(tx).await?;
    Ok(written)
}

/// [`commit`] inside the caller's transaction.
async fn write(
    tx: &mut berth_store::Tx<'_>,
    transitions: &[Transition<'_>],
    now: DateTime<Utc>,
) -> Result<usize, Error> {
    let mut writes = Vec::with_capacity(transitions.len());
    for t in transitions {
        writes.push(berth_store::workload::StatusWrite {
            uid: berth_core::WorkloadId(t.workload.metadata.uid),
            resource_version: version(t.workload)?,
            status: t.status.clone(),
        });
    }
    let written: std::collections::HashSet<_> =
        berth_store::workload::workload_write_statuses(&mut *tx, &writes).await?.into_iter().map(|w| w.uid).collect();
    let mut events: Vec<_> = transitions
        .iter()
        .filter(|t| written.contains(&t.workload.metadata.uid) && t.status.phase != t.workload.status.phase)
        .map(|t| {
            let phase = t.status.phase;
            let failed = matches!(phase, Phase::Failed | Phase::Unknown);
            berth_store::event::NewEvent {
                uid: t.workload.metadata.uid,
                event_type: if failed {
                    berth_core::event::EventType::Warning
                } else {
                    berth_core::event::EventType::Normal
                },
                reason: event_reason(phase),
                message: t.status.message.clone().unwrap_or_else(|| phase.as_str().to_owned()),
                details: Some(serde_json::json!({
                    "from": t.workload.status.phase, "to": phase, "attempt": t.workload.status.attempt,
                    "reason": t.status.reason,
                })),
            }
        })
        .collect();
    // The notice a job gets before it is stopped, with its time to checkpoint (its release
    // is the Requeued, Failed or Cancelled event that follows).
    events.extend(transitions.iter().filter(|t| written.contains(&t.workload.metadata.uid)).filter_map(|t| {
        let (grace, at) = (t.told_to_stop?, t.status.cancel_requested_at?);
        let kill_at = at + chrono::Duration::from_std(grace).unwrap_or_default();
        let kill_at = kill_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        Some(berth_store::event::NewEvent {
            uid: t.workload.metadata.uid,
            event_type: berth_core::event::EventType::Normal,
            reason: "StopRequested",
            message: format!("told to stop: {} s to checkpoint, stopped for good at {kill_at}", grace.as_secs()),
            details: Some(serde_json::json!({
                "grace_seconds": grace.as_secs(), "kill_at": kill_at, "attempt": t.workload.status.attempt,
            })),
        })
    }));
    berth_store::event::event_record_many(&mut **tx, EVENT_KIND, &events).await?;
    let ended: Vec<_> = transitions
        .iter()
        .filter(|t| written.contains(&t.workload.metadata.uid))
        .filter_map(|t| ended_attempt(t, now))
        .collect();
    berth_store::ledger::ledger_record(tx, &ended).await?;
    Ok(written.len())
}
