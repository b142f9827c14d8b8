//! SQL for clusters.

use std::sync::Arc;

use berth_core::cluster::{Cluster, ClusterKind, ClusterSpec, ClusterStatus, NodeView};
use berth_core::meta::Labels;
use berth_core::page::{Page, PageRequest};
use berth_core::{ClusterId, Error};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use crate::db_error;
use crate::row::ObjectRow;

type ClusterRow = ObjectRow<ClusterSpec, ClusterStatus>;

impl From<ClusterRow> for Cluster {
    fn from(row: ClusterRow) -> Self {
        let (metadata, spec, status) = row.into_parts();
        Cluster { metadata, spec, status }
    }
}

/// Fetches a cluster by name.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_fetch(db: impl PgExecutor<'_>, name: &str) -> Result<Option<Cluster>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM clusters WHERE name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
    .map(|r| r.map(Cluster::from))
    .map_err(db_error)
}

/// Fetches a cluster by name and locks it for the rest of the transaction.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_fetch_for_update(tx: &mut PgConnection, name: &str) -> Result<Option<Cluster>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM clusters WHERE name = $1 FOR UPDATE"#,
        name
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Cluster::from))
    .map_err(db_error)
}

/// Inserts a cluster; `None` when another writer created the name first.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_insert(
    tx: &mut PgConnection,
    uid: ClusterId,
    name: &str,
    labels: &Labels,
    spec: &ClusterSpec,
) -> Result<Option<Cluster>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"INSERT INTO clusters (uid, name, kind, labels, spec) VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (name) DO NOTHING
           RETURNING uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                     generation, resource_version, created_at, updated_at"#,
        uid.0,
        name,
        spec.kind.as_str(),
        Json(labels) as _,
        Json(spec) as _,
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Cluster::from))
    .map_err(db_error)
}

/// Replaces a cluster's labels and spec (its kind never changes).
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_update(
    tx: &mut PgConnection,
    uid: ClusterId,
    labels: &Labels,
    spec: &ClusterSpec,
    generation: i64,
) -> Result<Cluster, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"UPDATE clusters
           SET labels = $2, spec = $3, generation = $4,
               resource_version = nextval('resource_version_seq'), updated_at = now()
           WHERE uid = $1
           RETURNING uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                     generation, resource_version, created_at, updated_at"#,
        uid.0,
        Json(labels) as _,
        Json(spec) as _,
        generation,
    )
    .fetch_one(tx)
    .await
    .map(Cluster::from)
    .map_err(db_error)
}

/// Deletes a cluster.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_delete(tx: &mut PgConnection, uid: ClusterId) -> Result<(), Error> {
    sqlx::query!("DELETE FROM clusters WHERE uid = $1", uid.0).execute(tx).await.map_err(db_error)?;
    Ok(())
}

/// Lists clusters by name, optionally only those of one kind.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_list(
    db: impl PgExecutor<'_>,
    kind: Option<ClusterKind>,
    page: &PageRequest<String>,
) -> Result<Page<Cluster>, Error> {
    let rows = sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM clusters
           WHERE ($1::text IS NULL OR name > $1) AND ($2::text IS NULL OR kind = $2)
           ORDER BY name LIMIT $3"#,
        page.after.as_deref(),
        kind.map(ClusterKind::as_str),
        i64::from(page.limit) + 1,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(Page::from_rows(rows, page.limit, |r| r.name.clone()).map(Cluster::from))
}

/// Names of live workloads admitted to a cluster (up to a few), which block its deletion.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_users(db: &mut PgConnection, name: &str) -> Result<Vec<String>, Error> {
    sqlx::query_scalar!(
        r#"SELECT team_name || '/' || name AS "name!" FROM workloads
           WHERE cluster = $1 AND phase NOT IN ('Succeeded', 'Failed', 'Cancelled') LIMIT 3"#,
        name
    )
    .fetch_all(db)
    .await
    .map_err(db_error)
}

/// Every cluster, by name.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_list_all(db: impl PgExecutor<'_>) -> Result<Vec<Cluster>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM clusters ORDER BY name"#
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Cluster::from).collect())
    .map_err(db_error)
}

