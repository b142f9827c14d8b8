//! Runs every reconciler in its own loop: woken by the changes it declares it follows (the
//! store's change feed, [`berth_store::changes`]) or its period, whichever comes first;
//! wake-ups that arrive while a pass runs fold into one more pass. Each controller's
//! status is stored for `/api/v1/controllers`: after a pass that changed something (at
//! most once a second), after a failed one, and every 10 s while nothing changes.
//!
//! The controllers are registered by value in one list ([`all`]); each declares its name,
//! what it does, its period, the least gap between its passes and what wakes it, so the
//! list's order means nothing.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use berth_core::Error;
use berth_core::workload::Phase;
use berth_store::changes::{Change, ChangeFeed};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::{
    Config, Context, autoscaler, budgets, cluster_health, deletion, dispatcher, estimates, fair_sharing, idle, orphans,
    preemption, retention, scheduler, status_sync,
};

/// A reconciler's typed status; each module implements it for its own.
pub trait Report: Serialize + Send {
    /// How many objects the pass changed; 0 means it is caught up.
    fn changes(&self) -> usize;

    /// Whether something may come due with time alone (a grace period, a job that stops):
    /// if not, a controller that changes wake passes only on a change or its resync.
    fn waits_on_time(&self) -> bool {
        true
    }

    /// How long the controller waits after this pass before the next, however soon it is
    /// woken (beyond its least gap).
    fn rest(&self) -> Duration {
        Duration::ZERO
    }

    /// How long the controller waits after this pass, at least [`Report::rest`], while the
    /// only changes that wake it are submissions: any other change ([`room_change`]) ends
    /// the wait once `rest` is over.
    fn rest_for_submissions(&self) -> Duration {
        self.rest()
    }
}

/// What a pass did: how many objects it changed, whether it waits on time, how long it
/// rests ([`Report::rest`]), and its status as JSON (what `/api/v1/controllers` shows).
pub struct Passed {
    pub changes: usize,
    pub waits_on_time: bool,
    pub rest: Duration,
    pub rest_for_submissions: Duration,
    pub status: serde_json::Value,
}

impl Passed {
    /// What a module's typed status says.
    pub fn of<S: Report>(status: &S) -> Self {
        Self {
            changes: status.changes(),
            waits_on_time: status.waits_on_time(),
            rest: status.rest(),
            rest_for_submissions: status.rest_for_submissions(),
            status: serde_json::to_value(status).unwrap_or_default(),
        }
    }
}

/// One pass of a reconciler.
pub type Pass<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Passed, Error>> + Send + 'a>>;

/// Which changes wake a reconciler before its period is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WokenBy {
    /// Only its period.
    Period,
    /// Every change but one that concerns only pending work: a submission of new
    /// workloads, or a status write whose every workload enters `Pending` (the scheduler's
    /// pending reasons and queue positions, a requeue). Only the scheduler acts on those;
    /// the others act on what it admits or preempts, on work that reached a backend, and on
    /// deletions and cancellations (a cancellation keeps a phase past `Pending`).
    BeyondPending,
    /// A change that can alter what the scheduler decides: anything but a write of
    /// workload statuses entering `Admitted` or `Preempting` (the scheduler's own writes: a
    /// pass that wrote runs again anyway) or `Dispatched` or `Running` (which take or free
    /// nothing it counts).
    SchedulingChange,
}

impl WokenBy {
    /// Whether `change` wakes a reconciler that declared `self`.
    pub fn by(self, change: &Change) -> bool {
        match self {
            Self::Period => false,
            Self::BeyondPending => match change {
                Change::WorkloadStatuses(phases) => !phases.iter().all(|p| *p == Phase::Pending),
                Change::Submitted => false,
                Change::Table(_) => true,
            },
            Self::SchedulingChange => match change {
                Change::WorkloadStatuses(phases) => !phases
                    .iter()
                    .all(|p| matches!(p, Phase::Admitted | Phase::Dispatched | Phase::Running | Phase::Preempting)),
                Change::Table(_) | Change::Submitted => true,
            },
        }
    }
}

/// Whether `change` may free or take room, or change what fits where: a change that wakes
/// the scheduler other than a submission of new workloads (which ends a rest for
/// submissions, [`Report::rest_for_submissions`]).
pub fn room_change(change: &Change) -> bool {
    *change != Change::Submitted && WokenBy::SchedulingChange.by(change)
}

/// Counts the room changes ([`room_change`]) the listener has seen, and wakes those who
/// wait for the next.
#[derive(Default)]
struct RoomChanges {
    seen: AtomicU64,
    next: Notify,
}

impl RoomChanges {
    fn seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    fn one_more(&self) {
        self.seen.fetch_add(1, Ordering::AcqRel);
        self.next.notify_waiters();
    }

