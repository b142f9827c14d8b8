//! The scheduler loop: snapshot from the store → `berth_sched::schedule` → the plan
//! committed in one transaction (admissions, preemption marks, team usage; a cycle that
//! admits many commits its first admissions before), then pending reasons and queue
//! positions in another, every status write a compare-and-set on the version the snapshot
//! read: a workload that changed meanwhile is left for the next cycle. Reasons and
//! positions are written beside the workloads
//! ([`berth_store::workload::workload_explain`]); one written for a workload that changed
//! meanwhile is put right by the next cycle, which reads the change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_core::event::EventType;
use berth_core::team::{FlavorUsage, TeamStatus};
use berth_core::workload::{Admission, PendingReason, Phase, QueuePosition, TaskPlacement, Workload, WorkloadStatus};
use berth_core::{Error, WorkloadId};
use berth_sched::plan::PreemptionCause;
use berth_sched::snapshot::ONE_GPU;
use berth_store::event::NewEvent;
use berth_store::workload::{Explanation, StatusWrite};
use serde::Serialize;
use serde_json::json;

use crate::snapshot;
use crate::world::Explained;
use crate::{Context, EVENT_KIND, version};

/// A workload's queue position moves whenever one ahead of it is admitted or one jumps
/// ahead (a higher priority), so writing every move is a write of the whole queue, each
/// cycle (bench/api-load: 7 of every 10 rows the scheduler wrote, with 1,000 workloads
/// queued behind a stream of higher-priority ones). The head of the queue (the first
/// `POSITIONS_KEPT_CURRENT` of the whole queue, the first `TEAM_POSITIONS_KEPT_CURRENT` of
/// a team) is kept current; positions further back are written when their pending reason
/// changes and otherwise every `POSITIONS_REFRESH`, where they are more than a
/// `POSITIONS_TOLERANCE`th off, at most `REFRESH_WRITES_MAX` of them, the most off first.
/// Writing every move at each refresh rewrote the whole queue every 10 s, and keeping the
/// first 100 of each team current rewrote 100 rows per team at each admission (10 teams,
/// 12,000 pending on 512 GPUs, jobs of 30 to 90 s, one submission each 100 ms: 47,744
/// workload rows written in 20 s, now 5,025).
pub const POSITIONS_KEPT_CURRENT: u32 = 100;
pub const TEAM_POSITIONS_KEPT_CURRENT: u32 = 10;
pub const POSITIONS_REFRESH: Duration = Duration::from_secs(10);
pub const POSITIONS_TOLERANCE: u32 = 10;

/// At most this many positions and reasons' numbers are written at one refresh, the most
/// off first; the rest wait for the next. Under reclaim churn the fair-share order moves
/// whole teams, so most of the queue is more than a tenth off at every refresh (10 teams,
/// 11,500 preemptible pending on 512 sim GPUs: the whole queue rewritten each 10 s).
pub const REFRESH_WRITES_MAX: usize = 1_000;

/// At most this many pending workloads behind the head have a new reason (a first one, or
/// one of another code) written in one cycle, the front of the queue first; the rest in the
/// cycles after (a cycle that explained something runs again, and one that left some
/// rests no longer than it ran). A burst of 20,000 submissions with nowhere to run them had
/// the cycle after it write 20,000 rows (600-1,000 ms of a 0.9-1.4 s cycle at 100,000
/// running, bench/controllers scale), which held up every admission behind it (reasons are
/// now written after the cycle's admissions have committed). At 2,000 a cycle, a burst of
/// 9,000 creates a second outran them: 57,000 workloads had no reason after 12 s. The
/// head's writes, and positions entering or leaving it, are never held back.
pub const NEW_REASONS_MAX: usize = 10_000;

/// When a pending workload's change is written.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
enum Due {
    Never,
    /// At a refresh, among [`REFRESH_WRITES_MAX`], by how far off it is (the larger first).
    Refresh(f64),
    Now,
}

