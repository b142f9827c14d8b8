//! Cluster health: refreshes each cluster's inventory (its nodes, for the scheduler, and
//! GPUs per flavor, for people), counts failed refreshes, and after
//! `unreachable_after_failures` in a row marks the cluster `Unreachable`. While it is:
//! the scheduler gives it nothing new, its not-yet-started work (`Admitted`, `Dispatched`)
//! is requeued so it can be placed elsewhere, its running work becomes `Unknown`, and work
//! `Unknown` longer than `unknown_timeout` is requeued (resumable) or failed. A successful
//! refresh makes it `Healthy` again; status sync then settles the `Unknown` work. Work
//! being preempted stays `Preempting`: the preemption executor sees it through the outage.

use std::collections::{BTreeMap, HashMap};

use berth_adapters::{BackendError, Inventory};
use berth_core::cluster::{ClusterHealth, ClusterStatus, InventoryEntry};
use berth_core::workload::{Phase, Workload, WorkloadStatus};
use berth_core::{ClusterId, Error};
use berth_store::cluster::ClusterNode;
use serde::Serialize;

use crate::{Context, Transition, requeued, requeued_or_failed};

/// How stale a cluster's stored `last_sync` may grow while nothing else about it changes.
const LAST_SYNC_KEPT: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClusterHealthStatus {
    pub healthy: usize,
    pub degraded: usize,
    pub unreachable: usize,
    pub inventories_changed: usize,
    pub replaced: usize,
    pub unknown: usize,
    pub timed_out: usize,
}

