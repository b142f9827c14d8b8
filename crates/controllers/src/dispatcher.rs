//! The dispatcher: each `Admitted` workload becomes one backend job, then `Dispatched`.
//!
//! It claims workloads with `FOR UPDATE SKIP LOCKED` and holds the claim while it talks to
//! the backend, so no two dispatchers (even two replicas that both think they lead) work on
//! one workload. Before submitting it commits a *dispatch intent* per job; a claimed
//! workload that already has one may have its job on the backend (the dispatcher died
//! after the backend accepted it, or the answer was lost), so its cluster's jobs are
//! listed and the job is adopted instead of made twice. Workloads without an intent need
//! no lookup, which keeps a burst to one backend call per job, a few of them in flight.
//!
//! A pass reads once which workloads it is to claim: those admitted since the last pass
//! (the change feed, as the scheduler's kept world reads it), or every `Admitted` one on a
//! process's first pass, when a cluster's spec or health changed (one that did not answer
//! may answer now), and every `resync` period, which also picks up what a pass left (its
//! cluster did not answer, another dispatcher held it). It then claims them by uid, a
//! batch at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use berth_adapters::{BackendError, ClusterBackend, JobKey, JobRequest, JobState, JobStatus};
use berth_core::Error;
use berth_core::cluster::{Cluster, ClusterHealth};
use berth_core::workload::{BackendRef, Phase, Workload, WorkloadStatus};
use futures_util::StreamExt;
use serde::Serialize;
use uuid::Uuid;

use crate::{Context, Transition, job_key};
use berth_sched::snapshot::hundredths;

/// Workloads claimed per transaction.
const BATCH: usize = 200;

/// Submissions in flight at once. slurmrestd takes a burst fastest from a few connections
/// (`bench/slurm` on the dev cluster: from a backlog ~920 jobs/s with 4 in flight, ~1,000
/// with 8 or 16).
const SUBMITS_IN_FLIGHT: usize = 8;

/// The log message for a job found already on the backend.
pub const ADOPTED: &str = "adopted a job an earlier dispatch submitted";

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DispatcherStatus {
    pub dispatched: usize,
    /// Found already on the backend (a retry after a crash).
    pub adopted: usize,
    /// Left `Admitted` because the cluster did not answer.
    pub deferred: usize,
    /// Failed because the backend refused the job.
    pub rejected: usize,
    /// Whether the pass looked through every admitted workload, not only those written
    /// since the last pass.
    pub looked_through_all: bool,
}

/// Where the dispatcher's last pass left the change feed, kept between passes (in the
/// [`Context`]; a new lease term starts without).
#[derive(Clone, Default)]
pub struct Feed(Arc<Mutex<Option<FeedState>>>);

#[derive(Clone)]
struct FeedState {
    /// The change cursor read before the pass's claims.
    cursor: berth_store::workload::FeedCursor,
    /// What of each cluster decides whether its jobs can be submitted, as it was then.
    clusters: Vec<ClusterState>,
    /// When the last pass that looked through every admitted workload began.
    all_at: Instant,
}

/// A cluster's name, spec generation, health and failures in a row: a change in any may let
/// a job it refused be submitted now (the rest of its status, such as its inventory, moves
/// all the time and does not).
type ClusterState = (String, i64, ClusterHealth, u32);

/// The admitted workloads a pass claims from, oldest admission first, in batches.
struct Candidates {
    uids: Vec<Uuid>,
    next: usize,
}

impl Candidates {
    /// The next batch's worth; empty when none is left.
    fn next_batch(&mut self) -> &[Uuid] {
        let from = self.next;
        self.next = (from + BATCH).min(self.uids.len());
        &self.uids[from..self.next]
    }
}

impl Feed {
    /// The workloads the pass claims from, whether they are every admitted one, and the
    /// state to keep once the pass is over.
    async fn candidates(&self, ctx: &Context, clusters: &[Cluster]) -> Result<(Candidates, bool, FeedState), Error> {
        let states: Vec<ClusterState> = clusters
            .iter()
            .map(|c| (c.metadata.name.clone(), c.metadata.generation, c.status.health, c.status.consecutive_failures))
            .collect();
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut tx = berth_store::begin_snapshot(&ctx.db).await?;
        let cursor = berth_store::workload::change_cursor(&mut *tx).await?;
        let since = kept.filter(|k| k.clusters == states && k.all_at.elapsed() < ctx.config.resync);
        let uids =
            berth_store::workload::workload_in_phase(&mut *tx, Phase::Admitted, since.as_ref().map(|k| &k.cursor))
                .await?;
        berth_store::commit(tx).await?;
        let all = since.is_none();
        let all_at = since.map_or_else(Instant::now, |k| k.all_at);
        Ok((Candidates { uids, next: 0 }, all, FeedState { cursor, clusters: states, all_at }))
    }

    fn passed(&self, state: FeedState) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(state);
    }
}

impl crate::runner::Report for DispatcherStatus {
    fn changes(&self) -> usize {
        self.dispatched + self.adopted + self.rejected
    }
}

