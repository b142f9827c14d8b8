//! Cluster use cases.

use berth_core::apply::{self, Applied, ApplyAction, IfMatch};
use berth_core::cluster::{Cluster, ClusterApply, ClusterKind, NodeView};
use berth_core::event::AuditVerb;
use berth_core::page::{Page, PageRequest};
use berth_core::{ClusterId, Error};
use berth_store::{PgPool, cluster as store, flavor as flavors};

use crate::context::OpContext;
use crate::{
    ApplyResult, CREATE_RACE_ATTEMPTS, Write, audit_apply, audit_change, current, lost_create_race, missing_references,
    resource_version,
};

const KIND: &str = "cluster";

/// Creates or replaces a cluster.
///
/// # Errors
/// [`Error::Invalid`] for a bad body (including a changed `kind` or an unknown flavor),
/// [`Error::PreconditionFailed`] / [`Error::Conflict`] for stale versions, store errors.
pub async fn cluster_apply(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &ClusterApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Cluster> {
    apply_as(db, opctx, name, input, if_match, Write::Commit).await
}

/// [`cluster_apply`]'s every check, and the cluster as it would be, without writing it
/// (`?dry_run=true`).
///
/// # Errors
/// As [`cluster_apply`].
pub async fn cluster_apply_dry_run(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &ClusterApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Cluster> {
    apply_as(db, opctx, name, input, if_match, Write::RollBack).await
}

async fn apply_as(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &ClusterApply,
    if_match: Option<&IfMatch>,
    write: Write,
) -> ApplyResult<Cluster> {
    opctx.access().platform_admin("change clusters")?;
    input.validate(name)?;
    let labels = input.metadata.labels.clone().unwrap_or_default();
    for _ in 0..CREATE_RACE_ATTEMPTS {
        let mut tx = berth_store::begin(db).await?;
        check_flavors(&mut tx, input).await?;
        let existing = store::cluster_fetch_for_update(&mut tx, name).await?;
        if let Some(c) = &existing
            && c.spec.kind != input.spec.kind
        {
            return Err(Error::invalid(
                "/spec/kind",
                format!("is immutable: this cluster is {}; delete and recreate it to change", c.spec.kind.as_str()),
            ));
        }
        // A simulated cluster's nodes are its state: its jobs are placed on them, and its
        // journal is replayed onto them at a restart.
        if let Some(c) = &existing
            && let (Some(was), Some(is)) = (&c.spec.sim, &input.spec.sim)
            && was.node_groups != is.node_groups
        {
            return Err(Error::invalid(
                "/spec/sim/node_groups",
                "are fixed when a simulated cluster is created; delete and recreate it to change them \
                 (spec.sim.failed_nodes takes nodes out and brings them back)",
            ));
        }
        let cur = existing.as_ref().map(|c| current(&c.metadata, &c.spec)).transpose()?;
        let (cluster, applied) = match apply::plan(cur, &input.metadata, &input.spec, &labels, if_match)? {
            ApplyAction::Unchanged => return Ok((existing.expect("unchanged implies existing"), Applied::Unchanged)),
            ApplyAction::Create => {
                match store::cluster_insert(&mut tx, ClusterId::new(), name, &labels, &input.spec).await? {
                    Some(c) => (c, Applied::Created),
                    None => continue,
                }
            }
            ApplyAction::Update { generation } => {
                let uid = ClusterId(existing.as_ref().expect("update implies existing").metadata.uid);
                (store::cluster_update(&mut tx, uid, &labels, &input.spec, generation).await?, Applied::Updated)
            }
        };
        let before = existing.as_ref().map(|c| (c.metadata.generation, &c.spec));
        audit_apply(&mut tx, &opctx.actor, KIND, (&cluster.metadata, &cluster.spec), applied, before).await?;
        if write == Write::Commit {
            berth_store::commit(tx).await?;
            crate::feasibility::forget(db);
        }
        return Ok((cluster, applied));
    }
    Err(lost_create_race(KIND, name))
}

/// The flavors the body names exist, and are held until the transaction ends (see
/// [`flavors::flavor_missing`]).
async fn check_flavors(tx: &mut berth_store::PgConnection, input: &ClusterApply) -> Result<(), Error> {
    let spec = &input.spec;
    let refs: Vec<(String, String)> = match (&spec.sim, &spec.slurm, &spec.kubernetes) {
        (Some(sim), _, _) => sim
            .node_groups
            .iter()
            .enumerate()
            .map(|(i, g)| (format!("/spec/sim/node_groups/{i}/flavor"), g.flavor.clone()))
            .collect(),
        (None, Some(slurm), _) => slurm
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("/spec/slurm/partitions/{i}/flavor"), p.flavor.clone()))
            .collect(),
        (None, None, Some(k8s)) => k8s
            .flavors
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("/spec/kubernetes/flavors/{i}/flavor"), f.flavor.clone()))
            .collect(),
        (None, None, None) => return Ok(()),
    };
    let names: Vec<String> = refs.iter().map(|(_, f)| f.clone()).collect();
    let missing = flavors::flavor_missing(tx, &names).await?;
    let errors = missing_references(&missing, refs.into_iter(), "flavor");
    if errors.is_empty() { Ok(()) } else { Err(Error::Invalid(errors)) }
}

