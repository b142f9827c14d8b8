//! The autoscaler of inference services (`spec.inference` with a target), as Kubernetes'
//! HPA decides: the desired replicas are the load over the target per replica, rounded
//! up, within `min_replicas..=max_replicas`; a load within 10 % of what the running
//! replicas carry changes nothing; more replicas are asked for at once, fewer only once the
//! load has asked for fewer for the whole stabilization window (and then as many as the
//! most it asked for in that window).
//!
//! A service runs `min_replicas` itself (its `tasks.count`); each replica above that is a
//! workload of its own (`{name}-r{n}`, labelled `berth.dev/replica-of: <uid>`, one task of
//! the service's shape, on the service's cluster, whose Service reaches it; a replica left
//! on another after the service moved is deleted), so the scheduler admits it like any work — within the team's
//! limit and fair share, borrowing and preemptible — and one that cannot be admitted waits
//! with its reason, which the service's `status.replicas.waiting` shows. Scaling down
//! deletes replicas (those that wait first, then the newest) with a 1 s grace, so their
//! GPUs are free at once. Replicas of a service that ended or is being stopped are deleted.
//!
//! The load is read through the service's cluster: a simulated cluster follows
//! `spec.sim.load`, a Kubernetes cluster asks its Prometheus `spec.inference.query`.

use std::collections::HashMap;