/// Dispatches every admitted workload it can claim.
///
/// Batches go through three stages, each batch in its own transaction that holds its
/// claim: claimed (intents recorded), submitted, written. While one batch is being
/// submitted the next is claimed and the one before is written, so the backend is never
/// left waiting for Postgres between batches.
///
/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<DispatcherStatus, Error> {
    let mut status = DispatcherStatus::default();
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    let (mut candidates, all, feed) = ctx.dispatch.candidates(ctx, &clusters).await?;
    status.looked_through_all = all;
    let mut next = claim(ctx, &clusters, &mut candidates).await?;
    let mut to_write: Option<Batch> = None;
    while let Some(batch) = next.take() {
        status.adopted += batch.adopted;
        let (submitted, claimed, written) =
            tokio::join!(submit_all(batch), claim(ctx, &clusters, &mut candidates), write(to_write.take()));
        written?;
        next = claimed?;
        status.dispatched += submitted.dispatched;
        status.rejected += submitted.rejected;
        status.deferred += submitted.deferred;
        to_write = Some(submitted);
    }
    write(to_write).await?;
    ctx.dispatch.passed(feed);
    Ok(status)
}

/// A claimed batch: its transaction (holding the claim), the workloads, and what became of
/// each so far.
struct Batch {
    tx: berth_store::Tx<'static>,
    claimed: Vec<Workload>,
    /// Claimed workloads to submit (by index), with their cluster's backend and what it is
    /// asked to run.
    to_submit: Vec<(usize, Arc<dyn ClusterBackend>, JobRequest)>,
    /// New statuses decided (by index): adopted jobs, then the answers to submits.
    decided: Vec<(usize, WorkloadStatus)>,
    /// Left `Admitted`: their cluster is unreachable.
    deferred: usize,
    adopted: usize,
    dispatched: usize,
    rejected: usize,
    /// The controllers' clock (when a rejected submit failed, when an attempt ended).
    clock: crate::Clock,
}

/// Claims the next batch of the candidates still admitted and not held by another
/// dispatcher, and commits a dispatch intent for each that is to be submitted; `None` when
/// no candidate is left.
async fn claim(ctx: &Context, clusters: &[Cluster], candidates: &mut Candidates) -> Result<Option<Batch>, Error> {
    let (mut tx, claimed) = loop {
        let among = candidates.next_batch();
        if among.is_empty() {
            return Ok(None);
        }
        let mut tx = ctx.begin().await?;
        let claimed = berth_store::workload::workload_claim(&mut tx, Phase::Admitted, among).await?;
        if !claimed.is_empty() {
            break (tx, claimed);
        }
    };
    let keys: Vec<(Uuid, u32)> = claimed.iter().map(|w| (w.metadata.uid, w.status.attempt)).collect();
    let intents = berth_store::dispatch::dispatch_intents_of(&mut *tx, &keys).await?;
    let mut batch = Batch {
        clock: ctx.clock.clone(),
        tx,
        claimed: Vec::new(),
        to_submit: Vec::new(),
        decided: Vec::new(),
        deferred: 0,
        adopted: 0,
        dispatched: 0,
        rejected: 0,
    };
    // Each cluster's jobs, listed once per batch and only if a claimed workload there has
    // an intent; `None` when the listing failed.
    let mut listed: HashMap<String, Option<HashMap<JobKey, JobStatus>>> = HashMap::new();
    for (i, w) in claimed.iter().enumerate() {
        let Some(a) = &w.status.admission else { continue };
        let cluster = clusters.iter().find(|c| c.metadata.name == a.cluster);
        let Some((cluster, backend)) = cluster.and_then(|c| Some((c, crate::reachable_backend(ctx, c)?))) else {
            batch.deferred += 1;
            continue;
        };
        if intents.contains(&(w.metadata.uid, w.status.attempt)) {
            if !listed.contains_key(&a.cluster) {
                let jobs = backend.jobs().await.ok().map(|j| j.into_iter().map(|j| (j.key, j)).collect());
                listed.insert(a.cluster.clone(), jobs);
            }
            match &listed[&a.cluster] {
                None => {
                    batch.deferred += 1;
                    continue;
                }
                Some(jobs) => {
                    if let Some(job) = jobs.get(&job_key(w)) {
                        tracing::info!(workload = %w.metadata.uid, cluster = %a.cluster, job = %job.job_id, "{ADOPTED}");
                        batch.adopted += 1;
                        batch.decided.push((i, dispatched(w, &a.cluster, job)));
                        continue;
                    }
                }
            }
        }
        let job = request(w, crate::cancel_grace(&ctx.config, w, &cluster.spec), ctx.job_api.as_ref());
        batch.to_submit.push((i, backend, job));
    }
    let announced: Vec<(Uuid, u32)> =
        batch.to_submit.iter().map(|(i, ..)| (claimed[*i].metadata.uid, claimed[*i].status.attempt)).collect();
    // Committed before any submission (and fenced: a deposed leader submits nothing).
    let mut intents_tx = ctx.begin().await?;
    berth_store::dispatch::dispatch_intents_record(&mut *intents_tx, &announced).await?;
    berth_store::commit(intents_tx).await?;
    batch.claimed = claimed;
    Ok(Some(batch))
}