/// When a queue position that moved from `was` to `is` is written: at once into, within or
/// out of the head (one left standing where it was would show twice in the head, as
/// `/api/v1/queue` lists it), at a refresh when it is more than a `POSITIONS_TOLERANCE`th
/// off, by how far off (relative to where it is now).
fn position_due(was: &QueuePosition, is: &QueuePosition) -> Due {
    let off = |was: u32, is: u32| f64::from(was.abs_diff(is)) / f64::from(is.max(1));
    let tolerance = 1.0 / f64::from(POSITIONS_TOLERANCE);
    let off = off(was.global, is.global).max(off(was.team, is.team));
    if was == is {
        Due::Never
    } else if in_head(was) || in_head(is) {
        Due::Now
    } else if off > tolerance {
        Due::Refresh(off)
    } else {
        Due::Never
    }
}

/// Within the first `POSITIONS_KEPT_CURRENT` of the queue or `TEAM_POSITIONS_KEPT_CURRENT`
/// of the team.
fn in_head(is: &QueuePosition) -> bool {
    is.global <= POSITIONS_KEPT_CURRENT || is.team <= TEAM_POSITIONS_KEPT_CURRENT
}

/// When a workload's pending reason is written, at `position`: a new reason at once; the
/// same reason with other numbers (GPUs free, room held for another) at once within the
/// head, else at a refresh, after every position off. Each workload admitted or ended
/// changes the GPUs free that the reasons of all work waiting for room name (10 teams,
/// 11,500 pending on 512 sim GPUs, preemptible jobs of 30 to 90 s: 50,011 rows written in
/// 20 s).
fn reason_due(was: Option<&PendingReason>, is: &PendingReason, position: Option<&QueuePosition>) -> Due {
    match was {
        Some(was) if was == is => Due::Never,
        Some(was) if was.code == is.code && !position.is_none_or(in_head) => Due::Refresh(0.0),
        _ => Due::Now,
    }
}

/// How many distinct reasons, put in words, a cycle keeps at hand.
const WORDED_KEPT: usize = 8;

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SchedulerStatus {
    pub pending: usize,
    pub running: usize,
    pub admitted: usize,
    pub preempted: usize,
    /// Pending workloads whose reason or queue position changed.
    pub explained: usize,
    /// Pending workloads behind the head whose new reason waits for a later cycle
    /// ([`NEW_REASONS_MAX`]).
    pub deferred: usize,
    /// GPUs free on the nodes that take work, once this cycle's admissions are placed
    /// (counted only in a cycle that admitted nothing).
    pub free_gpus: f64,
    pub teams_updated: usize,
    /// Writes skipped because the workload changed after the snapshot was read.
    pub stale: usize,
    /// Whether the workloads were read in full this cycle (else: the changes since the
    /// last, see [`crate::world`]).
    pub full_read: bool,
    /// The workloads read from the store: all of them, or those written or deleted since.
    pub changes_read: usize,
    /// The workloads the snapshot was made of anew (the others as the last one made them:
    /// [`snapshot::Derivations`]).
    pub derived: usize,
    pub cycle_ms: f64,
    /// Where the cycle's time went (milliseconds): reading the world, building the
    /// snapshot, planning, turning the plan into status writes and reasons, writing them,
    /// and putting what was written into the kept world.
    pub read_ms: f64,
    pub build_ms: f64,
    pub plan_ms: f64,
    pub explain_ms: f64,
    pub write_ms: f64,
    pub kept_ms: f64,
}

impl crate::runner::Report for SchedulerStatus {
    fn changes(&self) -> usize {
        self.admitted + self.preempted + self.explained + self.teams_updated
    }

    /// A cycle that admitted and preempted nothing rests as long as it ran (at most
    /// [`REST_AT_MOST`]) before the next, however soon that is woken; one that did goes on
    /// after `min_cycle_interval`. A cycle visits every pending workload, and while no room
    /// comes free each one woken by new submissions only gives them their reasons: in a
    /// burst of creates with nowhere to run them, cycles over up to 108,000 pending ran back
    /// to back (8 a second) and held a core of the two the API and Postgres share
    /// (bench/api-load: 5,324-5,693 creates/s; resting, 6,232-6,549/s).
    fn rest(&self) -> Duration {
        if self.admitted + self.preempted > 0 { Duration::ZERO } else { self.took().min(REST_AT_MOST) }
    }

