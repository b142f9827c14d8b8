//! Turns the scheduler's reasons (indices into a snapshot) into the pending reason a
//! workload's status carries (names, and a sentence a person can read).

use berth_core::workload::PendingReason;
use berth_sched::plan::{Miss, Reason};
use berth_sched::snapshot::Snapshot;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;

/// `running_name(i)` names the workload behind `snapshot.running[i]` (`team/name`), and
/// `stops_by(i)` says when its grace period ends at the latest; `pending_name(i)` names
/// the one behind `snapshot.pending[i]`.
pub fn pending_reason(
    s: &Snapshot,
    reason: &Reason,
    running_name: impl Fn(usize) -> String,
    stops_by: impl Fn(usize) -> DateTime<Utc>,
    pending_name: impl Fn(usize) -> String,
) -> PendingReason {
    let team = |t: usize| s.teams[t].name.as_str();
    let flavor = |f: usize| s.flavors[f].as_str();
    let cluster = |c: usize| s.clusters[c].name.as_str();
    let (code, message, details) = match reason {
        Reason::QuotaLimitReached { team: t, flavor: f, used, limit, requested } => (
            "QuotaLimitReached",
            format!(
                "team {} would exceed its {} limit: uses {used}, limit {limit}, requests {requested}",
                team(*t),
                flavor(*f)
            ),
            json!({"team": team(*t), "flavor": flavor(*f), "used": used, "limit": limit, "requested": requested}),
        ),
        Reason::BudgetExhausted { team: t, flavor: f, budget, stop_new, resets_at } => {
            let resets = DateTime::from_timestamp(*resets_at, 0).unwrap_or_default();
            let resets = resets.to_rfc3339_opts(SecondsFormat::Secs, true);
            let (action, stops) = if *stop_new {
                ("stop_new", "no new work starts")
            } else {
                ("stop_borrowing", "new work runs only within the guarantee")
            };
            (
                "BudgetExhausted",
                format!("team {}'s budget of {budget} is used up: {stops} until it resets at {resets}", team(*t)),
                json!({"team": team(*t), "flavor": flavor(*f), "budget": budget, "action": action, "resets_at": resets}),
            )
        }
        Reason::GuaranteeExceeded { team: t, flavor: f, used, guaranteed, requested } => (
            "GuaranteeExceeded",
            format!(
                "non-preemptible work runs only within the guarantee: team {}{} uses {used} of {guaranteed} {} guaranteed, requests {requested}",
                team(*t),
                if s.has_child_teams(*t) { "'s own work (its guarantee less its teams')" } else { "" },
                flavor(*f)
            ),
            json!({"team": team(*t), "flavor": flavor(*f), "used": used, "guaranteed": guaranteed, "requested": requested}),
        ),
        Reason::FairShareReached { team: t, flavor: f, used, fair_share, requested } => {
            let mut details = json!({"team": team(*t), "flavor": flavor(*f), "used": used, "fair_share": fair_share, "requested": requested});
            let recent = match recent_use(s, *t, *f) {
                Some(h) => {
                    details["recent_gpu_hours"] = json!(h);
                    format!(" (weighed by the team's recent use: {} GPU-hours, decayed)", crate::budgets::hours(h))
                }
                None => String::new(),
            };
            let round = berth_core::team::round_gpus;
            let (used, fair_share, requested) = (round(*used), round(*fair_share), round(*requested));
            (
                "FairShareReached",
                format!(
                    "team {} would borrow beyond its fair share of {}: uses {used}, fair share {fair_share}{recent}, \
                     requests {requested}; the room left went to other work first",
                    team(*t),
                    flavor(*f)
                ),
                details,
            )
        }
        Reason::BorrowingPaused { flavor: f, workload } => (
            "BorrowingPaused",
            format!(
                "borrowing {} (or using a parent team's guarantee) is paused while {} waits for capacity to run \
                 within its quota",
                flavor(*f),
                pending_name(*workload)
            ),
            json!({"flavor": flavor(*f), "waiting_workload": pending_name(*workload)}),
        ),
        Reason::WaitingForPreemptor { workload } => (
            "WaitingForPreemptor",
            format!(
                "preempted for {}, which has not started yet: this workload comes back after it",
                pending_name(*workload)
            ),
            json!({"waiting_workload": pending_name(*workload)}),
        ),
        Reason::NoClusterFits { attempts } => {
            let per_flavor: Vec<_> = attempts
                .iter()
                .map(|a| {
                    let clusters: Vec<_> = a
                        .clusters
                        .iter()
                        .map(|m| {
                            let miss = match &m.miss {
                                Miss::Cordoned => json!({"code": "Cordoned"}),
                                Miss::NotEnoughGpus { free, needed } => {
                                    json!({"code": "NotEnoughGpus", "free": free, "needed": needed})
                                }
                                Miss::Fragmented => json!({"code": "Fragmented"}),
                                Miss::InsufficientCpu { free, needed } => {
                                    json!({"code": "InsufficientCpu", "free": free, "needed": needed})
                                }
                                Miss::InsufficientMemory { free, needed } => {
                                    json!({"code": "InsufficientMemory", "free_mib": free, "needed_mib": needed})
                                }
                                Miss::Topology => json!({"code": "Topology"}),
                                Miss::Reserved => json!({"code": "Reserved"}),
                            };
                            json!({"cluster": cluster(m.cluster), "miss": miss})
                        })
                        .collect();
                    let borrowing = a.borrowing.as_ref().map(|b| {
                        json!({"team": team(b.team), "used": b.used, "own_guarantee": b.guaranteed, "requested": b.requested})
                    });
                    json!({"flavor": flavor(a.flavor), "clusters": clusters, "borrowing": borrowing})
                })
                .collect();
            // The clusters nearest to taking it first; past the first few, a count of the
            // others by why (each is in `details.attempts`): a site of 18 clusters made a
            // line `berth queue` could not show.
            let mut misses: Vec<_> =
                attempts.iter().flat_map(|a| a.clusters.iter().map(move |m| (a.flavor, m))).collect();
            misses.sort_by(|(_, a), (_, b)| nearness(&a.miss).total_cmp(&nearness(&b.miss)).reverse());
            let mut summary: Vec<String> = misses
                .iter()
                .take(CLUSTERS_NAMED)
                .map(|(f, m)| {
                    let why = match &m.miss {
                        Miss::Cordoned => "cordoned".to_owned(),
                        Miss::NotEnoughGpus { free, needed } => format!("{free} GPUs free, {needed} needed"),
                        Miss::Fragmented => "free GPUs are spread over too many nodes".to_owned(),
                        Miss::InsufficientCpu { free, needed } => {
                            format!("the nodes with free GPUs have {free} CPU cores free, {needed} needed")
                        }
                        Miss::InsufficientMemory { free, needed } => {
                            format!("the nodes with free GPUs have {free} MiB of memory free, {needed} needed")
                        }
                        Miss::Topology => "no single topology block has room".to_owned(),
                        Miss::Reserved => "room is held for a starving or reclaiming workload".to_owned(),
                    };
                    format!("{}/{}: {why}", cluster(m.cluster), flavor(*f))
                })
                .collect();
            if misses.len() > CLUSTERS_NAMED {
                let mut counts: Vec<(&str, usize)> = Vec::new();
                for (_, m) in &misses[CLUSTERS_NAMED..] {
                    let kind = match m.miss {
                        Miss::Cordoned => "cordoned",
                        Miss::NotEnoughGpus { .. } => "fewer GPUs free",
                        Miss::Fragmented => "GPUs spread over nodes",
                        Miss::InsufficientCpu { .. } => "too few CPU cores",
                        Miss::InsufficientMemory { .. } => "too little memory",
                        Miss::Topology => "no topology block with room",
                        Miss::Reserved => "room held for another",
                    };
                    match counts.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((kind, 1)),
                    }
                }
                let counts: Vec<String> = counts.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
                summary.push(format!("{} more ({})", misses.len() - CLUSTERS_NAMED, counts.join(", ")));
            }
            // Borrowed work preempts no one for room: say so where it would borrow.
            let borrowing: Vec<String> = attempts
                .iter()
                .filter_map(|a| {
                    let b = a.borrowing.as_ref()?;
                    let own = if s.has_child_teams(b.team) {
                        format!("team {}'s own work (its guarantee less its teams')", team(b.team))
                    } else {
                        format!("team {}", team(b.team))
                    };
                    Some(format!(
                        ". In {} it would borrow: {own} uses {} of {} guaranteed GPUs and this asks {}; borrowed \
                         work starts only where GPUs are free and is no reason to preempt another team's work \
                         (work within the guarantee is)",
                        flavor(a.flavor),
                        b.used,
                        b.guaranteed,
                        b.requested
                    ))
                })
                .collect();
            (
                "NoClusterFits",
                format!("no cluster has room: {}{}", summary.join("; "), borrowing.concat()),
                json!({"attempts": per_flavor}),
            )
        }
        Reason::WaitingForReclaim { cluster: c, flavor: f, victims } => {
            // Their GPUs stay theirs until the backend says they stopped.
            let by = victims.iter().map(|&v| stops_by(v)).max().map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true));
            let victims: Vec<String> = victims.iter().map(|&v| running_name(v)).collect();
            let count = match victims.len() {
                1 => "1 workload".to_owned(),
                n => format!("{n} workloads"),
            };
            (
                "WaitingForReclaim",
                format!(
                    "waiting for {count} to stop on {}/{} ({}); grace ends at {}",
                    cluster(*c),
                    flavor(*f),
                    victims.join(", "),
                    by.as_deref().unwrap_or("-")
                ),
                json!({"cluster": cluster(*c), "flavor": flavor(*f), "victims": victims, "grace_ends_at": by}),
            )
        }
        Reason::WaitingForMinRuntime { cluster: c, flavor: f, victims, until } => {
            let until =
                DateTime::from_timestamp(*until, 0).unwrap_or_default().to_rfc3339_opts(SecondsFormat::Secs, true);
            let victims: Vec<String> = victims.iter().map(|&v| running_name(v)).collect();
            (
                "WaitingForMinRuntime",
                format!(
                    "only preempting {} on {}/{} would make room, and it is protected by its min runtime until {until}",
                    victims.join(", "),
                    cluster(*c),
                    flavor(*f),
                ),
                json!({"cluster": cluster(*c), "flavor": flavor(*f), "victims": victims, "protected_until": until}),
            )
        }
        Reason::TopologyUnsatisfiable { flavor: f } => (
            "TopologyUnsatisfiable",
            format!("no single topology block of {} can hold all tasks", flavor(*f)),
            json!({"flavor": flavor(*f)}),
        ),
        Reason::ClustersCordoned => {
            ("ClustersCordoned", "every cluster the placement allows is cordoned or unreachable".to_owned(), json!({}))
        }
        Reason::Unschedulable { why } => {
            let words: Vec<String> = why.iter().map(|i| i.describe(s)).collect();
            let details: Vec<serde_json::Value> = why
                .iter()
                .map(|i| {
                    let mut v = serde_json::to_value(i).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("flavor".into(), json!(flavor(i.flavor())));
                        if let Some(t) = o.get("team").and_then(serde_json::Value::as_u64) {
                            o.insert("team".into(), json!(team(usize::try_from(t).unwrap_or(0))));
                        }
                    }
                    v
                })
                .collect();
            (
                "Unschedulable",
                format!(
                    "can never run as submitted: {}; change the workload or the quotas and clusters",
                    words.join("; ")
                ),
                json!({"flavors": details}),
            )
        }
        Reason::PlacementMatchesNoCluster => (
            "PlacementMatchesNoCluster",
            "no cluster matches the placement and has nodes of an acceptable flavor".to_owned(),
            json!({}),
        ),
    };
    PendingReason { code: code.into(), message, details: Some(details) }
}