/// Submits the batch's jobs, [`SUBMITS_IN_FLIGHT`] at a time, and records the answers.
async fn submit_all(mut batch: Batch) -> Batch {
    // Boxed so the stream's type names no closure (which trips the `Send` check of the
    // controller loop's future).
    let submits: Vec<Submit<'_>> = std::mem::take(&mut batch.to_submit)
        .into_iter()
        .map(|(i, backend, job)| Box::pin(submit(i, backend, job)) as _)
        .collect();
    let answers: Vec<_> = futures_util::stream::iter(submits).buffered(SUBMITS_IN_FLIGHT).collect().await;
    for (i, answer) in answers {
        let w = &batch.claimed[i];
        let a = w.status.admission.as_ref().expect("claimed workloads to submit are admitted");
        let next = match answer {
            Ok(job) => {
                batch.dispatched += 1;
                dispatched(w, &a.cluster, &job)
            }
            Err(BackendError::Rejected(why) | BackendError::Unsupported(why)) => {
                batch.rejected += 1;
                crate::finished(w, Phase::Failed, "BackendRejected", why, None, batch.clock.now())
            }
            Err(BackendError::Unreachable(_)) => {
                batch.deferred += 1;
                continue;
            }
        };
        batch.decided.push((i, next));
    }
    batch
}

/// Writes a submitted batch's new statuses, clears their intents and commits (releasing
/// the claim).
async fn write(batch: Option<Batch>) -> Result<(), Error> {
    let Some(Batch { mut tx, claimed, decided, clock, .. }) = batch else { return Ok(()) };
    let transitions: Vec<Transition<'_>> =
        decided.into_iter().map(|(i, status)| Transition::new(&claimed[i], status)).collect();
    crate::write(&mut tx, &transitions, clock.now()).await?;
    let settled: Vec<(Uuid, u32)> =
        transitions.iter().map(|t| (t.workload.metadata.uid, t.workload.status.attempt)).collect();
    berth_store::dispatch::dispatch_intents_clear(&mut *tx, &settled).await?;
    berth_store::commit(tx).await
}

type Submit<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (usize, Result<JobStatus, BackendError>)> + Send + 'a>>;

async fn submit(
    i: usize,
    backend: Arc<dyn ClusterBackend>,
    job: JobRequest,
) -> (usize, Result<JobStatus, BackendError>) {
    (i, backend.submit(&job).await)
}

fn dispatched(w: &Workload, cluster: &str, job: &JobStatus) -> WorkloadStatus {
    let running = job.state == JobState::Running;
    WorkloadStatus {
        phase: if running { Phase::Running } else { Phase::Dispatched },
        backend_ref: Some(BackendRef {
            cluster: cluster.to_owned(),
            job_id: job.job_id.clone(),
            output: job.output.clone(),
            url: job.url.clone(),
        }),
        started_at: job.started_at,
        message: Some(format!("dispatched to {cluster} as job {}", job.job_id)),
        ..w.status.clone()
    }
}

/// The backend request for the workload's current attempt, which will get `grace` to
/// checkpoint when told to stop, and, where `api` is known, a token to say it did.
pub fn request(w: &Workload, grace: Duration, api: Option<&crate::JobApiConfig>) -> JobRequest {
    let a = w.status.admission.as_ref().expect("dispatched workloads are admitted");
    let r = &w.spec.tasks.resources;
    JobRequest {
        key: job_key(w),
        team: w.metadata.team.clone().unwrap_or_default(),
        workload: w.metadata.name.clone(),
        kind: w.spec.kind,
        flavor: a.flavor.clone(),
        tasks: w.spec.tasks.count,
        gpus_per_task: hundredths(r.gpus),
        cpus_per_task: r.cpus,
        memory_mib_per_task: r.memory_mib,
        nodes: a.placement.iter().map(|p| p.node.clone()).collect(),
        run: w.spec.run.clone(),
        max_runtime_seconds: w.spec.max_runtime_seconds,
        sim_duration_seconds: w.spec.sim.as_ref().map(|s| s.duration_seconds),
        resume: w.spec.resumable && w.status.attempt > 0,
        grace_seconds: u32::try_from(grace.as_secs()).unwrap_or(u32::MAX),
        api: api.map(|api| api.for_attempt(w)),
        notebook_token: api
            .filter(|_| w.spec.kind == berth_core::workload::WorkloadKind::Notebook)
            .map(|api| api.issuer.notebook_token(berth_core::auth::WorkloadScope::of(w))),
        service: w.metadata.labels.get(berth_core::workload::REPLICA_OF_LABEL).and_then(|uid| uid.parse().ok()).or((w
            .spec
            .kind
            == berth_core::workload::WorkloadKind::Inference)
            .then_some(w.metadata.uid)),
        sim_load: w.spec.sim.as_ref().map(|s| s.load.clone()).unwrap_or_default(),
    }
}
