//! Start-time estimates for pending work: the world as the scheduler sees it, run forward
//! by [`berth_sched::estimate`], written as the `status.estimated_start` of each pending
//! workload the scheduler left waiting (it has a pending reason) when it moved by a minute
//! or more (or its basis changed), so a stable queue costs no writes. Like the reasons,
//! they are written beside the workloads ([`berth_store::workload::workload_estimate`]).

use berth_core::workload::{Phase, StartEstimate};
use berth_core::{Error, WorkloadId};
use berth_sched::estimate::{After, on_clock};
use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;

use crate::world::Explained;
use crate::{Context, snapshot, version};

/// The most cycles one estimate simulates.
const MAX_STEPS: usize = 64;
/// Less movement than this is not written.
const MOVED: TimeDelta = TimeDelta::seconds(60);

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EstimateStatus {
    pub pending: usize,
    pub estimated: usize,
    pub updated: usize,
}

impl crate::runner::Report for EstimateStatus {
    fn changes(&self) -> usize {
        // It runs again on its period.
        0
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<EstimateStatus, Error> {
    let (world, _) = ctx.world.load(&ctx.db, ctx.clock.now()).await?;
    // What the scheduler derived of the workloads is its own (lent to its snapshot during
    // a cycle): this build makes everything anew.
    let world = snapshot::World { derived: Default::default(), ..world };
    // CPU-bound (430 ms at 73,000 pending): on a blocking thread, as the scheduler's plan.
    let starvation_after = ctx.config.starvation_after.as_secs() as i64;
    let config = ctx.config.clone();
    let (world, built, estimates) = crate::off_runtime(move || {
        let built = snapshot::build(&world, starvation_after);
        let limit =
            |i: usize| world.workloads[i].spec.max_runtime_seconds.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        // A simulated cluster's clock may run faster: its jobs reach their limits sooner.
        let time_scales: Vec<f64> =
            world.clusters.iter().map(|c| c.spec.sim.as_ref().map_or(1.0, |s| s.time_scale)).collect();
        // Work told to stop ends at the end of its grace period, if not at its limit first.
        let ends: Vec<Option<i64>> = built
            .running
            .iter()
            .zip(&built.snapshot.running)
            .map(|(&i, r)| {
                let w = &world.workloads[i];
                let started = w.status.started_at.unwrap_or(world.now).timestamp();
                let at_limit = limit(i).map(|m| started.saturating_add(on_clock(m, time_scales[r.cluster])));
                if !r.preempting {
                    return at_limit;
                }
                let stops = crate::stops_by(&config, w, &world.clusters[r.cluster].spec, world.now).timestamp();
                Some(at_limit.map_or(stops, |l| l.min(stops)))
            })
            .collect();
        let runtimes: Vec<Option<i64>> = built.pending.iter().map(|&i| limit(i)).collect();
        let estimates = berth_sched::estimate::start_times(&built.snapshot, &ends, &runtimes, &time_scales, MAX_STEPS);
        (world, built, estimates)
    })
    .await?;
    let mut status = EstimateStatus { pending: built.pending.len(), ..Default::default() };
    let names: std::collections::HashMap<String, String> = world
        .workloads
        .iter()
        .map(|x| {
            (
                x.metadata.uid.to_string(),
                format!("{}/{}", x.metadata.team.as_deref().unwrap_or_default(), x.metadata.name),
            )
        })
        .collect();
    let mut writes = Vec::new();
    let mut kept = Vec::new();
    for (p, estimate) in built.pending.iter().zip(estimates) {
        let w = &world.workloads[*p];
        let next = estimate.map(|e| {
            let when = match &e.after {
                Some(After::Ends(id)) => {
                    format!("when {} reaches its max_runtime_seconds", names.get(id).unwrap_or(id))
                }
                Some(After::Stops(id)) => format!("when {} stops, as it was told to", names.get(id).unwrap_or(id)),
                Some(After::BudgetResets(budget)) => format!("when the budget of {budget} resets"),
                Some(After::ProtectionEnds(id)) => {
                    format!("when the min runtime of {} ends and it is preempted", names.get(id).unwrap_or(id))
                }
                None => "now: what it needs is free".to_owned(),
            };
            let ahead = match e.ahead {
                1 => "1 workload starts".to_owned(),
                n => format!("{n} workloads start"),
            };
            StartEstimate { at: at(e.at), basis: format!("{when}; {ahead} before it") }
        });
        status.estimated += usize::from(next.is_some());
        // Only once the scheduler has looked at it and left it waiting (it gave a reason):
        // it admits most new work in its first cycle, and an estimate written first made
        // that cycle's writes stale (100,000 submitted at once: all of them, an 11.9 s cycle
        // wasted).
        let judged = w.status.pending_reason.is_some();
        if w.status.phase == Phase::Pending && judged && moved(w.status.estimated_start.as_ref(), next.as_ref()) {
            kept.push((w.metadata.uid, version(w)?, Explained::Estimate(next.clone())));
            writes.push((WorkloadId(w.metadata.uid), w.status.attempt, next));
        }
    }
    if !writes.is_empty() {
        let mut tx = ctx.begin().await?;
        let written = berth_store::workload::workload_estimate(&mut *tx, &writes).await?;
        berth_store::commit(tx).await?;
        status.updated = usize::try_from(written).unwrap_or(usize::MAX);
        ctx.world.explained(kept).await;
    }
    Ok(status)
}

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(seconds, 0).unwrap_or_default()
}

/// Whether the estimate changed enough to be written.
fn moved(before: Option<&StartEstimate>, after: Option<&StartEstimate>) -> bool {
    match (before, after) {
        (None, None) => false,
        (Some(b), Some(a)) => (a.at - b.at).abs() >= MOVED || a.basis != b.basis,
        _ => true,
    }
}