/// The recent GPU-hours of `team`'s subtree on `flavor`, where its tree shares over time.
fn recent_use(s: &Snapshot, team: usize, flavor: usize) -> Option<f64> {
    s.teams[team].recent_usage.as_ref()?;
    let below = |t: usize| std::iter::successors(Some(t), |&a| s.teams[a].parent).any(|a| a == team);
    let used = (0..s.teams.len())
        .filter(|&t| below(t))
        .filter_map(|t| s.teams[t].recent_usage.as_ref().map(|r| r[flavor]))
        .fold(0.0, |a, b| a + b);
    Some(used)
}

/// How many clusters a `NoClusterFits` sentence names; the others are counted.
const CLUSTERS_NAMED: usize = 3;

/// How near a cluster came to taking the workload, to name the nearest first: short of
/// GPUs by the fewest missing, then the misses with room but not of the right shape, held
/// room, and cordoned clusters last.
fn nearness(miss: &Miss) -> f64 {
    match miss {
        Miss::NotEnoughGpus { free, needed } => 1.0 - (needed - free) / needed.max(f64::MIN_POSITIVE),
        Miss::Fragmented | Miss::Topology => 2.0,
        Miss::InsufficientCpu { .. } | Miss::InsufficientMemory { .. } => 1.5,
        Miss::Reserved => 1.2,
        Miss::Cordoned => -1.0,
    }
}