    /// Waits until `deadline`, or until a room change beyond the first `seen`.
    async fn wait_until(&self, seen: u64, deadline: Instant) {
        loop {
            let next = self.next.notified();
            tokio::pin!(next);
            next.as_mut().enable();
            if self.seen() != seen {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline.into()) => return,
                () = next => {}
            }
        }
    }
}

/// A controller as the runner sees it (omicron's background task, kube-runtime's
/// controller): what it is, when it runs, and its pass.
pub trait Reconciler: Send + 'static {
    fn name(&self) -> &'static str;
    /// What it does, in a line (for the docs and the logs).
    fn description(&self) -> &'static str;
    /// How long it waits for a wake-up before it runs anyway.
    fn period(&self, config: &Config) -> Duration;
    /// The least time between two passes (wake-ups within it become one pass).
    fn min_gap(&self, config: &Config) -> Duration {
        let _ = config;
        Duration::ZERO
    }
    fn woken_by(&self) -> WokenBy;
    fn reconcile<'a>(&'a mut self, ctx: &'a Context) -> Pass<'a>;
}

/// Least time between two dispatcher passes. Every stored change wakes the controllers (a
/// burst of 1,000 submissions is 1,000 wake-ups); wake-ups within the gap become one pass.
/// (Preemption and deletion use the scheduler's `min_cycle_interval`.)
const DISPATCHER_GAP: Duration = Duration::from_millis(20);

/// How often pending work's start is estimated again.
const ESTIMATE_PERIOD: Duration = Duration::from_secs(10);

/// How often budgets are added up again (running work adds to them all the time), and the
/// least gap between two passes when changes wake them.
const BUDGET_PERIOD: Duration = Duration::from_secs(30);
const BUDGET_GAP: Duration = Duration::from_secs(10);

/// How often recent use is added up again for fairness over time (it moves slowly: half-lives
/// are an hour or more).
const FAIR_SHARING_PERIOD: Duration = Duration::from_secs(60);

/// How often retention looks for workloads to remove (it counts in days).
const RETENTION_PERIOD: Duration = Duration::from_secs(300);

/// One of Berth's controllers: a module's `reconcile` with its declarations.
struct Task {
    name: &'static str,
    description: &'static str,
    woken_by: WokenBy,
    period: fn(&Config) -> Duration,
    min_gap: fn(&Config) -> Duration,
    pass: for<'a> fn(&'a Context) -> Pass<'a>,
}

impl Reconciler for Task {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        self.description
    }
    fn period(&self, config: &Config) -> Duration {
        (self.period)(config)
    }
    fn min_gap(&self, config: &Config) -> Duration {
        (self.min_gap)(config)
    }
    fn woken_by(&self) -> WokenBy {
        self.woken_by
    }
    fn reconcile<'a>(&'a mut self, ctx: &'a Context) -> Pass<'a> {
        (self.pass)(ctx)
    }
}

/// A module's pass, boxed so every task has the same type.
macro_rules! pass {
    ($module:ident) => {
        |ctx| Box::pin(async move { $module::reconcile(ctx).await.map(|s| Passed::of(&s)) })
    };
}

