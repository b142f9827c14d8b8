//! Start-time estimates: the scheduler run forward in time. Each step plans a cycle at the
//! step's time, turns what it admits into running work (ending `max_runtime_seconds` later),
//! then jumps to the next moment running work must end (and frees what it held), a used-up
//! budget resets, or the min runtime of work a waiting workload would preempt ends,
//! whichever comes first. A pending
//! workload's estimate is the first step that admits it; there is none when it would wait
//! for work that has no runtime limit (or beyond the last step). The estimate assumes that
//! running work ends at its limit (most end earlier: the estimate is then late) and that
//! nothing else arrives (work submitted later with a higher priority or a team with more
//! claim can make it early).

use std::collections::{HashMap, HashSet};

use crate::cycle::schedule;
use crate::plan::Reason;
use crate::snapshot::{Running, Snapshot};

/// When a pending workload is expected to start, and why then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Seconds, on the snapshot's clock.
    pub at: i64,
    /// What lets it start then; `None` when what it needs is free at the snapshot's time.
    pub after: Option<After>,
    /// How many workloads the simulated cycles admitted before it.
    pub ahead: usize,
}

/// What a later start waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// This running workload's end (at its runtime limit) frees what it needs.
    Ends(String),
    /// This workload, told to stop (preempted, cancelled), frees what it needs when it has.
    Stops(String),
    /// This used-up budget resets.
    BudgetResets(String),
    /// This running workload's min runtime ends and it is preempted.
    ProtectionEnds(String),
}

/// The estimated start of each of `s.pending` (by index). `running_ends[i]` is when
/// `s.running[i]` must end: at its runtime limit, or, told to stop, at the end of its grace
/// period (`None`: no limit; now for one told to stop); `runtimes[i]` is `s.pending[i]`'s
/// runtime limit in seconds of the cluster it runs on, and `time_scales[c]` how many of
/// them cluster `c` counts in one second of the snapshot's clock (1 but for a simulated
/// cluster whose time runs faster). At most `max_steps` cycles are simulated.
pub fn start_times(
    s: &Snapshot,
    running_ends: &[Option<i64>],
    runtimes: &[Option<i64>],
    time_scales: &[f64],
    max_steps: usize,
) -> Vec<Option<Estimate>> {
    let mut out: Vec<Option<Estimate>> = vec![None; s.pending.len()];
    let mut snap = s.clone();
    // Where each pending workload of `snap` came from, and each running one's end.
    let mut origin: Vec<usize> = (0..s.pending.len()).collect();
    let mut ends: Vec<Option<i64>> = running_ends.to_vec();
    // Work told to stop is about to go.
    for (end, r) in ends.iter_mut().zip(&snap.running) {
        if r.preempting {
            *end = Some(end.map_or(s.now, |e| e.max(s.now)));
        }
    }
    let mut freed_by: Option<After> = None;
    let mut admitted = 0;
    // When the protection of work that waiting workloads would preempt ends (the first
    // plan names it), and which of it has ended: the estimate said when that work reached
    // its runtime limit, while the workload started when its min runtime ended.
    let mut protection_ends: Vec<(i64, String)> = Vec::new();
    let mut unprotected: HashSet<String> = HashSet::new();
    for step in 0..max_steps {
        let Ok(plan) = schedule(&snap) else { break };
        if step == 0 {
            for w in &plan.waiting {
                if let Reason::WaitingForMinRuntime { victims, .. } = &w.reason {
                    protection_ends
                        .extend(victims.iter().map(|&v| (snap.running[v].protected_until, snap.running[v].id.clone())));
                }
            }
            protection_ends.sort();
            protection_ends.dedup();
        }
        let mut taken = vec![false; snap.pending.len()];
        for a in &plan.admissions {
            let p = &snap.pending[a.workload];
            out[origin[a.workload]] = Some(Estimate { at: snap.now, after: freed_by.clone(), ahead: admitted });
            admitted += 1;
            taken[a.workload] = true;
            snap.running.push(Running {
                id: p.id.clone(),
                team: p.team,
                priority: p.priority,
                preemptible: p.preemptible,
                borrowed: a.borrowed,
                started_at: snap.now,
                protected_until: 0,
                preempting: false,
                cluster: a.cluster,
                flavor: a.flavor,
                tasks: p.tasks,
                placement: a.placement.clone(),
            });
            let scale = time_scales.get(a.cluster).copied().unwrap_or(1.0);
            ends.push(runtimes[origin[a.workload]].map(|r| snap.now + on_clock(r, scale).max(1)));
        }
        // Victims of the plan stop at once (their grace period is not modelled).
        for p in &plan.preemptions {
            ends[p.victim] = Some(snap.now);
            snap.running[p.victim].preempting = true;
        }
        // The admitted leave the queue; references between the rest follow them.
        let mut new_ix: HashMap<usize, usize> = HashMap::new();
        let mut kept = Vec::new();
        let mut kept_origin = Vec::new();
        for (i, p) in std::mem::take(&mut snap.pending).into_iter().enumerate() {
            if !taken[i] {
                new_ix.insert(i, kept.len());
                kept.push(p);
                kept_origin.push(origin[i]);
            }
        }
        for p in &mut kept {
            p.preempted_for = p.preempted_for.and_then(|i| new_ix.get(&i).copied());
        }
        snap.pending = kept;
        origin = kept_origin;
        if snap.pending.is_empty() {
            break;
        }
        // The next moment running work must end or a budget resets; neither: nothing more
        // can be said.
        let now = snap.now;
        let reset =
            snap.teams.iter().flat_map(|t| &t.budget_stops).filter(|b| b.resets_at > now).min_by_key(|b| b.resets_at);
        let end = ends.iter().flatten().copied().min().map(|e| e.max(now));
        if let Some(b) = reset.filter(|b| end.is_none_or(|e| b.resets_at < e)) {
            freed_by = Some(After::BudgetResets(b.budget.clone()));
            snap.now = b.resets_at;
            continue;
        }
        if let Some((at, id)) =
            protection_ends.iter().find(|(at, _)| *at > now).filter(|(at, _)| end.is_none_or(|e| *at < e))
        {
            unprotected.insert(id.clone());
            freed_by = Some(After::ProtectionEnds(id.clone()));
            snap.now = *at;
            continue;
        }
        let Some(next) = end else { break };
        let ending: Vec<usize> = (0..ends.len()).filter(|&i| ends[i].is_some_and(|e| e <= next)).collect();
        freed_by = ending.last().map(|&i| {
            let r = &snap.running[i];
            if !r.preempting {
                After::Ends(r.id.clone())
            } else if unprotected.contains(&r.id) {
                After::ProtectionEnds(r.id.clone())
            } else {
                After::Stops(r.id.clone())
            }
        });
        for &i in ending.iter().rev() {
            snap.running.remove(i);
            ends.remove(i);
        }
        snap.now = next;
    }
    out
}

/// `seconds` of a cluster that counts `time_scale` of them in one second, on the snapshot's
/// clock.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)] // seconds, far within range
pub fn on_clock(seconds: i64, time_scale: f64) -> i64 {
    if time_scale > 0.0 { (seconds as f64 / time_scale).round() as i64 } else { seconds }
}
