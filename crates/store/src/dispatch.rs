//! SQL for dispatch intents: the (workload, attempt) pairs whose job may have been
//! submitted without the workload saying so yet (see the migration `dispatch_intents`).

use std::collections::HashSet;

use berth_core::Error;
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::db_error;

fn columns(keys: &[(Uuid, u32)]) -> (Vec<Uuid>, Vec<i32>) {
    keys.iter().map(|(u, a)| (*u, i32::try_from(*a).unwrap_or(i32::MAX))).unzip()
}

/// Which of `keys` have an intent recorded.
///
/// # Errors
/// As [`db_error`].
pub async fn dispatch_intents_of(db: impl PgExecutor<'_>, keys: &[(Uuid, u32)]) -> Result<HashSet<(Uuid, u32)>, Error> {
    let (uids, attempts) = columns(keys);
    let rows = sqlx::query!(
        r#"SELECT d.workload_uid, d.attempt FROM dispatch_intents d
           JOIN UNNEST($1::uuid[], $2::int[]) AS k(uid, attempt)
             ON d.workload_uid = k.uid AND d.attempt = k.attempt"#,
        &uids,
        &attempts
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows.into_iter().map(|r| (r.workload_uid, u32::try_from(r.attempt).unwrap_or(0))).collect())
}

/// Records intents; run it on its own (committed) before the submits it announces.
///
/// # Errors
/// As [`db_error`].
pub async fn dispatch_intents_record(db: impl PgExecutor<'_>, keys: &[(Uuid, u32)]) -> Result<(), Error> {
    let (uids, attempts) = columns(keys);
    sqlx::query!(
        "INSERT INTO dispatch_intents (workload_uid, attempt) SELECT * FROM UNNEST($1::uuid[], $2::int[])
         ON CONFLICT DO NOTHING",
        &uids,
        &attempts
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Removes intents (in the transaction that records their outcome).
///
/// # Errors
/// As [`db_error`].
pub async fn dispatch_intents_clear(db: impl PgExecutor<'_>, keys: &[(Uuid, u32)]) -> Result<(), Error> {
    let (uids, attempts) = columns(keys);
    sqlx::query!(
        "DELETE FROM dispatch_intents d USING UNNEST($1::uuid[], $2::int[]) AS k(uid, attempt)
         WHERE d.workload_uid = k.uid AND d.attempt = k.attempt",
        &uids,
        &attempts
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Removes intents no admitted workload attempt can need any more (the workload was
/// deleted or moved to another attempt). Returns how many.
///
/// # Errors
/// As [`db_error`].
pub async fn dispatch_intents_prune(db: impl PgExecutor<'_>) -> Result<u64, Error> {
    let done = sqlx::query!(
        "DELETE FROM dispatch_intents d WHERE NOT EXISTS (
             SELECT 1 FROM workloads w WHERE w.uid = d.workload_uid AND w.phase = 'Admitted'
                AND coalesce((w.status ->> 'attempt')::int, 0) = d.attempt)"
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(done.rows_affected())
}