use berth_core::cluster::CLUSTER_NAME_LABEL;
use berth_core::event::EventType;
use berth_core::workload::{Checkpoint, Phase, REPLICA_OF_LABEL, Replicas, Workload, WorkloadStatus};
use berth_core::{Error, WorkloadId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{Context, EVENT_KIND, job_key, version};

/// The stabilization window where a service sets none (Kubernetes' HPA default).
pub const DEFAULT_STABILIZATION_SECONDS: u32 = 300;

/// A load within this fraction of what the running replicas carry changes nothing.
pub const TOLERANCE: f64 = 0.1;

/// Names past the replicas needed that a pass tries when some are taken.
const NAME_TRIES: usize = 16;

/// The grace period a replica gets when it is scaled away or preempted.
const REPLICA_GRACE_SECONDS: u32 = 1;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AutoscalerStatus {
    /// Running services that scale.
    pub services: usize,
    pub replicas_added: usize,
    pub replicas_removed: usize,
    /// Services whose load could not be read.
    pub unreadable: usize,
}

impl crate::runner::Report for AutoscalerStatus {
    fn changes(&self) -> usize {
        self.replicas_added + self.replicas_removed
    }

    fn waits_on_time(&self) -> bool {
        self.services > 0
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<AutoscalerStatus, Error> {
    let mut status = AutoscalerStatus::default();
    let serving = berth_store::workload::workload_list_serving(&ctx.db).await?;
    let (replicas, services): (Vec<&Workload>, Vec<&Workload>) =
        serving.iter().partition(|w| w.metadata.labels.contains_key(REPLICA_OF_LABEL));
    let scaling: HashMap<Uuid, &Workload> = services
        .iter()
        .filter(|w| w.spec.inference.as_ref().is_some_and(|i| i.target().is_some()))
        .map(|w| (w.metadata.uid, *w))
        .collect();
    let mut of_service: HashMap<Uuid, Vec<&Workload>> = HashMap::new();
    let mut orphaned = Vec::new();
    for r in replicas.into_iter().filter(|r| r.metadata.deletion_timestamp.is_none()) {
        let service = r.metadata.labels.get(REPLICA_OF_LABEL).and_then(|u| u.parse::<Uuid>().ok());
        match service.and_then(|s| scaling.get(&s)) {
            Some(s) if !stopping(s) && where_it_runs(r, s) => of_service.entry(s.metadata.uid).or_default().push(r),
            _ => orphaned.push(r),
        }
    }
    let running: Vec<&Workload> =
        scaling.values().copied().filter(|s| s.status.phase == Phase::Running && !stopping(s)).collect();
    if running.is_empty() && orphaned.is_empty() {
        return Ok(status);
    }
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    // The nodes that take work now (of clusters neither cordoned nor unreachable), by
    // flavor and GPUs free of faults a node (read again only when the inventory changed).
    let open: std::collections::HashSet<berth_core::ClusterId> = clusters
        .iter()
        .filter(|c| !c.spec.cordoned && c.status.health != berth_core::cluster::ClusterHealth::Unreachable)
        .map(|c| berth_core::ClusterId(c.metadata.uid))
        .collect();
    let name: HashMap<berth_core::ClusterId, &str> =
        clusters.iter().map(|c| (berth_core::ClusterId(c.metadata.uid), c.metadata.name.as_str())).collect();
    let mut nodes: Nodes = HashMap::new();
    for (cluster, n) in ctx.world.nodes(&ctx.db).await?.iter() {
        if let (Some(flavor), Some(cluster)) =
            (n.flavor.as_ref().filter(|_| n.schedulable && open.contains(cluster)), name.get(cluster))
        {
            let gpus = n.gpus - n.unavailable_gpus;
            *nodes.entry(((*cluster).to_owned(), flavor.clone())).or_default().entry(gpus).or_default() += 1;
        }
    }
    let now = ctx.clock.now();
    let mut plans = Vec::new();
    for service in running {
        status.services += 1;
        let mut mine = of_service.remove(&service.metadata.uid).unwrap_or_default();
        mine.sort_by_key(|r| (index(service, r), r.metadata.uid));
        let load = read_load(ctx, &clusters, service).await;
        status.unreadable += usize::from(load.is_err());
        let team = service.metadata.team.as_deref().unwrap_or_default();
        let limits = ceiling(service, &berth_store::team::team_lineage_specs(&ctx.db, team).await?);
        let held = match (limits, room_on_nodes(service, &nodes)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        plans.push(plan(service, mine, load, held, now));
    }
    if plans.iter().all(|p| p.unchanged()) && orphaned.is_empty() {
        return Ok(status);
    }
    let mut tx = ctx.begin().await?;
    for r in &orphaned {
        remove(&mut tx, r).await?;
    }
    for p in &plans {
        let (added, removed) = p.write(&mut tx, now).await?;
        status.replicas_added += added;
        status.replicas_removed += removed;
    }
    berth_store::commit(tx).await?;
    Ok(status)
}

/// Whether `replica` is pinned to the cluster `service` runs on, or either is not placed
/// yet (the service requeued: its replicas stay until it runs again).
fn where_it_runs(replica: &Workload, service: &Workload) -> bool {
    let pinned = replica.spec.placement.cluster_selector.get(CLUSTER_NAME_LABEL);
    match (pinned, &service.status.admission) {
        (Some(pinned), Some(a)) => *pinned == a.cluster,
        _ => true,
    }
}

/// A service whose cancellation or deletion was asked for.
fn stopping(w: &Workload) -> bool {
    w.metadata.deletion_timestamp.is_some() || w.status.cancellation.is_some()
}

/// A replica's number, from its name (`{service}-r{n}`).
fn index(service: &Workload, replica: &Workload) -> u32 {
    let prefix = replica_prefix(&service.metadata.name);
    replica.metadata.name.strip_prefix(&prefix).and_then(|n| n.parse().ok()).unwrap_or(u32::MAX)
}

/// The names of a service's replicas start with this, then their number.
fn replica_prefix(service: &str) -> String {
    // Room for `-r` and four digits within a 63-character name.
    let cut = service.char_indices().nth(57).map_or(service.len(), |(i, _)| i);
    format!("{}-r", service[..cut].trim_end_matches('-'))
}

async fn read_load(
    ctx: &Context,
    clusters: &[berth_core::cluster::Cluster],
    w: &Workload,
) -> Result<Option<f64>, String> {
    let a = w.status.admission.as_ref().ok_or("not admitted")?;
    let cluster = clusters.iter().find(|c| c.metadata.name == a.cluster).ok_or("its cluster is gone")?;
    let backend =
        crate::reachable_backend(ctx, cluster).ok_or_else(|| format!("cluster {} does not answer", a.cluster))?;
    let query = w.spec.inference.as_ref().and_then(|i| i.query.as_deref());
    backend.load(job_key(w), query).await.map_err(|e| e.to_string())
}

/// What one pass decides for one service.
struct Plan<'a> {
    service: &'a Workload,
    replicas: Replicas,
    /// How many replicas to add, and numbers no replica of this service holds (more than
    /// needed: a replica being deleted, or one that ended and is kept, still holds its
    /// name).
    add: usize,
    numbers: Vec<u32>,
    remove: Vec<&'a Workload>,
    load: Option<f64>,
}

/// The most replicas (the service's own tasks among them) its team's limits could ever
/// hold at once: on each flavor it accepts, the lowest limit of the team and those above
/// it; the flavor that holds the most. None when some flavor has no limit on the way up
/// (or the service takes no GPU).
fn ceiling(service: &Workload, lineage: &[(String, berth_core::team::TeamSpec)]) -> Option<u32> {
    let gpus = service.spec.tasks.resources.gpus;
    if gpus <= 0.0 || lineage.is_empty() {
        return None;
    }
    let mut most = 0;
    for flavor in &service.spec.tasks.resources.flavors {
        let limit = lineage
            .iter()
            .filter_map(|(_, spec)| spec.quotas.iter().find(|q| &q.flavor == flavor).and_then(|q| q.limit))
            .min()?;
        most = most.max((f64::from(limit) / gpus + 1e-9).floor() as u32);
    }
    Some(most)
}

/// The most replicas (the service's own tasks among them) the nodes of the flavors it
/// accepts that take work now (`nodes`) could hold at once, were they all free; None when
/// it takes no GPU. A team without a limit is bounded only by this: a service asking for
/// 1,000 one-GPU replicas where 80 GPUs exist made 1,000 workloads.
fn room_on_nodes(service: &Workload, nodes: &Nodes) -> Option<u32> {
    let gpus = service.spec.tasks.resources.gpus;
    if gpus <= 0.0 {
        return None;
    }
    // Its replicas run where it runs (see `add_replica`).
    let cluster = service.status.admission.as_ref().map_or("", |a| a.cluster.as_str());
    let each = (service.spec.tasks.resources.flavors.iter())
        .filter_map(|f| nodes.get(&(cluster.to_owned(), f.clone())))
        .flatten();
    let room: u64 = each.map(|(&g, &n)| (f64::from(g.max(0)) / gpus + 1e-9).floor() as u64 * n).sum();
    Some(u32::try_from(room).unwrap_or(u32::MAX))
}

/// What a pass does for one service. `held`: the lower of its [`ceiling`] and
/// [`room_on_nodes`]. Replicas above it could
/// never all run: only one of them is added, to wait with the limit's reason (a service
/// with `max_replicas: 1000` in a team limited to 4 GPUs made 999 workloads that could never
/// be admitted, each in every queue and cycle).
fn plan<'a>(
    service: &'a Workload,
    mine: Vec<&'a Workload>,
    load: Result<Option<f64>, String>,
    held: Option<u32>,
    now: DateTime<Utc>,
) -> Plan<'a> {
    let inf = service.spec.inference.as_ref().expect("a scaling service");
    let target = inf.target().expect("a scaling service");
    let base = service.spec.tasks.count;
    let running = base + u32::try_from(mine.iter().filter(|r| r.status.phase == Phase::Running).count()).unwrap_or(0);
    let wanted = base + u32::try_from(mine.len()).unwrap_or(u32::MAX - base);
    let before = service.status.replicas.clone().unwrap_or_default();
    let waits = mine.iter().find(|r| r.status.phase == Phase::Pending).map(|r| {
        let why = r.status.pending_reason.as_ref().map_or("waiting for admission", |p| p.message.as_str());
        format!("replica {} waits: {why}", r.metadata.name)
    });
    let (desired, waiting, load) = match load {
        Ok(Some(load)) => {
            let carried = f64::from(running.max(1)) * target;
            let desired = if (load / carried - 1.0).abs() <= TOLERANCE {
                wanted
            } else {
                ((load / target).ceil().min(f64::from(u32::MAX))) as u32
            };
            (desired.clamp(inf.min_replicas, inf.max_replicas), waits, Some(load))
        }
        Ok(None) => (wanted, waits.or(Some("no load reported yet".into())), None),
        Err(e) => (wanted, Some(format!("cannot read its load: {e}")), None),
    };
    let mut replicas = Replicas { current: running, desired, load, waiting, ..before.clone() };
    replicas.load_read_at = if load.is_some() { Some(now) } else { before.load_read_at };
    let (mut add, mut numbers, mut remove) = (0, Vec::new(), Vec::new());
    let room = held.map_or(desired, |h| desired.min(h.saturating_add(1).max(base)));
    if desired > wanted && room > wanted {
        let taken: Vec<u32> = mine.iter().map(|r| index(service, r)).collect();
        add = (room - wanted) as usize;
        numbers = (1..).filter(|n| !taken.contains(n)).take(add + NAME_TRIES).collect();
        (replicas.low_since, replicas.low_max) = (None, None);
    } else if wanted > room.max(running + 1) && mine.iter().any(|r| r.status.phase == Phase::Pending) {
        // Room went (a cluster cordoned or gone, nodes failed): the waiting replicas beyond
        // it go at once, newest first (what runs stays).
        let mut waiting: Vec<&Workload> = mine.iter().copied().filter(|r| r.status.phase == Phase::Pending).collect();
        waiting.sort_by_key(|r| std::cmp::Reverse(index(service, r)));
        remove = waiting.into_iter().take((wanted - room.max(running + 1)) as usize).collect();
    } else if desired < wanted {
        let since = before.low_since.unwrap_or(now);
        let most = before.low_max.map_or(desired, |m| m.max(desired));
        let window = inf.scale_down_stabilization_seconds.unwrap_or(DEFAULT_STABILIZATION_SECONDS);
        if (now - since).num_seconds() >= i64::from(window) {
            let keep = most.max(base);
            // Those that wait first, then the newest.
            let mut order = mine.clone();
            order.sort_by_key(|r| (r.status.phase != Phase::Pending, std::cmp::Reverse(index(service, r))));
            remove = order.into_iter().take((wanted - keep) as usize).collect();
            (replicas.low_since, replicas.low_max) = (None, None);
        } else {
            (replicas.low_since, replicas.low_max) = (Some(since), Some(most));
        }
    } else {
        (replicas.low_since, replicas.low_max) = (None, None);
    }
    Plan { service, replicas, add, numbers, remove, load }
}

impl Plan<'_> {
    /// Nothing to write: no replica to add or remove, and a status that says the same
    /// (a load read again is written when it moved by more than the tolerance, or once a
    /// minute).
    fn unchanged(&self) -> bool {
        let before = self.service.status.replicas.clone().unwrap_or_default();
        let same_load = match (before.load, self.load) {
            (Some(a), Some(b)) => (a - b).abs() <= TOLERANCE * a.abs().max(1e-9),
            (a, b) => a == b || b.is_none(),
        };
        let fresh = match (before.load_read_at, self.replicas.load_read_at) {
            (Some(a), Some(b)) => (b - a).num_seconds() < 60,
            _ => true,
        };
        let mut settled = self.replicas.clone();
        (settled.load, settled.load_read_at) = (before.load, before.load_read_at);
        self.add == 0 && self.remove.is_empty() && same_load && fresh && settled == before
    }

    /// Adds and removes replicas and writes the service's status; how many were added
    /// and removed.
    async fn write(&self, tx: &mut berth_store::Tx<'_>, now: DateTime<Utc>) -> Result<(usize, usize), Error> {
        if self.unchanged() {
            return Ok((0, 0));
        }
        let s = self.service;
        let target = s.spec.inference.as_ref().and_then(|i| i.target()).unwrap_or(1.0);
        let load = self.load.map_or_else(|| "unknown".into(), |l| format!("{l:.2}"));
        let mut added = 0;
        for n in &self.numbers {
            if added == self.add {
                break;
            }
            if add_replica(tx, s, *n, now).await? {
                added += 1;
            }
        }
        for r in &self.remove {
            remove(tx, r).await?;
        }
        let wanted_before = self.replicas.current.max(s.spec.tasks.count);
        if added > 0 || !self.remove.is_empty() {
            let (reason, to) = if added > 0 { ("ScaledUp", "up") } else { ("ScaledDown", "down") };
            let message = format!(
                "scaled {to} to {} replicas: load {load}, {target} per replica (running {wanted_before})",
                self.replicas.desired
            );
            berth_store::event::event_record(
                &mut **tx,
                EVENT_KIND,
                s.metadata.uid,
                EventType::Normal,
                reason,
                &message,
            )
            .await?;
        }
        let write = berth_store::workload::StatusWrite {
            uid: WorkloadId(s.metadata.uid),
            resource_version: version(s)?,
            status: WorkloadStatus { replicas: Some(self.replicas.clone()), ..s.status.clone() },
        };
        berth_store::workload::workload_write_statuses(tx, std::slice::from_ref(&write)).await?;
        Ok((added, self.remove.len()))
    }
}