#[cfg(test)]
mod tests {
    use berth_sched::snapshot::{Quota, Team};

    use super::*;

    fn team(name: &str, parent: Option<usize>, recent: Option<f64>) -> Team {
        Team {
            name: name.into(),
            parent,
            quotas: vec![Quota::default()],
            budget_stops: Vec::new(),
            min_runtime_seconds: None,
            recent_usage: recent.map(|r| vec![r]),
        }
    }

    fn message(s: &Snapshot) -> PendingReason {
        let reason =
            Reason::FairShareReached { team: 0, flavor: 0, used: 4.0, fair_share: 3.200_000_000_1, requested: 1.0 };
        pending_reason(s, &reason, |_| String::new(), |_| DateTime::UNIX_EPOCH, |_| String::new())
    }

    #[test]
    fn a_fair_share_weighed_by_recent_use_says_the_subtrees_recent_gpu_hours() {
        let mut s = Snapshot { flavors: vec!["h100".into()], ..Snapshot::default() };
        s.teams =
            vec![team("dept", None, Some(10.0)), team("nlp", Some(0), Some(21.25)), team("other", None, Some(99.0))];
        let r = message(&s);
        assert!(
            r.message.contains("fair share 3.2 (weighed by the team's recent use: 31.2 GPU-hours, decayed)"),
            "{}",
            r.message
        );
        assert_eq!(r.details.expect("details")["recent_gpu_hours"], 31.25);
        // A tree that does not share over time: no word of it.
        s.teams = vec![team("dept", None, None)];
        let r = message(&s);
        assert!(r.message.contains("fair share 3.2, requests 1"), "{}", r.message);
        assert!(r.details.expect("details").get("recent_gpu_hours").is_none());
    }