/// Every controller Berth runs, in no particular order.
pub fn all() -> Vec<Box<dyn Reconciler>> {
    let zero = |_: &Config| Duration::ZERO;
    let tasks = [
        Task {
            name: "scheduler",
            description: "admits pending work within quotas and fair shares, and marks what to preempt",
            woken_by: WokenBy::SchedulingChange,
            period: |c| c.resync,
            min_gap: |c| c.min_cycle_interval,
            pass: pass!(scheduler),
        },
        Task {
            name: "dispatcher",
            description: "submits each admitted workload to its cluster as one job",
            woken_by: WokenBy::BeyondPending,
            period: |c| c.resync,
            min_gap: |_| DISPATCHER_GAP,
            pass: pass!(dispatcher),
        },
        Task {
            name: "preemption",
            description: "cancels the jobs of preempted workloads with a grace period, then requeues them",
            woken_by: WokenBy::BeyondPending,
            period: |c| c.sync_interval,
            min_gap: |c| c.min_cycle_interval,
            pass: pass!(preemption),
        },
        Task {
            name: "deletion",
            description: "cancels the jobs of deleted or cancelled workloads, then removes or ends them",
            woken_by: WokenBy::BeyondPending,
            period: |c| c.sync_interval,
            min_gap: |c| c.min_cycle_interval,
            pass: pass!(deletion),
        },
        Task {
            name: "status_sync",
            description: "turns what the clusters say about jobs into workload phases",
            woken_by: WokenBy::BeyondPending,
            period: |c| c.sync_interval,
            min_gap: zero,
            pass: pass!(status_sync),
        },
        Task {
            name: "orphans",
            description: "cancels jobs that carry Berth's key but belong to no live attempt",
            woken_by: WokenBy::Period,
            period: |c| c.resync,
            min_gap: zero,
            pass: pass!(orphans),
        },
        Task {
            name: "cluster_health",
            description: "refreshes each cluster's inventory and marks unreachable clusters",
            woken_by: WokenBy::Period,
            period: |c| c.health_interval,
            min_gap: zero,
            pass: pass!(cluster_health),
        },
        Task {
            name: "retention",
            description: "removes ended workloads once the retention period has passed, and what is explained of workloads no longer pending",
            woken_by: WokenBy::Period,
            period: |_| RETENTION_PERIOD,
            min_gap: zero,
            pass: pass!(retention),
        },
        Task {
            name: "estimates",
            description: "estimates when each pending workload starts",
            woken_by: WokenBy::Period,
            period: |_| ESTIMATE_PERIOD,
            min_gap: zero,
            pass: pass!(estimates),
        },
        Task {
            name: "budgets",
            description: "adds up each team's GPU-hours against its budgets",
            woken_by: WokenBy::BeyondPending,
            period: |_| BUDGET_PERIOD,
            min_gap: |_| BUDGET_GAP,
            pass: pass!(budgets),
        },
        Task {
            name: "fair_sharing",
            description: "adds up each team's recent GPU-hours where its tree shares fairly over time",
            woken_by: WokenBy::Period,
            period: |_| FAIR_SHARING_PERIOD,
            min_gap: zero,
            pass: pass!(fair_sharing),
        },
        Task {
            name: "idle",
            description: "cancels running notebooks idle past their timeout",
            woken_by: WokenBy::Period,
            period: |c| c.resync,
            min_gap: zero,
            pass: pass!(idle),
        },
        Task {
            name: "autoscaler",
            description: "scales inference services' replicas to their load",
            woken_by: WokenBy::Period,
            period: |c| c.health_interval,
            min_gap: zero,
            pass: pass!(autoscaler),
        },
    ];
    tasks.into_iter().map(|t| Box::new(t) as Box<dyn Reconciler>).collect()
}

/// Starts every controller of [`all`]; they run until the returned set is shut down.
pub fn start(ctx: &Context, holder: &str) -> JoinSet<()> {
    start_these(ctx, holder, all())
}

/// Starts `reconcilers`, each in its loop, and the listener that wakes them.
pub fn start_these(ctx: &Context, holder: &str, reconcilers: Vec<Box<dyn Reconciler>>) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let mut woken = Vec::new();
    let room = Arc::new(RoomChanges::default());
    for r in reconcilers {
        let wake = (r.woken_by() != WokenBy::Period).then(|| Arc::new(Notify::new()));
        if let Some(n) = &wake {
            woken.push((r.woken_by(), n.clone()));
        }
        set.spawn(run_loop(r, ctx.clone(), holder.to_owned(), wake, room.clone()));
    }
    set.spawn(listen(ctx.clone(), woken, room));
    set
}

