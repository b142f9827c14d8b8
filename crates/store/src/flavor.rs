//! SQL for flavors.

use berth_core::flavor::{Flavor, FlavorSpec, FlavorStatus};
use berth_core::meta::Labels;
use berth_core::page::{Page, PageRequest};
use berth_core::{Error, FlavorId};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use crate::db_error;
use crate::row::ObjectRow;

type FlavorRow = ObjectRow<FlavorSpec, FlavorStatus>;

impl From<FlavorRow> for Flavor {
    fn from(row: FlavorRow) -> Self {
        let (metadata, spec, status) = row.into_parts();
        Flavor { metadata, spec, status }
    }
}

/// Fetches a flavor by name.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_fetch(db: impl PgExecutor<'_>, name: &str) -> Result<Option<Flavor>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM flavors WHERE name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
    .map(|r| r.map(Flavor::from))
    .map_err(db_error)
}

/// Fetches a flavor by name and locks it for the rest of the transaction.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_fetch_for_update(tx: &mut PgConnection, name: &str) -> Result<Option<Flavor>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM flavors WHERE name = $1 FOR UPDATE"#,
        name
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Flavor::from))
    .map_err(db_error)
}

/// Inserts a flavor; `None` when another writer created the name first.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_insert(
    tx: &mut PgConnection,
    uid: FlavorId,
    name: &str,
    labels: &Labels,
    spec: &FlavorSpec,
) -> Result<Option<Flavor>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"INSERT INTO flavors (uid, name, labels, spec) VALUES ($1, $2, $3, $4)
           ON CONFLICT (name) DO NOTHING
           RETURNING uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                     generation, resource_version, created_at, updated_at"#,
        uid.0,
        name,
        Json(labels) as _,
        Json(spec) as _,
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Flavor::from))
    .map_err(db_error)
}

/// Replaces a flavor's labels and spec.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_update(
    tx: &mut PgConnection,
    uid: FlavorId,
    labels: &Labels,
    spec: &FlavorSpec,
    generation: i64,
) -> Result<Flavor, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"UPDATE flavors
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
    .map(Flavor::from)
    .map_err(db_error)
}

/// Deletes a flavor.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_delete(tx: &mut PgConnection, uid: FlavorId) -> Result<(), Error> {
    sqlx::query!("DELETE FROM flavors WHERE uid = $1", uid.0).execute(tx).await.map_err(db_error)?;
    Ok(())
}

/// Lists flavors by name.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_list(db: impl PgExecutor<'_>, page: &PageRequest<String>) -> Result<Page<Flavor>, Error> {
    let rows = sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM flavors WHERE ($1::text IS NULL OR name > $1)
           ORDER BY name LIMIT $2"#,
        page.after.as_deref(),
        i64::from(page.limit) + 1,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(Page::from_rows(rows, page.limit, |r| r.name.clone()).map(Flavor::from))
}

/// Of `names`, those that name no flavor, in the order given. Those that exist are held
/// (`FOR KEY SHARE`) for the rest of the transaction: a [`flavor_delete`] waits for it to
/// end and then sees what it wrote (a delete that locked first makes them missing here).
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_missing(db: impl PgExecutor<'_>, names: &[String]) -> Result<Vec<String>, Error> {
    let found = sqlx::query_scalar!("SELECT name FROM flavors WHERE name = ANY($1) FOR KEY SHARE", names)
        .fetch_all(db)
        .await
        .map_err(db_error)?;
    Ok(names.iter().filter(|n| !found.contains(n)).cloned().collect())
}

/// What still refers to a flavor: up to a few team, cluster and live workload names.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_users(db: &mut PgConnection, name: &str) -> Result<Vec<String>, Error> {
    let pattern = serde_json::json!([{ "flavor": name }]);
    sqlx::query_scalar!(
        r#"(SELECT 'team ' || name FROM teams WHERE spec -> 'quotas' @> $2 OR spec -> 'budgets' @> $2 LIMIT 3)
           UNION ALL
           (SELECT 'cluster ' || name FROM clusters WHERE spec -> 'sim' -> 'node_groups' @> $2 LIMIT 3)
           UNION ALL
           (SELECT 'workload ' || team_name || '/' || name FROM workloads
             WHERE flavors @> ARRAY[$1] AND phase NOT IN ('Succeeded', 'Failed', 'Cancelled') LIMIT 3)"#,
        name,
        pattern,
    )
    .fetch_all(db)
    .await
    .map(|v| v.into_iter().flatten().collect())
    .map_err(db_error)
}

/// Every flavor's name, sorted.
///
/// # Errors
/// As [`db_error`].
pub async fn flavor_names(db: impl PgExecutor<'_>) -> Result<Vec<String>, Error> {
    sqlx::query_scalar!("SELECT name FROM flavors ORDER BY name").fetch_all(db).await.map_err(db_error)
}
