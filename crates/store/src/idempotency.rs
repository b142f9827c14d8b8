//! SQL for idempotency keys: the first answer to a POST that carried one.

use berth_core::Error;
use berth_core::meta::Owner;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::db_error;

/// How long a key's answer is kept (and a retry with it answered from it).
pub const KEY_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::hours(24);

/// Whose key it is: the caller, and the team the request was for.
pub struct KeyScope<'a> {
    pub caller: &'a Owner,
    pub team: &'a str,
    pub key: &'a str,
}

/// A recorded answer: the hash of the request it answered, and the answer.
pub struct Recorded {
    pub request_hash: Vec<u8>,
    pub response: serde_json::Value,
}

/// The answer recorded under the key, if any.
///
/// # Errors
/// As [`db_error`].
pub async fn idempotency_fetch(db: impl PgExecutor<'_>, scope: &KeyScope<'_>) -> Result<Option<Recorded>, Error> {
    sqlx::query_as!(
        Recorded,
        "SELECT request_hash, response FROM idempotency_keys
         WHERE subject = $1 AND issuer = $2 AND team_name = $3 AND key = $4
           AND created_at > now() - make_interval(secs => $5)",
        scope.caller.subject,
        scope.caller.issuer,
        scope.team,
        scope.key,
        KEY_LIFETIME.as_seconds_f64(),
    )
    .fetch_optional(db)
    .await
    .map_err(db_error)
}

/// Claims the key for this request, inside the transaction that will write its effects;
/// `false` when another request holds it (this waits for that request's transaction, so the
/// caller can then read its answer).
///
/// # Errors
/// As [`db_error`].
pub async fn idempotency_claim(
    tx: &mut PgConnection,
    scope: &KeyScope<'_>,
    request_hash: &[u8],
) -> Result<bool, Error> {
    let done = sqlx::query!(
        "INSERT INTO idempotency_keys (subject, issuer, team_name, key, request_hash, response)
         VALUES ($1, $2, $3, $4, $5, 'null')
         ON CONFLICT (subject, issuer, team_name, key) DO UPDATE
             SET request_hash = excluded.request_hash, response = 'null', created_at = now()
             WHERE idempotency_keys.created_at <= now() - make_interval(secs => $6)",
        scope.caller.subject,
        scope.caller.issuer,
        scope.team,
        scope.key,
        request_hash,
        KEY_LIFETIME.as_seconds_f64(),
    )
    .execute(tx)
    .await
    .map_err(db_error)?;
    Ok(done.rows_affected() == 1)
}

/// Records the answer to the request that claimed the key.
///
/// # Errors
/// As [`db_error`].
pub async fn idempotency_answer(
    tx: &mut PgConnection,
    scope: &KeyScope<'_>,
    response: &serde_json::Value,
) -> Result<(), Error> {
    sqlx::query!(
        "UPDATE idempotency_keys SET response = $5
         WHERE subject = $1 AND issuer = $2 AND team_name = $3 AND key = $4",
        scope.caller.subject,
        scope.caller.issuer,
        scope.team,
        scope.key,
        response,
    )
    .execute(tx)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Forgets keys recorded before `before`; how many.
///
/// # Errors
/// As [`db_error`].
pub async fn idempotency_prune(db: impl PgExecutor<'_>, before: DateTime<Utc>) -> Result<u64, Error> {
    let done = sqlx::query!("DELETE FROM idempotency_keys WHERE created_at < $1", before)
        .execute(db)
        .await
        .map_err(db_error)?;
    Ok(done.rows_affected())
}
