//! Runs every reconciler in its own loop: woken by Postgres `LISTEN/NOTIFY` (channel
//! `berth_changes`) or its interval, whichever comes first; wake-ups that arrive while a
//! pass runs fold into one more pass. Each controller's status is stored for
//! `/api/v1/controllers`: after a pass that changed something (at most once a second), after
//! a failed one, and every 10 s while nothing changes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_core::Error;
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::{
    Context, autoscaler, budgets, cluster_health, deletion, dispatcher, estimates, idle, orphans, preemption,
    retention, scheduler, status_sync,
};

/// The channel the store's triggers notify on.
pub const CHANNEL: &str = "berth_changes";

/// A reconciler's typed status; each module implements it for its own.
pub trait Report: Serialize + Send {
    /// How many objects the pass changed; 0 means it is caught up.
    fn changes(&self) -> usize;

    /// Whether something may come due with time alone (a grace period, a job that stops):
    /// if not, a controller that changes wake passes only on a change or its resync.
    fn waits_on_time(&self) -> bool {
        true
    }
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

/// How often retention looks for workloads to remove (it counts in days).
const RETENTION_PERIOD: Duration = Duration::from_secs(300);

/// A controller's loop: name, what wakes it, its interval, the least gap between passes,
/// and its pass.
type Loop = (&'static str, Option<Arc<Notify>>, Duration, Duration, fn(Context) -> Pass);

/// A pass of each controller, boxed so every loop has the same type.
macro_rules! pass {
    ($name:ident, $module:ident) => {
        fn $name(ctx: Context) -> Pass {
            Box::pin(async move { boxed($module::reconcile(&ctx).await) })
        }
    };
}
pass!(scheduler_pass, scheduler);
pass!(dispatcher_pass, dispatcher);
pass!(preemption_pass, preemption);
pass!(deletion_pass, deletion);
pass!(status_sync_pass, status_sync);
pass!(orphans_pass, orphans);
pass!(cluster_health_pass, cluster_health);
pass!(retention_pass, retention);
pass!(estimates_pass, estimates);
pass!(budgets_pass, budgets);
pass!(idle_pass, idle);
pass!(autoscaler_pass, autoscaler);

/// Starts every controller (the one list of them); they run until the returned set is
/// shut down.
pub fn start(ctx: &Context, holder: &str) -> JoinSet<()> {
    let c = &ctx.config;
    let woken: Vec<Arc<Notify>> = (0..5).map(|_| Arc::new(Notify::new())).collect();
    let loops: [Loop; 12] = [
        ("scheduler", Some(woken[0].clone()), c.resync, c.min_cycle_interval, scheduler_pass),
        ("dispatcher", Some(woken[1].clone()), c.resync, DISPATCHER_GAP, dispatcher_pass),
        ("preemption", Some(woken[2].clone()), c.sync_interval, c.min_cycle_interval, preemption_pass),
        ("deletion", Some(woken[3].clone()), c.sync_interval, c.min_cycle_interval, deletion_pass),
        ("status_sync", None, c.sync_interval, Duration::ZERO, status_sync_pass),
        ("orphans", None, c.resync, Duration::ZERO, orphans_pass),
        ("cluster_health", None, c.health_interval, Duration::ZERO, cluster_health_pass),
        ("retention", None, RETENTION_PERIOD, Duration::ZERO, retention_pass),
        ("estimates", None, ESTIMATE_PERIOD, Duration::ZERO, estimates_pass),
        ("budgets", Some(woken[4].clone()), BUDGET_PERIOD, BUDGET_GAP, budgets_pass),
        ("idle", None, c.resync, Duration::ZERO, idle_pass),
        ("autoscaler", None, c.health_interval, Duration::ZERO, autoscaler_pass),
    ];
    let mut set = JoinSet::new();
    for (name, wake, every, gap, pass) in loops {
        set.spawn(run_loop(name, ctx.clone(), holder.to_owned(), wake, every, gap, pass));
    }
    set.spawn(listen(ctx.clone(), woken));
    set
}

/// One pass: how many objects it changed, whether it waits on time, and its status as JSON.
type Pass = std::pin::Pin<Box<dyn Future<Output = Result<Passed, Error>> + Send>>;

struct Passed {
    changes: usize,
    waits_on_time: bool,
    status: serde_json::Value,
}

fn boxed<S: Report>(r: Result<S, Error>) -> Result<Passed, Error> {
    r.map(|s| Passed {
        changes: s.changes(),
        waits_on_time: s.waits_on_time(),
        status: serde_json::to_value(&s).unwrap_or_default(),
    })
}

/// Forwards change notifications to the controllers that react to them: all of them,
/// except the scheduler (the first) for a write of workload statuses it has no part in.
async fn listen(ctx: Context, woken: Vec<Arc<Notify>>) {
    loop {
        let listener = async {
            let mut l = sqlx::postgres::PgListener::connect_with(&ctx.db).await?;
            l.listen(CHANNEL).await?;
            loop {
                let change = l.recv().await?;
                let skip = usize::from(!concerns_scheduler(change.payload()));
                woken.iter().skip(skip).for_each(|n| n.notify_one());
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        if let Err(e) = listener.await {
            tracing::warn!(error = %e, "change listener failed; retrying (controllers still resync on their interval)");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The phases a change notification's payload says were written, when the statement
/// wrote only workload statuses (`workloads status:Dispatched,Running`); `None` for any
/// other change (a table's name).
pub fn status_phases(payload: &str) -> Option<impl Iterator<Item = &str>> {
    payload.strip_prefix("workloads status:").map(|phases| phases.split(','))
}

/// Whether a change can change what the scheduler decides. Workloads entering `Admitted`
/// or `Preempting` are its own writes (a pass that wrote runs again anyway), and
/// `Dispatched` or `Running` free or take nothing it counts; every other phase (requeued,
/// finished, unknown) and every other change may.
fn concerns_scheduler(payload: &str) -> bool {
    status_phases(payload)
        .is_none_or(|mut phases| !phases.all(|p| ["Admitted", "Dispatched", "Running", "Preempting"].contains(&p)))
}

/// The least time between two stored statuses of a controller whose passes change things.
const SAVE_AT_MOST_EVERY: Duration = Duration::from_secs(1);
/// How often the status of a controller whose passes change nothing is stored (its `runs`
/// go on counting): an idle site writes no row per pass.
const SAVE_UNCHANGED_EVERY: Duration = Duration::from_secs(10);

async fn run_loop(
    name: &'static str,
    ctx: Context,
    holder: String,
    wake: Option<Arc<Notify>>,
    every: Duration,
    min_gap: Duration,
    pass: impl Fn(Context) -> Pass,
) {
    let mut runs: u64 = 0;
    let mut errors: u64 = 0;
    let mut last_saved: Option<Instant> = None;
    loop {
        let started = Instant::now();
        let result = pass(ctx.clone()).await;
        runs += 1;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!("berth_controller_pass_seconds", "controller" => name)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("berth_controller_passes_total", "controller" => name, "result" => outcome).increment(1);
        if let Ok(passed) = &result {
            let changes = passed.changes;
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
            let report = json!({
                "runs": runs, "errors": errors,
                "last_pass_ms": started.elapsed().as_secs_f64() * 1000.0, "last": last,
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
        let since = started.elapsed();
        if since < min_gap {
            tokio::time::sleep(min_gap - since).await;
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
    use super::concerns_scheduler;

    #[test]
    fn the_scheduler_sleeps_only_through_status_writes_that_take_or_free_nothing() {
        for ignored in
            ["workloads status:Dispatched", "workloads status:Dispatched,Running", "workloads status:Admitted"]
        {
            assert!(!concerns_scheduler(ignored), "{ignored}");
        }
        for woken in [
            "workloads",
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
}
