//! What-if: apply changes to a snapshot, schedule both, and say what the changes would do.
//! This backs "preview before apply" in the API and the dashboard.

use std::collections::BTreeMap;

use berth_core::workload::{TopologyPolicy, WorkloadKind};
use serde::{Deserialize, Serialize};

use crate::cycle::schedule;
use crate::plan::{Plan, Reason};
use crate::snapshot::{Cluster, InvalidSnapshot, Node, Pending, Quota, Snapshot};

/// One change to try. Objects are named, since indices shift between snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Change {
    /// Replace a team's quota for a flavor.
    SetQuota { team: String, flavor: String, quota: Quota },
    /// Move a team under another parent (`None`: to the top level).
    SetParent { team: String, parent: Option<String> },
    /// Replace a team's recent use (GPU-hours by flavor; a flavor left out: none), or with
    /// `None` stop weighing it ([`crate::snapshot::Team::recent_usage`]).
    SetRecentUsage { team: String, gpu_hours: Option<BTreeMap<String, f64>> },
    /// Register a cluster with its nodes (their `cluster` field is ignored).
    AddCluster { cluster: Cluster, nodes: Vec<Node> },
    /// Remove a cluster: its running work is requeued (it shows as `displaced`).
    RemoveCluster { cluster: String },
    /// Submit workloads.
    AddWorkloads { workloads: Vec<Pending> },
}

/// Both plans and how they differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIf {
    pub before: Plan,
    pub after_snapshot: Snapshot,
    pub after: Plan,
    pub diff: PlanDiff,
}

/// The difference between two plans, by workload id and team, flavor and cluster names.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlanDiff {
    /// Admitted after the change, not before.
    pub admitted: Vec<String>,
    /// Admitted before the change, not after.
    pub no_longer_admitted: Vec<String>,
    /// Admitted both times, to another cluster or flavor: (workload, before, after) as
    /// `cluster/flavor`.
    pub moved: Vec<(String, String, String)>,
    pub preempted: Vec<String>,
    pub no_longer_preempted: Vec<String>,
    /// Running work within its min runtime that waiting work would preempt once that ends
    /// (no victim before: the change alone preempts nothing of it now), not so before.
    pub preempted_once_protected_ends: Vec<String>,
    /// Running non-preemptible work the change puts beyond its team's own guarantee: it is
    /// never preempted, and runs on in what the change takes from its team until it ends.
    pub kept_beyond_guarantee: Vec<String>,
    /// Waiting both times for another reason: (workload, before, after) reason codes.
    pub reasons: Vec<(String, String, String)>,
    /// Fair shares that change: (team, flavor, before, after) in GPUs.
    pub shares: Vec<(String, String, f64, f64)>,
    /// Running work requeued because its cluster was removed.
    pub displaced: Vec<String>,
}

/// Applies `changes` in order to a copy of `s`.
///
/// # Errors
/// When a change names an unknown team, flavor or cluster, or the result is invalid.
pub fn apply(s: &Snapshot, changes: &[Change]) -> Result<(Snapshot, Vec<String>), InvalidSnapshot> {
    let mut s = s.clone();
    let mut displaced = Vec::new();
    let unknown = |what: &str, name: &str| InvalidSnapshot(format!("unknown {what} {name:?}"));
    for change in changes {
        match change {
            Change::SetQuota { team, flavor, quota } => {
                let t = s.teams.iter().position(|t| &t.name == team).ok_or_else(|| unknown("team", team))?;
                let f = s.flavors.iter().position(|f| f == flavor).ok_or_else(|| unknown("flavor", flavor))?;
                s.teams[t].quotas[f] = *quota;
            }
            Change::SetParent { team, parent } => {
                let find =
                    |name: &String| s.teams.iter().position(|t| &t.name == name).ok_or_else(|| unknown("team", name));
                let (t, p) = (find(team)?, parent.as_ref().map(find).transpose()?);
                s.teams[t].parent = p;
            }
            Change::SetRecentUsage { team, gpu_hours } => {
                let t = s.teams.iter().position(|t| &t.name == team).ok_or_else(|| unknown("team", team))?;
                let mut used = gpu_hours.as_ref().map(|_| vec![0.0; s.flavors.len()]);
                for (flavor, h) in gpu_hours.iter().flatten() {
                    let f = s.flavors.iter().position(|x| x == flavor).ok_or_else(|| unknown("flavor", flavor))?;
                    used.as_mut().expect("some")[f] = *h;
                }
                s.teams[t].recent_usage = used;
            }
            Change::AddCluster { cluster, nodes } => {
                let c = s.clusters.len();
                s.clusters.push(cluster.clone());
                s.nodes.extend(nodes.iter().cloned().map(|n| Node { cluster: c, ..n }));
            }
            Change::RemoveCluster { cluster } => {
                let c =
                    s.clusters.iter().position(|x| &x.name == cluster).ok_or_else(|| unknown("cluster", cluster))?;
                displaced.extend(remove_cluster(&mut s, c));
            }
            Change::AddWorkloads { workloads } => s.pending.extend(workloads.iter().cloned()),
        }
    }
    s.validate()?;
    // What its running work borrows, as the changed quotas stand.
    s.settle_borrowed();
    Ok((s, displaced))
}