/// The nodes that take work now, by cluster and flavor: how many have each number of GPUs
/// free of faults.
type Nodes = HashMap<(String, String), HashMap<i32, u64>>;

/// Creates replica `n` of `service`: one task of its shape, its owner's, labelled with the
/// service, on the service's cluster (its pods answer through the service's Service, which
/// selects pods in its own cluster only: replicas placed on another cluster held GPUs that
/// served no request). False when the name is taken (it is left to the next pass).
async fn add_replica(
    tx: &mut berth_store::Tx<'_>,
    service: &Workload,
    n: u32,
    now: DateTime<Utc>,
) -> Result<bool, Error> {
    let team = service.metadata.team.as_deref().unwrap_or_default();
    let Some(team_uid) = berth_store::team::team_fetch_uid(&mut **tx, team).await? else { return Ok(false) };
    let name = format!("{}{n}", replica_prefix(&service.metadata.name));
    let mut spec = service.spec.clone();
    spec.tasks.count = 1;
    spec.inference = None;
    spec.resumable = true;
    spec.checkpoint = Some(Checkpoint { grace_seconds: REPLICA_GRACE_SECONDS });
    if let Some(a) = &service.status.admission {
        spec.placement.cluster_selector.insert(CLUSTER_NAME_LABEL.into(), a.cluster.clone());
    }
    let mut labels = service.metadata.labels.clone();
    labels.insert(REPLICA_OF_LABEL.into(), service.metadata.uid.to_string());
    let status = WorkloadStatus { submitted_at: Some(now), ..WorkloadStatus::default() };
    let actor = berth_core::event::Actor::new("berth (autoscaler)", None);
    let new = berth_store::workload::NewWorkload {
        uid: WorkloadId::new(),
        team_uid,
        team,
        name: &name,
        labels: &labels,
        spec: &spec,
        status: &status,
        owner: service.metadata.owner.as_ref(),
        actor: &actor,
    };
    let Some(created) = berth_store::workload::workload_insert(tx, &new).await? else { return Ok(false) };
    let message = format!("replica {n} of {team}/{}, added by its autoscaler", service.metadata.name);
    berth_store::event::event_record(
        &mut **tx,
        EVENT_KIND,
        created.metadata.uid,
        EventType::Normal,
        "Created",
        &message,
    )
    .await?;
    Ok(true)
}

/// Deletes a replica: the deletion controller stops its job (1 s grace) and removes it.
async fn remove(tx: &mut berth_store::Tx<'_>, replica: &Workload) -> Result<(), Error> {
    berth_store::workload::workload_mark_deleted(tx, WorkloadId(replica.metadata.uid)).await?;
    Ok(())
}