/// Fetches a cluster (anyone authenticated reads clusters: see
/// [`berth_core::auth::Access::read_catalogue`]).
///
/// # Errors
/// [`Error::NotFound`] when there is none by that name.
pub async fn cluster_get(db: &PgPool, opctx: &OpContext, name: &str) -> Result<Cluster, Error> {
    opctx.access().read_catalogue()?;
    store::cluster_fetch(db, name).await?.ok_or_else(|| not_found(name))
}

/// A cluster's nodes, with the GPUs Berth holds on each.
///
/// # Errors
/// [`Error::NotFound`] when there is no such cluster; store errors.
pub async fn cluster_nodes(db: &PgPool, opctx: &OpContext, name: &str) -> Result<Vec<NodeView>, Error> {
    cluster_get(db, opctx, name).await?;
    store::cluster_nodes_of(db, name).await
}

/// Lists clusters, optionally of one kind.
///
/// # Errors
/// Store errors.
pub async fn cluster_list(
    db: &PgPool,
    opctx: &OpContext,
    kind: Option<ClusterKind>,
    page: &PageRequest<String>,
) -> Result<Page<Cluster>, Error> {
    opctx.access().read_catalogue()?;
    store::cluster_list(db, kind, page).await
}

/// Deletes a cluster that runs no live workload.
///
/// # Errors
/// [`Error::NotFound`], [`Error::PreconditionFailed`], or [`Error::Conflict`] naming the
/// workloads still placed on it.
pub async fn cluster_delete(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    if_match: Option<&IfMatch>,
) -> Result<Cluster, Error> {
    opctx.access().platform_admin("delete clusters")?;
    let mut tx = berth_store::begin(db).await?;
    let cluster = store::cluster_fetch_for_update(&mut tx, name).await?.ok_or_else(|| not_found(name))?;
    apply::check_delete(resource_version(&cluster.metadata)?, if_match)?;
    let users = store::cluster_users(&mut tx, name).await?;
    if !users.is_empty() {
        return Err(Error::Conflict {
            field: None,
            message: format!(
                "cluster {name:?} still holds workloads {}; cordon it and wait for them to finish",
                users.join(", ")
            ),
        });
    }
    store::cluster_delete(&mut tx, ClusterId(cluster.metadata.uid)).await?;
    audit_change(&mut tx, &opctx.actor, AuditVerb::Delete, KIND, &cluster.metadata).await?;
    berth_store::commit(tx).await?;
    crate::feasibility::forget(db);
    Ok(cluster)
}

fn not_found(name: &str) -> Error {
    Error::NotFound { kind: KIND, name: name.into() }
}