/// Drops cluster `c` and its nodes; its running work becomes pending again.
fn remove_cluster(s: &mut Snapshot, c: usize) -> Vec<String> {
    let mut new_index = vec![usize::MAX; s.nodes.len()];
    let mut kept = Vec::new();
    for (i, n) in s.nodes.drain(..).enumerate() {
        if n.cluster != c {
            new_index[i] = kept.len();
            kept.push(Node { cluster: if n.cluster > c { n.cluster - 1 } else { n.cluster }, ..n });
        }
    }
    s.nodes = kept;
    s.clusters.remove(c);
    let mut displaced = Vec::new();
    let running = std::mem::take(&mut s.running);
    for mut r in running {
        if r.cluster == c {
            displaced.push(r.id.clone());
            s.pending.push(Pending {
                id: r.id,
                team: r.team,
                kind: WorkloadKind::Batch,
                priority: r.priority,
                preemptible: r.preemptible,
                submitted_at: r.started_at,
                flavors: vec![r.flavor],
                tasks: r.tasks,
                topology: TopologyPolicy::None,
                cluster_selector: BTreeMap::new(),
                backend_kinds: Vec::new(),
                flavor_policy: Default::default(),
                has_image: true,
                has_command: true,
                preempted_for: None,
            });
            continue;
        }
        if r.cluster > c {
            r.cluster -= 1;
        }
        for t in &mut r.placement {
            t.node = new_index[t.node];
        }
        s.running.push(r);
    }
    displaced
}

/// Schedules `s` as it is and with `changes` applied, and compares the plans.
///
/// # Errors
/// As [`apply`] and [`schedule`].
pub fn what_if(s: &Snapshot, changes: &[Change]) -> Result<WhatIf, InvalidSnapshot> {
    let before = schedule(s)?;
    let (after_snapshot, displaced) = apply(s, changes)?;
    let after = schedule(&after_snapshot)?;
    let mut diff = diff(s, &before, &after_snapshot, &after);
    diff.displaced = displaced;
    Ok(WhatIf { before, after_snapshot, after, diff })
}

/// Compares the plans of two snapshots by names and ids.
pub fn diff(s1: &Snapshot, p1: &Plan, s2: &Snapshot, p2: &Plan) -> PlanDiff {
    let admitted = |s: &Snapshot, p: &Plan| -> BTreeMap<String, String> {
        p.admissions
            .iter()
            .map(|a| {
                (s.pending[a.workload].id.clone(), format!("{}/{}", s.clusters[a.cluster].name, s.flavors[a.flavor]))
            })
            .collect()
    };
    let preempted = |s: &Snapshot, p: &Plan| -> Vec<String> {
        let mut ids: Vec<String> = p.preemptions.iter().map(|x| s.running[x.victim].id.clone()).collect();
        ids.sort();
        ids
    };
    let reasons = |s: &Snapshot, p: &Plan| -> BTreeMap<String, &'static str> {
        p.waiting.iter().map(|w| (s.pending[w.workload].id.clone(), w.reason.code())).collect()
    };
    let shares = |s: &Snapshot, p: &Plan| -> BTreeMap<(String, String), f64> {
        p.shares.iter().map(|x| ((s.teams[x.team].name.clone(), s.flavors[x.flavor].clone()), x.fair_share)).collect()
    };
    let (a1, a2) = (admitted(s1, p1), admitted(s2, p2));
    let (x1, x2) = (preempted(s1, p1), preempted(s2, p2));
    let (r1, r2) = (reasons(s1, p1), reasons(s2, p2));
    let (f1, f2) = (shares(s1, p1), shares(s2, p2));
    let protected = |s: &Snapshot, p: &Plan| -> Vec<String> {
        let mut ids: Vec<String> = (p.waiting.iter())
            .filter_map(|w| match &w.reason {
                Reason::WaitingForMinRuntime { victims, .. } => Some(victims),
                _ => None,
            })
            .flatten()
            .map(|&v| s.running[v].id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let (v1, v2) = (protected(s1, p1), protected(s2, p2));
    let borrowed_before: std::collections::BTreeSet<&str> =
        s1.running.iter().filter(|r| r.borrowed).map(|r| r.id.as_str()).collect();
    let mut d = PlanDiff {
        admitted: a2.keys().filter(|k| !a1.contains_key(*k)).cloned().collect(),
        no_longer_admitted: a1.keys().filter(|k| !a2.contains_key(*k)).cloned().collect(),
        moved: a1
            .iter()
            .filter_map(|(k, v1)| a2.get(k).filter(|v2| *v2 != v1).map(|v2| (k.clone(), v1.clone(), v2.clone())))
            .collect(),
        preempted: x2.iter().filter(|v| !x1.contains(v)).cloned().collect(),
        no_longer_preempted: x1.iter().filter(|v| !x2.contains(v)).cloned().collect(),
        preempted_once_protected_ends: v2.iter().filter(|v| !v1.contains(v) && !x2.contains(v)).cloned().collect(),
        kept_beyond_guarantee: (s2.running.iter())
            .filter(|r| !r.preemptible && !r.preempting && r.borrowed && !borrowed_before.contains(r.id.as_str()))
            .map(|r| r.id.clone())
            .collect(),
        reasons: r1
            .iter()
            .filter_map(|(k, c1)| r2.get(k).filter(|c2| *c2 != c1).map(|c2| (k.clone(), (*c1).into(), (*c2).into())))
            .collect(),
        shares: Vec::new(),
        displaced: Vec::new(),
    };
    for key in f1.keys().chain(f2.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (b, a) = (f1.get(key).copied().unwrap_or(0.0), f2.get(key).copied().unwrap_or(0.0));
        if (a - b).abs() > 1e-6 {
            d.shares.push((key.0.clone(), key.1.clone(), b, a));
        }
    }
    d
}
