//! SQL for the team tree.

use berth_core::meta::Labels;
use berth_core::page::{Page, PageRequest};
use berth_core::team::{FlavorUsage, RecentUsage, Team, TeamSpec, TeamStatus};
use berth_core::usage::BudgetStatus;
use berth_core::{Error, TeamId};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use crate::db_error;
use crate::row::ObjectRow;

type TeamRow = ObjectRow<TeamSpec, TeamStatus>;

impl From<TeamRow> for Team {
    fn from(row: TeamRow) -> Self {
        let (metadata, spec, status) = row.into_parts();
        Team { metadata, spec, status }
    }
}

/// Fetches a team by name.
///
/// # Errors
/// As [`db_error`].
pub async fn team_fetch(db: impl PgExecutor<'_>, name: &str) -> Result<Option<Team>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM teams WHERE name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
    .map(|r| r.map(Team::from))
    .map_err(db_error)
}

/// The uid of the team with this name.
///
/// # Errors
/// As [`db_error`].
pub async fn team_fetch_uid(db: impl PgExecutor<'_>, name: &str) -> Result<Option<TeamId>, Error> {
    sqlx::query_scalar!("SELECT uid FROM teams WHERE name = $1", name)
        .fetch_optional(db)
        .await
        .map(|r| r.map(TeamId))
        .map_err(db_error)
}

/// Inserts a team; `None` when another writer created the name first.
///
/// # Errors
/// As [`db_error`].
pub async fn team_insert(
    tx: &mut PgConnection,
    uid: TeamId,
    name: &str,
    parent: Option<TeamId>,
    labels: &Labels,
    spec: &TeamSpec,
) -> Result<Option<Team>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"INSERT INTO teams (uid, name, parent_uid, labels, spec) VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (name) DO NOTHING
           RETURNING uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                     generation, resource_version, created_at, updated_at"#,
        uid.0,
        name,
        parent.map(|p| p.0),
        Json(labels) as _,
        Json(spec) as _,
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Team::from))
    .map_err(db_error)
}

/// Replaces a team's parent, labels and spec.
///
/// # Errors
/// As [`db_error`].
pub async fn team_update(
    tx: &mut PgConnection,
    uid: TeamId,
    parent: Option<TeamId>,
    labels: &Labels,
    spec: &TeamSpec,
    generation: i64,
) -> Result<Team, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"UPDATE teams
           SET parent_uid = $2, labels = $3, spec = $4, generation = $5,
               resource_version = nextval('resource_version_seq'), updated_at = now()
           WHERE uid = $1
           RETURNING uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                     generation, resource_version, created_at, updated_at"#,
        uid.0,
        parent.map(|p| p.0),
        Json(labels) as _,
        Json(spec) as _,
        generation,
    )
    .fetch_one(tx)
    .await
    .map(Team::from)
    .map_err(db_error)
}

/// Deletes a team and the finished workloads it still holds.
///
/// # Errors
/// As [`db_error`]; a foreign-key conflict if it still has children.
pub async fn team_delete(tx: &mut PgConnection, uid: TeamId) -> Result<(), Error> {
    sqlx::query!("DELETE FROM teams WHERE uid = $1", uid.0).execute(tx).await.map_err(db_error)?;
    Ok(())
}

/// Lists teams by name, optionally only the children of one parent.
///
/// # Errors
/// As [`db_error`].
pub async fn team_list(
    db: impl PgExecutor<'_>,
    parent: Option<&str>,
    only: Option<&[String]>,
    page: &PageRequest<String>,
) -> Result<Page<Team>, Error> {
    let rows = sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM teams
           WHERE ($1::text IS NULL OR name > $1) AND ($2::text IS NULL OR spec ->> 'parent' = $2)
             AND ($4::text[] IS NULL OR name = ANY($4))
           ORDER BY name LIMIT $3"#,
        page.after.as_deref(),
        parent,
        i64::from(page.limit) + 1,
        only,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(Page::from_rows(rows, page.limit, |r| r.name.clone()).map(Team::from))
}

/// The specs of a team's children, except `except` (the team being written).
///
/// # Errors
/// As [`db_error`].
pub async fn team_children_specs(
    db: &mut PgConnection,
    parent: TeamId,
    except: Option<TeamId>,
) -> Result<Vec<TeamSpec>, Error> {
    sqlx::query_scalar!(
        r#"SELECT spec AS "spec: Json<TeamSpec>" FROM teams
           WHERE parent_uid = $1 AND ($2::uuid IS NULL OR uid <> $2)"#,
        parent.0,
        except.map(|e| e.0),
    )
    .fetch_all(db)
    .await
    .map(|specs| specs.into_iter().map(|s| s.0).collect())
    .map_err(db_error)
}

/// Names of the team's ancestors, nearest first (the team itself excluded).
///
/// # Errors
/// As [`db_error`].
pub async fn team_ancestors(db: &mut PgConnection, team: TeamId) -> Result<Vec<String>, Error> {
    sqlx::query_scalar!(
        r#"WITH RECURSIVE up (uid, parent_uid, name, depth) AS (
               SELECT uid, parent_uid, name, 0 FROM teams WHERE uid = $1
               UNION ALL
               SELECT t.uid, t.parent_uid, t.name, up.depth + 1
               FROM teams t JOIN up ON t.uid = up.parent_uid
               WHERE up.depth < 1000
           )
           SELECT name AS "name!" FROM up WHERE depth > 0 ORDER BY depth"#,
        team.0
    )
    .fetch_all(db)
    .await
    .map_err(db_error)
}

