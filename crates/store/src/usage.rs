//! SQL for usage history: each team's GPUs per flavor over time (see the migration
//! `usage_history`).

use berth_core::Error;
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::db_error;

/// A team's use of a flavor from `at` until the next change.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageChange {
    pub team: String,
    pub flavor: String,
    pub at: DateTime<Utc>,
    pub allocated: f64,
    pub borrowed: f64,
}

/// Records new values: `(team uid, flavor, allocated, borrowed)`, stamped with the
/// transaction's time.
///
/// # Errors
/// As [`db_error`].
pub async fn usage_record(db: impl PgExecutor<'_>, changes: &[(Uuid, String, f64, f64)]) -> Result<(), Error> {
    if changes.is_empty() {
        return Ok(());
    }
    let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (uid, flavor, allocated, borrowed) in changes {
        columns.0.push(*uid);
        columns.1.push(flavor.clone());
        columns.2.push(*allocated);
        columns.3.push(*borrowed);
    }
    sqlx::query!(
        "INSERT INTO usage_history (team_uid, flavor, allocated, borrowed)
         SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::float8[], $4::float8[])
         ON CONFLICT (team_uid, flavor, at) DO UPDATE SET allocated = EXCLUDED.allocated, borrowed = EXCLUDED.borrowed",
        &columns.0,
        &columns.1,
        &columns.2,
        &columns.3,
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// The history since `since`, by team, flavor and time: each (team, flavor) that had a
/// value then starts with it, stamped `since`. Only the teams in `only`, when given.
///
/// # Errors
/// As [`db_error`].
pub async fn usage_history(
    db: impl PgExecutor<'_>,
    since: DateTime<Utc>,
    only: Option<&[String]>,
) -> Result<Vec<UsageChange>, Error> {
    let rows = sqlx::query!(
        r#"SELECT team AS "team!", flavor AS "flavor!", at AS "at!", allocated AS "allocated!", borrowed AS "borrowed!"
           FROM (
               (SELECT DISTINCT ON (h.team_uid, h.flavor) t.name AS team, h.flavor, $1::timestamptz AS at,
                       h.allocated, h.borrowed
                FROM usage_history h JOIN teams t ON t.uid = h.team_uid
                WHERE h.at < $1 AND ($2::text[] IS NULL OR t.name = ANY($2))
                ORDER BY h.team_uid, h.flavor, h.at DESC)
               UNION ALL
               (SELECT t.name, h.flavor, h.at, h.allocated, h.borrowed
                FROM usage_history h JOIN teams t ON t.uid = h.team_uid
                WHERE h.at >= $1 AND ($2::text[] IS NULL OR t.name = ANY($2)))
           ) u
           ORDER BY team, flavor, at"#,
        since,
        only as Option<&[String]>,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows
        .into_iter()
        .map(|r| UsageChange { team: r.team, flavor: r.flavor, at: r.at, allocated: r.allocated, borrowed: r.borrowed })
        .collect())
}

/// Removes history older than `before`, keeping each (team, flavor)'s last value before it
/// (the start of what remains). Returns how many rows went.
///
/// # Errors
/// As [`db_error`].
pub async fn usage_prune(db: impl PgExecutor<'_>, before: DateTime<Utc>) -> Result<u64, Error> {
    let done = sqlx::query!(
        "DELETE FROM usage_history h WHERE h.at < $1 AND EXISTS (
             SELECT 1 FROM usage_history later
             WHERE later.team_uid = h.team_uid AND later.flavor = h.flavor AND later.at > h.at AND later.at <= $1)",
        before
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(done.rows_affected())
}