impl crate::runner::Report for ClusterHealthStatus {
    fn changes(&self) -> usize {
        self.inventories_changed + self.replaced + self.unknown + self.timed_out
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<ClusterHealthStatus, Error> {
    let mut status = ClusterHealthStatus::default();
    let clusters = berth_store::cluster::cluster_list_all(&ctx.db).await?;
    // A deleted cluster's backend goes: its watches stop, and its credential is no longer
    // sent to the endpoint the admin removed.
    ctx.backends.retain(&clusters.iter().map(|c| c.metadata.uid).collect());
    let all_stored = ctx.world.nodes(&ctx.db).await?;
    let mut stored: HashMap<ClusterId, Vec<&ClusterNode>> = HashMap::new();
    for (c, n) in all_stored.iter() {
        stored.entry(*c).or_default().push(n);
    }
    let mut unreachable = Vec::new();
    for cluster in &clusters {
        let uid = ClusterId(cluster.metadata.uid);
        let (refreshed, api) = match ctx.backends.backend(cluster) {
            Ok(b) => (b.inventory().await, b.api_in_use()),
            Err(e) => (Err(e), None),
        };
        let now = ctx.clock.now();
        let next = match refreshed {
            Ok(inventory) => {
                let nodes = nodes(&inventory);
                let before = stored.get(&uid).map_or(&[][..], Vec::as_slice);
                if before.len() != nodes.len() || before.iter().zip(&nodes).any(|(a, b)| *a != b) {
                    let mut tx = ctx.begin().await?;
                    berth_store::cluster::cluster_nodes_replace(&mut tx, uid, &nodes).await?;
                    berth_store::commit(tx).await?;
                    status.inventories_changed += 1;
                }
                ClusterStatus {
                    health: ClusterHealth::Healthy,
                    last_sync: Some(now),
                    consecutive_failures: 0,
                    message: None,
                    api,
                    inventory: per_flavor(&inventory),
                }
            }
            Err(e) => {
                // Counted up to the threshold only, so an unreachable cluster's status
                // stays the same from one pass to the next.
                let threshold = ctx.config.unreachable_after_failures;
                // A backend Berth cannot drive (no API version in common) will not get
                // better by asking again: it is unreachable at once.
                let failures = if matches!(e, BackendError::Unsupported(_)) {
                    threshold
                } else {
                    cluster.status.consecutive_failures.saturating_add(1).min(threshold)
                };
                let health = if failures >= threshold { ClusterHealth::Unreachable } else { ClusterHealth::Degraded };
                if health != cluster.status.health {
                    tracing::warn!(cluster = %cluster.metadata.name, ?health, error = %e, "cluster refresh failed");
                }
                ClusterStatus {
                    health,
                    consecutive_failures: failures,
                    message: Some(e.to_string()),
                    ..cluster.status.clone()
                }
            }
        };
        match next.health {
            ClusterHealth::Healthy => status.healthy += 1,
            ClusterHealth::Degraded => status.degraded += 1,
            ClusterHealth::Unreachable => {
                status.unreachable += 1;
                unreachable.push(cluster.metadata.name.clone());
            }
            ClusterHealth::Unknown => {}
        }
        // A refresh that only finds the cluster as it was is stored once a minute: each write
        // wakes the scheduler.
        let seen_lately = cluster.status.last_sync.is_some_and(|t| now - t < LAST_SYNC_KEPT);
        let only_seen = ClusterStatus { last_sync: cluster.status.last_sync, ..next.clone() } == cluster.status;
        if next != cluster.status && !(only_seen && seen_lately) {
            let mut tx = ctx.begin().await?;
            berth_store::cluster::cluster_write_status(&mut *tx, uid, &next).await?;
            berth_store::commit(tx).await?;
        }
    }
    if !unreachable.is_empty() {
        let on_backends: Vec<Phase> = Phase::ALL.into_iter().filter(|p| p.holds_gpus()).collect();
        let workloads = berth_store::workload::workload_list_in_phases(&ctx.db, &on_backends, false).await?;
        let transitions: Vec<_> = workloads
            .iter()
            .filter(|w| w.status.admission.as_ref().is_some_and(|a| unreachable.contains(&a.cluster)))
            .filter_map(|w| on_unreachable(ctx, w, &mut status).map(|s| Transition::new(w, s)))
            .collect();
        crate::commit(ctx, &transitions).await?;
    }
    Ok(status)
}

/// What becomes of a workload on an unreachable cluster.
fn on_unreachable(ctx: &Context, w: &Workload, status: &mut ClusterHealthStatus) -> Option<WorkloadStatus> {
    let cluster = &w.status.admission.as_ref()?.cluster;
    let now = ctx.clock.now();
    match w.status.phase {
        Phase::Admitted | Phase::Dispatched => {
            status.replaced += 1;
            Some(requeued(w, "ClusterUnreachable", format!("cluster {cluster} is unreachable; placing it again")))
        }
        Phase::Running => {
            status.unknown += 1;
            Some(WorkloadStatus {
                phase: Phase::Unknown,
                unknown_since: Some(now),
                message: Some(format!("cluster {cluster} is unreachable; the job's state is unknown")),
                ..w.status.clone()
            })
        }
        Phase::Unknown => {
            let since = w.status.unknown_since.unwrap_or(now);
            if (now - since).to_std().unwrap_or_default() < ctx.config.unknown_timeout {
                return None;
            }
            status.timed_out += 1;
            Some(requeued_or_failed(w, "ClusterUnreachable", format!("cluster {cluster} stayed unreachable"), now))
        }
        _ => None,
    }
}

fn nodes(inventory: &Inventory) -> Vec<ClusterNode> {
    let mut nodes: Vec<ClusterNode> = inventory
        .nodes
        .iter()
        .map(|n| ClusterNode {
            name: n.name.clone(),
            flavor: n.flavor.clone(),
            gpus: i32::try_from(n.gpus).unwrap_or(i32::MAX),
            unavailable_gpus: i32::try_from(n.gpus_used_outside_berth.div_ceil(100)).unwrap_or(i32::MAX),
            cpus: i32::try_from(n.cpus).unwrap_or(i32::MAX),
            memory_mib: i64::try_from(n.memory_mib).unwrap_or(i64::MAX),
            block: n.block.clone(),
            schedulable: n.schedulable,
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

fn per_flavor(inventory: &Inventory) -> Vec<InventoryEntry> {
    let mut by: BTreeMap<&str, InventoryEntry> = BTreeMap::new();
    for n in &inventory.nodes {
        let Some(f) = &n.flavor else { continue };
        let e = by.entry(f).or_insert_with(|| InventoryEntry { flavor: f.clone(), ..InventoryEntry::default() });
        e.nodes += 1;
        e.gpus_total += f64::from(n.gpus);
        if n.schedulable {
            e.gpus_free += (f64::from(n.gpus * 100) - f64::from(n.gpus_used)).max(0.0) / 100.0;
        }
    }
    by.into_values().collect()
}
