//! The door check: a workload that can never run as submitted is refused (422 naming the
//! field to change) instead of waiting forever, and so is one that asks for more protection
//! from preemption than its team allows.
//!
//! It asks the scheduler's own test (`berth_sched::feasible`) on a snapshot of the teams,
//! clusters and nodes, with the one workload pending and nothing running, so the door and
//! the scheduler's `Unschedulable` never disagree. Refused only what is knowable at
//! submission, in every flavor the workload accepts: above a limit of its team or an
//! ancestor; non-preemptible above its team's guarantee; and, once every cluster its
//! placement allows has reported its nodes, a shape no such cluster could hold even empty,
//! or work no such cluster can run (a fraction of a GPU, no container image). A placement
//! no cluster matches yet is accepted: the cluster may be registered next.
//!
//! The teams, clusters and nodes are read at most every [`FRESH_FOR`] per database (the
//! nodes only when their version moved), and anew after a team or cluster changes through
//! this process; a refusal is always re-checked against a fresh read, so a stale read
//! (another replica's change, a node inventory just reported) can let an impossible
//! workload in — it then waits as `Unschedulable` — but never refuses a possible one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_core::cluster::Cluster;
use berth_core::team::Team;
use berth_core::workload::WorkloadSpec;
use berth_core::{ClusterId, Error, FieldError, TeamId};
use berth_sched::feasible::{Impossible, Shapes};
use berth_sched::snapshot as s;
use berth_store::PgPool;
use berth_store::cluster::{ClusterNode, KeptNodes};

use crate::context::OpContext;

/// How long a read of teams, clusters and nodes is used for accepting workloads.
pub const FRESH_FOR: Duration = Duration::from_secs(5);

/// What the check reads, as the scheduler's snapshot of the teams, clusters and nodes
/// (nothing running or pending), built once per read.
struct Facts {
    read_at: Instant,
    snapshot: s::Snapshot,
    shapes: Shapes,
    ancestors: Vec<Vec<usize>>,
    flavor_ix: HashMap<String, usize>,
    team_ix: HashMap<String, usize>,
    team_uids: Vec<TeamId>,
    /// Per cluster: whether it has reported nodes.
    reported: Vec<bool>,
}

/// The last read per database (tests and benchmarks run several in one process).
static READS: Mutex<Option<HashMap<String, Arc<Facts>>>> = Mutex::new(None);
/// The nodes of the last read per database, read again only when they changed.
static NODES: tokio::sync::Mutex<Option<HashMap<String, Option<KeptNodes>>>> = tokio::sync::Mutex::const_new(None);

async fn read(db: &PgPool) -> Result<Arc<Facts>, Error> {
    let mut tx = berth_store::begin_snapshot(db).await?;
    let flavors = berth_store::flavor::flavor_names(&mut *tx).await?;
    let teams = berth_store::team::team_list_all(&mut *tx).await?;
    let clusters = berth_store::cluster::cluster_list_all(&mut *tx).await?;
    let nodes = {
        let mut kept = NODES.lock().await;
        let kept = kept.get_or_insert_with(HashMap::new).entry(crate::database_key(db)).or_default();
        berth_store::cluster::cluster_nodes_current(&mut tx, kept).await?
    };
    berth_store::commit(tx).await?;
    let facts = Arc::new(Facts::build(flavors, &teams, &clusters, &nodes));
    READS.lock().expect("not poisoned").get_or_insert_with(HashMap::new).insert(crate::database_key(db), facts.clone());
    Ok(facts)
}

impl Facts {
    fn build(flavors: Vec<String>, teams: &[Team], clusters: &[Cluster], nodes: &[(ClusterId, ClusterNode)]) -> Self {
        let flavor_ix: HashMap<String, usize> = flavors.iter().enumerate().map(|(i, f)| (f.clone(), i)).collect();
        let team_ix: HashMap<String, usize> =
            teams.iter().enumerate().map(|(i, t)| (t.metadata.name.clone(), i)).collect();
        let team_uids = teams.iter().map(|t| TeamId(t.metadata.uid)).collect();
        // Budgets reset: what could ever run does not depend on them.
        let teams = s::Team::tree(teams, &flavors, chrono::Utc::now());
        let mut snapshot = s::Snapshot { flavors, teams, ..s::Snapshot::default() };
        let cluster_ix: HashMap<ClusterId, usize> =
            clusters.iter().enumerate().map(|(i, c)| (ClusterId(c.metadata.uid), i)).collect();
        for c in clusters {
            // Cordons pass; what is checked is whether it could ever run.
            let labels = c.placement_labels();
            snapshot.clusters.push(s::Cluster {
                name: c.metadata.name.clone(),
                kind: c.spec.kind,
                labels,
                cordoned: false,
                fractional_gpus: Some(c.spec.capabilities().fractional_gpus),
                packing: c.spec.packing,
            });
        }
        let mut reported = vec![false; clusters.len()];
        for (cluster, n) in nodes {
            let (Some(&c), Some(&f)) = (cluster_ix.get(cluster), n.flavor.as_ref().and_then(|f| flavor_ix.get(f)))
            else {
                continue;
            };
            reported[c] = true;
            let (gpus, unavailable, block) = (n.gpus, n.unavailable_gpus, n.block.as_deref());
            let node = s::Node::from_inventory(&n.name, c, f, gpus, unavailable, n.cpus, n.memory_mib, block, true);
            snapshot.nodes.push(node);
        }
        let shapes = Shapes::of(&snapshot);
        let ancestors = berth_sched::cycle::ancestors(&snapshot);
        Self { read_at: Instant::now(), snapshot, shapes, ancestors, flavor_ix, team_ix, team_uids, reported }
    }
}