    /// While only submissions wake it, a cycle that admitted and preempted nothing, left
    /// no GPU free and no new reason unwritten rests [`RESTS_PER_CYCLE`] times as long as
    /// it ran (at most [`REST_AT_MOST`]); a change that may free room (work that ended, a
    /// requeue, a cluster's or a team's change) ends that once [`Report::rest`] is over.
    /// With GPUs free, a new submission may fit them: a 1-GPU job submitted into a gap
    /// behind 12,000 waiting waited a second more for its cycle. Resting only as long as a cycle ran still
    /// gave the scheduler half a core in a burst of creates (bench/api-load: cycles of
    /// 35-90 ms over up to 108,000 pending, 8 a second; 6,278-7,468 creates/s, and 9,541/s
    /// without the controllers).
    fn rest_for_submissions(&self) -> Duration {
        if self.admitted + self.preempted > 0 {
            Duration::ZERO
        } else if self.deferred > 0 || self.free_gpus > 0.0 {
            self.rest()
        } else {
            self.took().saturating_mul(RESTS_PER_CYCLE).min(REST_AT_MOST).max(self.rest())
        }
    }
}

impl SchedulerStatus {
    fn took(&self) -> Duration {
        Duration::try_from_secs_f64(self.cycle_ms / 1000.0).unwrap_or(REST_AT_MOST)
    }
}

/// How many times as long as it ran a cycle that admitted nothing rests while only
/// submissions wake it ([`SchedulerStatus`]'s `rest_for_submissions`): the scheduler then
/// spends at most a fifth of a core on them.
pub const RESTS_PER_CYCLE: u32 = 4;

/// A cycle that admits more than this commits its first this many admissions before the
/// rest of its writes (see [`reconcile`]). With 1,000 admitted at once (bench/slurm from a
/// backlog) the cycle's write took 45-50 ms, the dispatcher's start waited for all of it,
/// and Slurm idled meanwhile.
pub const EARLY_ADMISSIONS: usize = 100;

/// The longest a cycle that admitted nothing rests ([`SchedulerStatus`]'s `rest`): a
/// workload that could run waits at most this long for the cycle that admits it.
pub const REST_AT_MOST: Duration = Duration::from_secs(1);