    /// Of six clusters, the three nearest to taking it are named, nearest first (room of
    /// the wrong shape, then the fewest GPUs short), and the others counted by why, with
    /// every one in the details.
    #[test]
    fn no_cluster_fits_names_the_nearest_clusters_and_counts_the_rest() {
        use berth_core::cluster::{ClusterKind, Packing};
        use berth_sched::plan::{ClusterMiss, FlavorAttempt};
        use berth_sched::snapshot::Cluster;
        let cluster = |name: &str| Cluster {
            name: name.into(),
            kind: ClusterKind::Sim,
            labels: Default::default(),
            cordoned: false,
            fractional_gpus: None,
            packing: Packing::default(),
        };
        let s = Snapshot {
            flavors: vec!["h100".into()],
            clusters: ["c0", "c1", "c2", "c3", "c4", "c5"].map(cluster).to_vec(),
            ..Snapshot::default()
        };
        let short = |free| Miss::NotEnoughGpus { free, needed: 8.0 };
        let misses = [Miss::Cordoned, short(2.0), Miss::Cordoned, short(6.0), Miss::Fragmented, short(1.0)];
        let clusters = misses.into_iter().enumerate().map(|(cluster, miss)| ClusterMiss { cluster, miss }).collect();
        let reason = Reason::NoClusterFits { attempts: vec![FlavorAttempt { flavor: 0, clusters, borrowing: None }] };
        let r = pending_reason(&s, &reason, |_| String::new(), |_| DateTime::UNIX_EPOCH, |_| String::new());
        assert_eq!(
            r.message,
            "no cluster has room: c4/h100: free GPUs are spread over too many nodes; c3/h100: 6 GPUs free, 8 needed; \
             c1/h100: 2 GPUs free, 8 needed; 3 more (1 fewer GPUs free, 2 cordoned)"
        );
        assert_eq!(r.details.expect("details")["attempts"][0]["clusters"].as_array().map(Vec::len), Some(6));
    }
}