/// Forwards each change to the reconcilers it wakes.
async fn listen(ctx: Context, woken: Vec<(WokenBy, Arc<Notify>)>, room: Arc<RoomChanges>) {
    loop {
        let listener = async {
            let mut feed = ChangeFeed::listen(&ctx.db).await?;
            loop {
                let change = feed.next().await?;
                if room_change(&change) {
                    room.one_more();
                }
                woken.iter().filter(|(by, _)| by.by(&change)).for_each(|(_, n)| n.notify_one());
            }
            #[allow(unreachable_code)]
            Ok::<(), Error>(())
        };
        if let Err(e) = listener.await {
            tracing::warn!(error = %e, "change listener failed; retrying (controllers still resync on their interval)");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The least time between two stored statuses of a controller whose passes change things.
const SAVE_AT_MOST_EVERY: Duration = Duration::from_secs(1);
/// How often the status of a controller whose passes change nothing is stored (its `runs`
/// go on counting): an idle site writes no row per pass.
const SAVE_UNCHANGED_EVERY: Duration = Duration::from_secs(10);

async fn run_loop(
    mut reconciler: Box<dyn Reconciler>,
    ctx: Context,
    holder: String,
    wake: Option<Arc<Notify>>,
    room: Arc<RoomChanges>,
) {
    let name = reconciler.name();
    let (every, min_gap) = (reconciler.period(&ctx.config), reconciler.min_gap(&ctx.config));
    let mut runs: u64 = 0;
    let mut errors: u64 = 0;
    let mut last_saved: Option<Instant> = None;
    loop {
        let started = Instant::now();
        let room_seen = room.seen();
        let span = tracing::info_span!("controller_pass", controller = name, run = runs + 1);
        let result = reconciler.reconcile(&ctx).instrument(span).await;
        let ended = Instant::now();
        let rested = ended + result.as_ref().map_or(Duration::ZERO, |p| p.rest);
        let rested_unless_room = ended + result.as_ref().map_or(Duration::ZERO, |p| p.rest_for_submissions);
        runs += 1;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!("berth_controller_pass_seconds", "controller" => name)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("berth_controller_passes_total", "controller" => name, "result" => outcome).increment(1);
        if let Ok(passed) = &result {
            let changes = passed.changes;
            #[allow(clippy::cast_precision_loss)] // counts of objects
            metrics::histogram!("berth_controller_pass_changes", "controller" => name).record(changes as f64);
            tracing::debug!(controller = name, changes, ms = started.elapsed().as_secs_f64() * 1000.0, "pass");
        }
        let (again, waits, last) = match &result {
            Ok(p) => (p.changes > 0, p.waits_on_time, json!({"ok": p.status})),
            Err(e) => {
                errors += 1;
                tracing::warn!(controller = name, error = %e, "controller pass failed");
                (false, true, json!({"error": e.to_string()}))
            }
        };
        let due = last_saved.map_or(Duration::MAX, |t| t.elapsed());
        if result.is_err() || due >= SAVE_UNCHANGED_EVERY || (again && due >= SAVE_AT_MOST_EVERY) {
            // How long it rests after this pass: at least `rest_ms`, and `rest_for_submissions_ms`
            // unless a change that may free room comes first.
            let rest_ms =
                |rest: fn(&Passed) -> Duration| result.as_ref().map_or(0.0, |p| rest(p).as_secs_f64() * 1000.0);
            let report = json!({
                "runs": runs, "errors": errors,
                "last_pass_ms": started.elapsed().as_secs_f64() * 1000.0, "last": last,
                "rest_ms": rest_ms(|p| p.rest), "rest_for_submissions_ms": rest_ms(|p| p.rest_for_submissions),
            });
            if save_status(&ctx, name, &holder, &report).await.is_ok() {
                last_saved = Some(Instant::now());
            }
        }
        if !again {
            let idle = if waits || wake.is_none() { every } else { ctx.config.resync.max(every) };
            let sleep = tokio::time::sleep(idle);
            match &wake {
                Some(n) => {
                    tokio::select! {
                        () = n.notified() => {}
                        () = sleep => {}
                    }
                }
                None => sleep.await,
            }
        }
        tokio::time::sleep_until((started + min_gap).max(rested).into()).await;
        if rested_unless_room > Instant::now() {
            room.wait_until(room_seen, rested_unless_room).await;
        }
    }
}

/// Stores a controller's report (fenced like every controller write).
async fn save_status(ctx: &Context, name: &str, holder: &str, report: &serde_json::Value) -> Result<(), Error> {
    let mut tx = ctx.begin().await?;
    berth_store::controller::controller_status_write(&mut *tx, name, holder, report).await?;
    berth_store::commit(tx).await
}

#[cfg(test)]
mod tests {
    use super::{Change, WokenBy};

    fn concerns_scheduler(payload: &str) -> bool {
        WokenBy::SchedulingChange.by(&Change::parse(payload))
    }

    #[test]
    fn the_scheduler_sleeps_only_through_status_writes_that_take_or_free_nothing() {
        for ignored in
            ["workloads status:Dispatched", "workloads status:Dispatched,Running", "workloads status:Admitted"]
        {
            assert!(!concerns_scheduler(ignored), "{ignored}");
        }
        for woken in [
            "workloads",
            "workloads submitted",
            "teams",
            "clusters",
            "flavors",
            "workloads status:Pending",
            "workloads status:Running,Succeeded",
            "workloads status:Failed",
            "workloads status:Unknown",
        ] {
            assert!(concerns_scheduler(woken), "{woken}");
        }
    }

    #[test]
    fn only_the_scheduler_is_woken_by_what_concerns_only_pending_work() {
        for pending in ["workloads submitted", "workloads status:Pending"] {
            let change = Change::parse(pending);
            assert!(WokenBy::SchedulingChange.by(&change), "{pending}");
            assert!(!WokenBy::BeyondPending.by(&change), "{pending}");
        }
        // A cancellation keeps the phase of work on a backend; a pending one ends at once.
        for beyond in
            ["workloads", "workloads status:Pending,Running", "workloads status:Admitted", "workloads status:Cancelled"]
        {
            assert!(WokenBy::BeyondPending.by(&Change::parse(beyond)), "{beyond}");
        }
    }
}
