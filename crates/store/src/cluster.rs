//! SQL for clusters.

use berth_core::cluster::{Cluster, ClusterKind, ClusterSpec, ClusterStatus};
use berth_core::meta::{Labels, ObjectMeta};
use berth_core::page::{Page, PageRequest};
use berth_core::{ClusterId, Error};
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::db_error;

struct ClusterRow {
    uid: Uuid,
    name: String,
    labels: Json<Labels>,
    spec: Json<ClusterSpec>,
    status: Json<ClusterStatus>,
    generation: i64,
    resource_version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<ClusterRow> for Cluster {
    fn from(r: ClusterRow) -> Self {
        Cluster {
            metadata: ObjectMeta {
                name: r.name,
                team: None,
                uid: r.uid,
                labels: r.labels.0,
                generation: r.generation,
                resource_version: r.resource_version.to_string(),
                creation_timestamp: r.created_at,
                update_timestamp: r.updated_at,
                deletion_timestamp: None,
            },
            spec: r.spec.0,
            status: r.status.0,
        }
    }
}

/// Fetches a cluster by name.
///
/// # Errors
/// As [`db_error`].
pub async fn cluster_fetch(db: impl PgExecutor<'_>, name: &str) -> Result<Option<Cluster>, Error> {
    sqlx::query_as!(
        ClusterRow,
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
        ClusterRow,
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
        ClusterRow,
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
        ClusterRow,
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
        ClusterRow,
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