/// One scheduling cycle.
///
/// # Errors
/// Store errors; `Internal` if the snapshot is inconsistent.
pub async fn reconcile(ctx: &Context) -> Result<SchedulerStatus, Error> {
    let started = Instant::now();
    let ms = |since: Instant| since.elapsed().as_secs_f64() * 1000.0;
    let (world, read) = ctx.world.load(&ctx.db, ctx.clock.now()).await?;
    let read_ms = ms(started);
    // Building the snapshot and planning take 100s of milliseconds of CPU at 100,000
    // workloads: on a blocking thread, so that the runtime's workers keep serving requests
    // meanwhile (on a 2-core machine, one blocked worker held GETs for 250 ms).
    let starvation_after = ctx.config.starvation_after.as_secs() as i64;
    let (world, built, plan, build_ms, plan_ms) = crate::off_runtime(move || {
        let phase = Instant::now();
        let built = snapshot::build(&world, starvation_after);
        let build_ms = ms(phase);
        let phase = Instant::now();
        let plan = berth_sched::schedule(&built.snapshot).map_err(|e| Error::Internal(e.to_string()));
        (world, built, plan, build_ms, ms(phase))
    })
    .await?;
    let plan = plan?;
    let s = &built.snapshot;
    let phase = Instant::now();
    let name = |w: &Workload| format!("{}/{}", w.metadata.team.as_deref().unwrap_or_default(), w.metadata.name);
    let running_name = |i: usize| name(&world.workloads[built.running[i]]);
    let pending_name = |i: usize| name(&world.workloads[built.pending[i]]);
    // A victim's grace period runs from its cancel (sent after this cycle if not yet).
    let now = world.now;
    let stops_by = |i: usize| {
        crate::stops_by(
            &ctx.config,
            &world.workloads[built.running[i]],
            &world.clusters[s.running[i].cluster].spec,
            now,
        )
    };

    let submitted: std::collections::HashMap<uuid::Uuid, Option<chrono::DateTime<chrono::Utc>>> = plan
        .admissions
        .iter()
        .map(|a| &world.workloads[built.pending[a.workload]])
        .map(|w| (w.metadata.uid, w.status.submitted_at))
        .collect();
    let victims: std::collections::HashMap<uuid::Uuid, (String, String)> = plan
        .preemptions
        .iter()
        .map(|p| &world.workloads[built.running[p.victim]])
        .map(|w| {
            let flavor = w.status.admission.as_ref().map(|a| a.flavor.clone()).unwrap_or_default();
            (w.metadata.uid, (w.metadata.team.clone().unwrap_or_default(), flavor))
        })
        .collect();
    let mut writes = Vec::new();
    let mut events = Vec::new();
    let mut status = SchedulerStatus {
        pending: s.pending.len(),
        running: s.running.len(),
        full_read: read == crate::world::Read::Full,
        changes_read: match read {
            crate::world::Read::Changes(n) => n,
            crate::world::Read::Full => world.workloads.len(),
        },
        derived: built.derived,
        read_ms,
        build_ms,
        plan_ms,
        ..Default::default()
    };
    for a in &plan.admissions {
        let w = &world.workloads[built.pending[a.workload]];
        let placement =
            a.placement.iter().map(|p| TaskPlacement { node: s.nodes[p.node].name.clone(), gpu: p.device }).collect();
        let admission = Admission {
            cluster: s.clusters[a.cluster].name.clone(),
            flavor: s.flavors[a.flavor].clone(),
            borrowed: a.borrowed,
            placement,
        };
        let quota = if a.borrowed { "borrowed quota" } else { "its guarantee" };
        let message = format!("admitted to {}/{} on {quota}", admission.cluster, admission.flavor);
        let tasks = &s.pending[a.workload].tasks;
        events.push(NewEvent {
            uid: w.metadata.uid,
            event_type: EventType::Normal,
            reason: "Admitted",
            message: message.clone(),
            details: Some(json!({
                "team": w.metadata.team, "flavor": admission.flavor, "cluster": admission.cluster,
                "gpus": f64::from(tasks.total_gpus()) / 100.0, "borrowed": a.borrowed,
                "preemptible": w.spec.preemptible, "attempt": w.status.attempt,
            })),
        });
        let next = WorkloadStatus {
            phase: Phase::Admitted,
            admission: Some(admission),
            pending_reason: None,
            queue_position: None,
            estimated_start: None,
            preempted_for: None,
            reason: None,
            message: Some(message),
            ..w.status.clone()
        };
        writes.push(StatusWrite { uid: WorkloadId(w.metadata.uid), resource_version: version(w)?, status: next });
    }
    for p in &plan.preemptions {
        let w = &world.workloads[built.running[p.victim]];
        if w.status.phase == Phase::Preempting || w.stopping() {
            continue;
        }
        let (cause, by) = match p.cause {
            PreemptionCause::Reclaim { team, workload } => {
                (format!("team {} reclaims its guarantee", s.teams[team].name), pending_name(workload))
            }
            PreemptionCause::Priority { workload } => {
                ("a higher-priority workload of the team".to_owned(), pending_name(workload))
            }
        };
        let message = format!("preempted: {cause} for {by}");
        events.push(NewEvent {
            uid: w.metadata.uid,
            event_type: EventType::Warning,
            reason: "Preempted",
            message: message.clone(),
            details: Some(json!({"for": by, "cause": p.cause})),
        });
        let preemptor = &world.workloads[built.pending[p.cause.workload()]];
        let next = WorkloadStatus {
            phase: Phase::Preempting,
            reason: Some("Preempted".into()),
            message: Some(message),
            preempted_for: Some(preemptor.metadata.uid),
            ..w.status.clone()
        };
        writes.push(StatusWrite { uid: WorkloadId(w.metadata.uid), resource_version: version(w)?, status: next });
    }
    // The refresh writes what behind the head waited for it: positions and reasons' numbers.
    let refresh = ctx.world.positions_due(ctx.clock.now(), POSITIONS_REFRESH).await;
    // What is explained is written beside the workloads ([`berth_store::workload::workload_explain`]),
    // only for a change that is taken: at 73,000 pending, putting a write together for each
    // of those held back (their status and reason cloned) was two thirds of the 81 ms the
    // cycle took to explain them.
    let mut explanations: Vec<(Arc<Workload>, Arc<PendingReason>, Option<QueuePosition>)> = Vec::new();
    let mut at_refresh = Vec::new();
    let (mut new_behind_head, mut deferred) = (0, 0);
    let mut explain =
        |w: &Arc<Workload>, reason: &Arc<PendingReason>, position: Option<QueuePosition>| -> Option<f64> {
            let moved = match (&w.status.queue_position, &position) {
                (Some(was), Some(is)) => position_due(was, is),
                (was, is) if was != is => Due::Now,
                _ => Due::Never,
            };
            let reasoned = reason_due(w.status.pending_reason.as_ref(), reason, position.as_ref());
            match if reasoned > moved { reasoned } else { moved } {
                Due::Refresh(off) if refresh => return Some(off),
                Due::Refresh(_) | Due::Never => {}
                Due::Now => {
                    let behind_head = !position.as_ref().is_some_and(in_head)
                        && !w.status.queue_position.as_ref().is_some_and(in_head);
                    if behind_head && new_behind_head == NEW_REASONS_MAX {
                        deferred += 1;
                    } else {
                        new_behind_head += usize::from(behind_head);
                        explanations.push((w.clone(), reason.clone(), position));
                    }
                }
            }
            None
        };
    // Workloads of one shape waiting side by side mostly wait for the same reason: a reason
    // is put in words once per run of equal ones (20,000 waiting took 100 ms otherwise).
    let mut worded: Vec<(&berth_sched::plan::Reason, Arc<PendingReason>)> = Vec::new();
    for wt in &plan.waiting {
        let w = &world.workloads[built.pending[wt.workload]];
        let at = match worded.iter().position(|(r, _)| *r == &wt.reason) {
            Some(at) => at,
            None => {
                if worded.len() == WORDED_KEPT {
                    worded.remove(0);
                }
                let words = crate::explain::pending_reason(s, &wt.reason, running_name, stops_by, pending_name);
                worded.push((&wt.reason, Arc::new(words)));
                worded.len() - 1
            }
        };
        let position = Some(QueuePosition { global: wt.position, team: wt.team_position });
        if let Some(off) = explain(w, &worded[at].1, position) {
            at_refresh.push((off, w, worded[at].1.clone(), position));
        }
    }
    for (i, reason) in &built.unschedulable {
        let w = &world.workloads[*i];
        let reason = Arc::new(reason.clone());
        if let Some(off) = explain(w, &reason, None) {
            at_refresh.push((off, w, reason, None));
        }
    }
    status.deferred = deferred;
    if plan.admissions.is_empty() {
        status.free_gpus = free_gpus(s);
    }
    at_refresh.sort_by(|(a, ..), (b, ..)| b.total_cmp(a));
    explanations.extend(
        at_refresh.into_iter().take(REFRESH_WRITES_MAX).map(|(_, w, reason, position)| (w.clone(), reason, position)),
    );
    let mut kept_explained = Vec::with_capacity(explanations.len());
    let explanations: Vec<Explanation> = explanations
        .into_iter()
        .map(|(w, reason, position)| {
            kept_explained.push((
                w.metadata.uid,
                version(&w)?,
                Explained::Reason { pending_reason: PendingReason::clone(&reason), queue_position: position },
            ));
            Ok(Explanation {
                uid: WorkloadId(w.metadata.uid),
                attempt: w.status.attempt,
                pending_reason: Some(Arc::unwrap_or_clone(reason)),
                queue_position: position,
            })
        })
        .collect::<Result<_, Error>>()?;

    let mut usage = team_usage(s, &plan.shares);
    let mut team_writes = Vec::new();
    let mut usage_changes = Vec::new();
    for (i, t) in world.teams.iter().enumerate() {
        let next = TeamStatus { usage: usage.remove(&i).unwrap_or_default(), ..TeamStatus::default() };
        if t.status.usage != next.usage {
            let uid = snapshot::team_uid(&world, i);
            usage_changes.extend(changed_usage(&t.status, &next).map(|(f, a, b)| (uid.0, f, a, b)));
            team_writes.push((uid, next.usage));
        }
    }
    status.teams_updated = team_writes.len();
    status.explain_ms = ms(phase);
    let phase = Instant::now();

    // The first admissions of a cycle that admits many are committed on their own, with
    // their events, so that their dispatch starts while the rest is written. Any part of a
    // plan's admissions fits where the whole plan did, and no admission counts on room a
    // victim is still to free (its preemptor waits), so a cycle stopped between the two
    // commits leaves work the next cycle plans from as from any other. Admissions come first
    // in `writes` and in `events`, one of each per admission.
    let early = if plan.admissions.len() > EARLY_ADMISSIONS { EARLY_ADMISSIONS } else { 0 };
    let mut later_events = events.split_off(early);
    let mut statuses_written = Vec::new();
    if early > 0 {
        let mut tx = ctx.begin().await?;
        statuses_written = write_with_events(&mut tx, &writes[..early], &mut events).await?;
        berth_store::commit(tx).await?;
    }
    if early < writes.len() || !team_writes.is_empty() || !usage_changes.is_empty() {
        let mut tx = ctx.begin().await?;
        let later_written = write_with_events(&mut tx, &writes[early..], &mut later_events).await?;
        berth_store::team::team_write_usage(&mut tx, &team_writes).await?;
        berth_store::usage::usage_record(&mut *tx, &usage_changes).await?;
        berth_store::commit(tx).await?;
        statuses_written.extend(later_written);
    }
    events.extend(later_events);
    // What is explained is written once the admissions have committed: thousands of first
    // reasons after a burst of submissions do not hold them up.
    if !explanations.is_empty() {
        let mut tx = ctx.begin().await?;
        let explained = berth_store::workload::workload_explain(&mut *tx, &explanations).await?;
        berth_store::commit(tx).await?;
        status.explained = usize::try_from(explained).unwrap_or(usize::MAX);
    }
    status.stale = writes.len() - statuses_written.len();
    let written: std::collections::HashSet<_> = statuses_written.iter().map(|w| w.uid).collect();
    for w in &writes {
        if written.contains(&w.uid.0) {
            match w.status.phase {
                Phase::Admitted => status.admitted += 1,
                Phase::Preempting => status.preempted += 1,
                _ => {}
            }
        }
    }
    let mut counted = Vec::new();
    for e in &events {
        let d = e.details.as_ref();
        let label = |k: &str| d.and_then(|d| d[k].as_str()).unwrap_or_default().to_owned();
        match e.reason {
            "Admitted" => counted.push(Counted::Admitted {
                team: label("team"),
                flavor: label("flavor"),
                // The wait of a first admission: from submission (a requeued workload's
                // submission time is its first).
                wait: d.filter(|d| d["attempt"] == 0).and(submitted.get(&e.uid).copied().flatten()).map(|at| now - at),
            }),
            "Preempted" => counted.push(Counted::Preempted {
                cause: d.and_then(|d| d["cause"]["type"].as_str()).unwrap_or_default().to_owned(),
                team: victims.get(&e.uid).cloned().unwrap_or_default(),
            }),
            _ => {}
        }
    }
    status.write_ms = ms(phase);
    let phase = Instant::now();
    ctx.world.wrote(writes, statuses_written).await;
    ctx.world.explained(kept_explained).await;
    status.kept_ms = ms(phase);
    if refresh {
        ctx.world.positions_written(ctx.clock.now()).await;
    }
    for c in counted {
        c.record();
    }
    status.cycle_ms = ms(started);
    snapshot::give_back(&world, built);
    Ok(status)
}