/// Drops the last read of `db`: teams or clusters changed here, so the next check reads
/// them anew (other replicas' reads age out within [`FRESH_FOR`]).
pub fn forget(db: &PgPool) {
    if let Some(reads) = READS.lock().expect("not poisoned").as_mut() {
        reads.remove(&crate::database_key(db));
    }
}

fn recent(db: &PgPool) -> Option<Arc<Facts>> {
    let reads = READS.lock().expect("not poisoned");
    reads.as_ref()?.get(&crate::database_key(db)).filter(|f| f.read_at.elapsed() < FRESH_FOR).cloned()
}

/// The uid of `team` when the last read (at most [`FRESH_FOR`] old, else read now) knows
/// the team and every one of `flavors`; `None` otherwise. A submission may be written on
/// it without reading them again: the write checks in the same statement that the team
/// and flavors still exist (`berth_store::workload::workload_create_many`).
///
/// # Errors
/// Store errors.
pub async fn resolve(db: &PgPool, team: &str, flavors: &[String]) -> Result<Option<TeamId>, Error> {
    let facts = match recent(db) {
        Some(facts) => facts,
        None => read(db).await?,
    };
    let Some(&t) = facts.team_ix.get(team) else { return Ok(None) };
    Ok(flavors.iter().all(|f| facts.flavor_ix.contains_key(f)).then(|| facts.team_uids[t]))
}

/// Refuses `specs` (each with the prefix of its fields: `""` for a single workload,
/// `/items/{i}` in a batch) in `team` when one can never run as submitted:
/// [`Error::Invalid`] with one error per accepted flavor of each, on the field to change,
/// naming only teams the caller may read (an ancestor's limit names "an ancestor team").
///
/// # Errors
/// As described, and store errors.
pub async fn refuse_impossible(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    specs: &[(String, &WorkloadSpec)],
) -> Result<(), Error> {
    let (facts, read_now) = match recent(db) {
        Some(facts) => (facts, false),
        None => (read(db).await?, true),
    };
    if impossible(&facts, team, specs).is_empty() {
        return Ok(());
    }
    // Never refuse on an earlier read.
    let facts = if read_now { facts } else { read(db).await? };
    let redactor = opctx.redactor();
    let errors: Vec<FieldError> = impossible(&facts, team, specs)
        .into_iter()
        .map(|e| FieldError::new(e.field, redactor.text(&e.message)))
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(Error::Invalid(errors)) }
}

/// The field errors of every spec that can never run, or that asks for more protection from
/// preemption than its team allows.
fn impossible(facts: &Facts, team: &str, specs: &[(String, &WorkloadSpec)]) -> Vec<FieldError> {
    let Some(&t) = facts.team_ix.get(team) else { return Vec::new() };
    let s = &facts.snapshot;
    let mut errors = Vec::new();
    for (at, spec) in specs {
        // Protection beyond what the team allows would hold off its lenders' reclaim.
        if let Some(asked) = spec.preemption.map(|p| p.min_runtime_seconds) {
            let allowed = s::min_runtime(&s.teams, t, None);
            if asked > allowed {
                errors.push(FieldError::new(
                    format!("{at}/spec/preemption/min_runtime_seconds"),
                    format!(
                        "must be at most {allowed}: the min runtime team {team} allows (the lowest \
                         spec.preemption.min_runtime_seconds of it and the teams above it; none unless its top-level \
                         team sets one)"
                    ),
                ));
            }
        }
        let flavors = spec.tasks.resources.flavors.iter().filter_map(|f| facts.flavor_ix.get(f).copied()).collect();
        let p = s::Pending::of(at.clone(), t, flavors, spec, 0);
        let why = berth_sched::feasible::impossible_for(s, &facts.shapes, &facts.ancestors, &p);
        // Shapes and capabilities are known only once every cluster it may use reported.
        let all_reported = s.clusters.iter().zip(&facts.reported).all(|(c, &r)| r || !p.placement_allows(c));
        let knowable = |i: &Impossible| match i {
            Impossible::AboveLimit { .. } | Impossible::AboveGuarantee { .. } => true,
            Impossible::NoClusterHolds { .. } | Impossible::NotCapable { .. } => all_reported,
            Impossible::NoNodes { .. } => false,
        };
        if p.flavors.is_empty() || why.len() < p.flavors.len() || !why.iter().all(knowable) {
            continue;
        }
        for i in &why {
            let message = format!("can never run as submitted: {}", i.describe(s));
            errors.push(FieldError::new(format!("{at}{}", field(i)), message));
        }
    }
    errors
}

/// The field to change for `why`.
fn field(why: &Impossible) -> &'static str {
    match why {
        Impossible::AboveGuarantee { .. } => "/spec/preemptible",
        Impossible::NotCapable { missing, .. } if missing.contains("spec.kind") => "/spec/kind",
        Impossible::NotCapable { missing, .. } if missing.contains("spec.run.image") => "/spec/run/image",
        Impossible::NotCapable { missing, .. } if missing.contains("spec.run.command") => "/spec/run/command",
        // Each task fits a node, but not as many tasks on any cluster (or block).
        Impossible::NoClusterHolds { most_tasks, .. } if *most_tasks > 0 => "/spec/tasks/count",
        // A task fits no node: its GPUs, or else its CPU cores or memory.
        Impossible::NoClusterHolds { task_gpus, largest_node_gpus, .. }
            if *task_gpus <= f64::from(*largest_node_gpus) =>
        {
            "/spec/tasks/resources"
        }
        _ => "/spec/tasks/resources/gpus",
    }
}