/// Writes a cluster's status (the cluster-health controller is its only writer).
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_write_status(
    db: impl PgExecutor<'_>,
    uid: ClusterId,
    status: &ClusterStatus,
) -> Result<(), Error> {
    sqlx::query!(
        r#"UPDATE clusters SET status = $2, resource_version = nextval('resource_version_seq'), updated_at = now()
           WHERE uid = $1"#,
        uid.0,
        Json(status) as _,
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// One node of a cluster, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    pub flavor: Option<String>,
    pub gpus: i32,
    pub unavailable_gpus: i32,
    pub cpus: i32,
    pub memory_mib: i64,
    pub block: Option<String>,
    pub schedulable: bool,
}

/// A cluster's nodes by name, each with the GPUs Berth's active workloads hold on it (by
/// their placement).
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_nodes_of(db: impl PgExecutor<'_>, cluster: &str) -> Result<Vec<NodeView>, Error> {
    let rows = sqlx::query!(
        r#"SELECT n.name, n.flavor, n.gpus, n.unavailable_gpus, n.block, n.schedulable,
                  coalesce(a.allocated, 0) AS "allocated!"
           FROM clusters c JOIN cluster_nodes n ON n.cluster_uid = c.uid
           LEFT JOIN (
               SELECT p ->> 'node' AS node, sum((w.spec #>> '{tasks,resources,gpus}')::float8) AS allocated
               FROM workloads w, jsonb_array_elements(w.status #> '{admission,placement}') p
               WHERE w.cluster = $1 AND w.phase IN ('Admitted', 'Dispatched', 'Running', 'Preempting', 'Unknown')
               GROUP BY 1
           ) a ON a.node = n.name
           WHERE c.name = $1
           ORDER BY n.name"#,
        cluster
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows
        .into_iter()
        .map(|r| NodeView {
            name: r.name,
            flavor: r.flavor,
            block: r.block,
            gpus: u32::try_from(r.gpus).unwrap_or(0),
            unavailable_gpus: u32::try_from(r.unavailable_gpus).unwrap_or(0),
            allocated_gpus: r.allocated,
            schedulable: r.schedulable,
        })
        .collect())
}

/// The version of the node inventories: it moves with every write of any cluster's nodes,
/// so a reader that kept [`cluster_nodes_list`] knows whether it is still current.
///
/// # Errors
/// Store errors.
pub async fn cluster_nodes_version(db: impl PgExecutor<'_>) -> Result<i64, Error> {
    sqlx::query_scalar!("SELECT version FROM cluster_nodes_version").fetch_one(db).await.map_err(db_error)
}

/// [`cluster_nodes_list`] as of a [`cluster_nodes_version`].
pub type KeptNodes = (i64, Arc<Vec<(ClusterId, ClusterNode)>>);

/// Every cluster's nodes: `kept` if it is still current, else read again (and kept). Read in
/// one snapshot (`conn` in a repeatable-read transaction) for the version to be the nodes'.
///
/// # Errors
/// Store errors.
pub async fn cluster_nodes_current(
    conn: &mut PgConnection,
    kept: &mut Option<KeptNodes>,
) -> Result<Arc<Vec<(ClusterId, ClusterNode)>>, Error> {
    let version = cluster_nodes_version(&mut *conn).await?;
    match kept {
        Some((v, nodes)) if *v == version => Ok(nodes.clone()),
        _ => {
            let nodes = Arc::new(cluster_nodes_list(&mut *conn).await?);
            *kept = Some((version, nodes.clone()));
            Ok(nodes)
        }
    }
}

/// Every cluster's nodes: (cluster uid, node), by cluster and name.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_nodes_list(db: impl PgExecutor<'_>) -> Result<Vec<(ClusterId, ClusterNode)>, Error> {
    let rows = sqlx::query!(
        r#"SELECT cluster_uid, name, flavor, gpus, unavailable_gpus, cpus, memory_mib, block, schedulable
           FROM cluster_nodes ORDER BY cluster_uid, name"#
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let node = ClusterNode {
                name: r.name,
                flavor: r.flavor,
                gpus: r.gpus,
                unavailable_gpus: r.unavailable_gpus,
                cpus: r.cpus,
                memory_mib: r.memory_mib,
                block: r.block,
                schedulable: r.schedulable,
            };
            (ClusterId(r.cluster_uid), node)
        })
        .collect())
}

/// Replaces a cluster's nodes.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_nodes_replace(
    tx: &mut PgConnection,
    cluster: ClusterId,
    nodes: &[ClusterNode],
) -> Result<(), Error> {
    sqlx::query!("DELETE FROM cluster_nodes WHERE cluster_uid = $1", cluster.0)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let flavors: Vec<Option<String>> = nodes.iter().map(|n| n.flavor.clone()).collect();
    let gpus: Vec<i32> = nodes.iter().map(|n| n.gpus).collect();
    let unavailable: Vec<i32> = nodes.iter().map(|n| n.unavailable_gpus).collect();
    let cpus: Vec<i32> = nodes.iter().map(|n| n.cpus).collect();
    let memory: Vec<i64> = nodes.iter().map(|n| n.memory_mib).collect();
    let blocks: Vec<Option<String>> = nodes.iter().map(|n| n.block.clone()).collect();
    let schedulable: Vec<bool> = nodes.iter().map(|n| n.schedulable).collect();
    sqlx::query!(
        r#"INSERT INTO cluster_nodes (cluster_uid, name, flavor, gpus, unavailable_gpus, cpus, memory_mib, block, schedulable)
           SELECT $1, * FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::int[], $7::bigint[], $8::text[], $9::bool[])"#,
        cluster.0,
        &names as &[&str],
        &flavors as &[Option<String>],
        &gpus,
        &unavailable,
        &cpus,
        &memory,
        &blocks as &[Option<String>],
        &schedulable,
    )
    .execute(tx)
    .await
    .map_err(db_error)?;
    Ok(())
}