/// Writes the statuses and records the events of the workloads written (`events` keeps
/// only those): one that changed since the snapshot is left, with its event, for the next
/// cycle.
async fn write_with_events(
    tx: &mut berth_store::Tx<'static>,
    writes: &[StatusWrite],
    events: &mut Vec<NewEvent>,
) -> Result<Vec<berth_store::workload::StatusWritten>, Error> {
    let written = berth_store::workload::workload_write_statuses(tx, writes).await?;
    let uids: std::collections::HashSet<_> = written.iter().map(|w| w.uid).collect();
    events.retain(|e| uids.contains(&e.uid));
    berth_store::event::event_record_many(&mut **tx, EVENT_KIND, events).await?;
    Ok(written)
}

/// GPUs free on nodes that take work (neither they nor their cluster cordoned), as what runs
/// leaves them.
fn free_gpus(s: &berth_sched::Snapshot) -> f64 {
    let mut free: Vec<i64> = s
        .nodes
        .iter()
        .map(|n| {
            let takes_work = !n.cordoned && !s.clusters[n.cluster].cordoned;
            if takes_work { i64::from(n.gpus.saturating_sub(n.unavailable_gpus)) * i64::from(ONE_GPU) } else { 0 }
        })
        .collect();
    for r in &s.running {
        for p in &r.placement {
            free[p.node] -= i64::from(r.tasks.gpus);
        }
    }
    free.into_iter().map(|f| f.max(0)).sum::<i64>() as f64 / f64::from(ONE_GPU)
}

