//! SQL for the controllers' own state: who leads, and what each controller last reported.

use berth_core::Error;
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::db_error;

/// The advisory-lock key of the controller lease: ASCII "berthldr".
pub const LEADER_LOCK_KEY: i64 = 7_089_067_706_085_893_234;

/// Tries to take the leader lock for the session of `db` (a dedicated connection); it is
/// held until that connection closes or [`leader_unlock`] runs.
///
/// # Errors
/// As [`db_error`].
pub async fn leader_try_lock(db: impl PgExecutor<'_>) -> Result<bool, Error> {
    sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock($1) AS "locked!""#, LEADER_LOCK_KEY)
        .fetch_one(db)
        .await
        .map_err(db_error)
}

/// Releases the leader lock held by the session of `db`.
///
/// # Errors
/// As [`db_error`].
pub async fn leader_unlock(db: impl PgExecutor<'_>) -> Result<(), Error> {
    sqlx::query_scalar!(r#"SELECT pg_advisory_unlock($1) AS "unlocked!""#, LEADER_LOCK_KEY)
        .fetch_one(db)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// Records who leads (on taking the lock) or that it still does (each renewal).
///
/// # Errors
/// As [`db_error`].
pub async fn leader_record(db: impl PgExecutor<'_>, holder: &str, since: DateTime<Utc>) -> Result<(), Error> {
    sqlx::query!(
        r#"INSERT INTO controller_leader (id, holder, since, renewed_at) VALUES (true, $1, $2, now())
           ON CONFLICT (id) DO UPDATE SET holder = $1, since = $2, renewed_at = now()"#,
        holder,
        since
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// The recorded leader: holder, since, last renewal.
///
/// # Errors
/// As [`db_error`].
pub async fn leader_fetch(db: impl PgExecutor<'_>) -> Result<Option<(String, DateTime<Utc>, DateTime<Utc>)>, Error> {
    let row = sqlx::query!("SELECT holder, since, renewed_at FROM controller_leader")
        .fetch_optional(db)
        .await
        .map_err(db_error)?;
    Ok(row.map(|r| (r.holder, r.since, r.renewed_at)))
}

/// Stores the status a controller reported.
///
/// # Errors
/// As [`db_error`].
pub async fn controller_status_write(
    db: impl PgExecutor<'_>,
    name: &str,
    holder: &str,
    status: &serde_json::Value,
) -> Result<(), Error> {
    sqlx::query!(
        r#"INSERT INTO controller_status (name, holder, status, updated_at) VALUES ($1, $2, $3, now())
           ON CONFLICT (name) DO UPDATE SET holder = $2, status = $3, updated_at = now()"#,
        name,
        holder,
        status
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Every controller's last status: (name, holder, status, when).
///
/// # Errors
/// As [`db_error`].
pub async fn controller_status_list(
    db: impl PgExecutor<'_>,
) -> Result<Vec<(String, String, serde_json::Value, DateTime<Utc>)>, Error> {
    let rows = sqlx::query!("SELECT name, holder, status, updated_at FROM controller_status ORDER BY name")
        .fetch_all(db)
        .await
        .map_err(db_error)?;
    Ok(rows.into_iter().map(|r| (r.name, r.holder, r.status, r.updated_at)).collect())
}