/// The team and its ancestors with their specs, the team first and the root last (none
/// when there is no such team).
///
/// # Errors
/// As [`db_error`].
pub async fn team_lineage_specs(db: impl PgExecutor<'_>, team: &str) -> Result<Vec<(String, TeamSpec)>, Error> {
    sqlx::query!(
        r#"WITH RECURSIVE up (uid, parent_uid, name, spec, depth) AS (
               SELECT uid, parent_uid, name, spec, 0 FROM teams WHERE name = $1
               UNION ALL
               SELECT t.uid, t.parent_uid, t.name, t.spec, up.depth + 1
               FROM teams t JOIN up ON t.uid = up.parent_uid
               WHERE up.depth < 1000
           )
           SELECT name AS "name!", spec AS "spec!: Json<TeamSpec>" FROM up ORDER BY depth"#,
        team
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(|r| (r.name, r.spec.0)).collect())
    .map_err(db_error)
}

/// Names of the team's direct children (up to a few).
///
/// # Errors
/// As [`db_error`].
pub async fn team_child_names(db: &mut PgConnection, team: TeamId) -> Result<Vec<String>, Error> {
    sqlx::query_scalar!("SELECT name FROM teams WHERE parent_uid = $1 ORDER BY name LIMIT 3", team.0)
        .fetch_all(db)
        .await
        .map_err(db_error)
}

/// Names of the team's workloads that are not finished (up to a few).
///
/// # Errors
/// As [`db_error`].
pub async fn team_live_workloads(db: &mut PgConnection, team: TeamId) -> Result<Vec<String>, Error> {
    sqlx::query_scalar!(
        r#"SELECT name FROM workloads
           WHERE team_uid = $1 AND phase NOT IN ('Succeeded', 'Failed', 'Cancelled')
           ORDER BY name LIMIT 3"#,
        team.0
    )
    .fetch_all(db)
    .await
    .map_err(db_error)
}

/// Locks a team's row for the rest of the transaction. Workload inserts take a key-share
/// lock on their team (foreign key), so this waits for in-flight inserts and holds back new
/// ones until the transaction ends.
///
/// # Errors
/// As [`db_error`].
pub async fn team_lock(tx: &mut PgConnection, team: TeamId) -> Result<(), Error> {
    sqlx::query!("SELECT uid FROM teams WHERE uid = $1 FOR UPDATE", team.0)
        .fetch_optional(tx)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// Every team, by name.
///
/// # Errors
/// As [`db_error`].
pub async fn team_list_all(db: impl PgExecutor<'_>) -> Result<Vec<Team>, Error> {
    sqlx::query_as!(
        ObjectRow,
        r#"SELECT uid, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at
           FROM teams ORDER BY name"#
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Team::from).collect())
    .map_err(db_error)
}

/// Writes teams' `status.usage` (the scheduler loop is its only writer; the rest of the
/// status is left as it is).
///
/// # Errors
/// As [`db_error`].
pub async fn team_write_usage(tx: &mut PgConnection, writes: &[(TeamId, Vec<FlavorUsage>)]) -> Result<(), Error> {
    team_write_status_key(tx, "usage", writes).await
}

/// Writes teams' `status.budgets` (the budget controller is its only writer).
///
/// # Errors
/// As [`db_error`].
pub async fn team_write_budgets(tx: &mut PgConnection, writes: &[(TeamId, Vec<BudgetStatus>)]) -> Result<(), Error> {
    team_write_status_key(tx, "budgets", writes).await
}

/// Writes teams' `status.recent_usage` (the fair-sharing controller is its only writer).
///
/// # Errors
/// As [`db_error`].
pub async fn team_write_recent_usage(
    tx: &mut PgConnection,
    writes: &[(TeamId, Option<RecentUsage>)],
) -> Result<(), Error> {
    team_write_status_key(tx, "recent_usage", writes).await
}

/// Sets one key of teams' statuses: each writer owns its key, so neither overwrites what
/// the other wrote since it read.
async fn team_write_status_key<T: serde::Serialize>(
    tx: &mut PgConnection,
    key: &str,
    writes: &[(TeamId, T)],
) -> Result<(), Error> {
    if writes.is_empty() {
        return Ok(());
    }
    let uids: Vec<uuid::Uuid> = writes.iter().map(|(uid, _)| uid.0).collect();
    let values: Vec<serde_json::Value> =
        writes.iter().map(|(_, s)| serde_json::to_value(s).expect("status serializes")).collect();
    sqlx::query!(
        r#"UPDATE teams t SET status = jsonb_set(t.status, ARRAY[$3::text], u.value),
                  resource_version = nextval('resource_version_seq'), updated_at = now()
           FROM unnest($1::uuid[], $2::jsonb[]) AS u (uid, value)
           WHERE t.uid = u.uid"#,
        &uids,
        &values,
        key,
    )
    .execute(tx)
    .await
    .map_err(db_error)?;
    Ok(())
}