/// The flavors whose allocated or borrowed GPUs differ between two statuses of a team, with
/// the new values (a flavor no longer used: zeros).
fn changed_usage<'a>(before: &'a TeamStatus, after: &'a TeamStatus) -> impl Iterator<Item = (String, f64, f64)> + 'a {
    let of = |s: &TeamStatus, flavor: &str| {
        s.usage.iter().find(|u| u.flavor == flavor).map_or((0.0, 0.0), |u| (u.allocated, u.borrowed))
    };
    let mut flavors: Vec<&str> = before.usage.iter().chain(&after.usage).map(|u| u.flavor.as_str()).collect();
    flavors.sort_unstable();
    flavors.dedup();
    flavors.into_iter().filter_map(move |f| {
        let (old, new) = (of(before, f), of(after, f));
        (old != new).then(|| (f.to_owned(), new.0, new.1))
    })
}

/// Each team's usage per flavor, its own and its subtree's (the team and every team below
/// it), from the plan's shares; a team appears for a flavor when it or a team below it has
/// a share there.
fn team_usage(s: &berth_sched::Snapshot, shares: &[berth_sched::plan::TeamShare]) -> BTreeMap<usize, Vec<FlavorUsage>> {
    // (team, flavor) → (allocated, fair share), own and subtree.
    let mut own: BTreeMap<(usize, usize), (f64, f64)> = BTreeMap::new();
    let mut subtree: BTreeMap<(usize, usize), (f64, f64)> = BTreeMap::new();
    for share in shares {
        own.insert((share.team, share.flavor), (share.used, share.fair_share));
        let mut team = Some(share.team);
        while let Some(t) = team {
            let sum = subtree.entry((t, share.flavor)).or_default();
            sum.0 += share.used;
            sum.1 += share.fair_share;
            team = s.teams[t].parent;
        }
    }
    let mut usage: BTreeMap<usize, Vec<FlavorUsage>> = BTreeMap::new();
    let own_quota = berth_sched::snapshot::OwnQuota::of(s);
    for (&(t, f), &(subtree_allocated, subtree_fair_share)) in &subtree {
        let (allocated, fair_share) = own.get(&(t, f)).copied().unwrap_or_default();
        let guaranteed = f64::from(s.teams[t].quotas[f].guaranteed);
        // The team's own work borrows beyond its own guarantee (what its teams' leave).
        let own_guaranteed = own_quota.guaranteed(t, f) as f64 / f64::from(berth_sched::snapshot::ONE_GPU);
        usage.entry(t).or_default().push(FlavorUsage {
            flavor: s.flavors[f].clone(),
            allocated,
            borrowed: (allocated - own_guaranteed).max(0.0),
            fair_share,
            subtree_allocated,
            subtree_borrowed: (subtree_allocated - guaranteed).max(0.0),
            subtree_fair_share,
        });
    }
    usage
}

/// What a cycle counts in the `berth_` metrics, once its writes are committed.
enum Counted {
    Admitted { team: String, flavor: String, wait: Option<chrono::TimeDelta> },
    Preempted { cause: String, team: (String, String) },
}

impl Counted {
    fn record(self) {
        match self {
            Self::Admitted { team, flavor, wait } => {
                if let Some(wait) = wait {
                    let seconds = wait.num_milliseconds().max(0) as f64 / 1000.0;
                    metrics::histogram!("berth_admission_wait_seconds", "team" => team.clone()).record(seconds);
                }
                metrics::counter!("berth_admissions_total", "team" => team, "flavor" => flavor).increment(1);
            }
            Self::Preempted { cause, team: (team, flavor) } => {
                metrics::counter!("berth_preemptions_total", "team" => team, "flavor" => flavor, "cause" => cause)
                    .increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_written_at_once_within_the_head_and_at_a_refresh_when_a_tenth_off() {
        let at = |global, team| QueuePosition { global, team };
        let now = |was, is| position_due(&was, &is) == Due::Now;
        let at_refresh = |was, is| matches!(position_due(&was, &is), Due::Refresh(_));
        // The head of the queue, or of the team: every move, every cycle.
        assert!(now(at(100, 90), at(99, 89)));
        assert!(now(at(5_000, 11), at(4_999, 10)));
        assert_eq!(position_due(&at(5_000, 12), &at(4_999, 11)), Due::Never, "not in either head");
        assert_eq!(position_due(&at(7, 3), &at(7, 3)), Due::Never, "not moved");
        assert!(now(at(100, 50), at(105, 55)), "out of the head");
        assert!(now(at(500, 10), at(505, 11)), "out of the team's head");
        // Further back, only at a refresh and more than a tenth off, in either position.
        assert!(at_refresh(at(5_000, 500), at(4_000, 499)));
        assert!(at_refresh(at(4_500, 500), at(4_499, 400)));
        assert_eq!(position_due(&at(4_400, 440), &at(4_000, 400)), Due::Never, "a tenth off is close enough");
        assert_eq!(position_due(&at(1_000, 200), &at(1_050, 210)), Due::Never);
        assert!(at_refresh(at(1_000, 200), at(1_120, 210)), "moved back");
        // The most off first.
        assert!(position_due(&at(20_000, 2_000), &at(200, 20)) > position_due(&at(5_000, 500), &at(4_000, 400)));
        assert!(Due::Now > position_due(&at(20_000, 2_000), &at(200, 20)));
    }

    #[test]
    fn a_reason_with_new_numbers_behind_the_head_waits_for_the_refresh_a_new_reason_does_not() {
        let reason =
            |code: &str, message: &str| PendingReason { code: code.into(), message: message.into(), details: None };
        let (eight, ten) = (reason("NoClusterFits", "8 GPUs free"), reason("NoClusterFits", "10 GPUs free"));
        let fair = reason("FairShareReached", "at its fair share");
        let (head, back) = (QueuePosition { global: 50, team: 50 }, QueuePosition { global: 500, team: 50 });
        assert_eq!(reason_due(Some(&eight), &eight, Some(&back)), Due::Never, "unchanged");
        assert_eq!(reason_due(None, &eight, Some(&back)), Due::Now, "the first");
        assert_eq!(reason_due(Some(&eight), &fair, Some(&back)), Due::Now, "another reason");
        assert_eq!(reason_due(Some(&eight), &ten, Some(&head)), Due::Now, "new numbers in the head");
        assert_eq!(reason_due(Some(&eight), &ten, None), Due::Now, "new numbers without a place in the queue");
        assert_eq!(reason_due(Some(&eight), &ten, Some(&back)), Due::Refresh(0.0), "new numbers behind the head");
        // After every position more than a tenth off.
        let off =
            position_due(&QueuePosition { global: 5_000, team: 500 }, &QueuePosition { global: 4_000, team: 400 });
        assert!(reason_due(Some(&eight), &ten, Some(&back)) < off);
    }
}
