//! SQL for the controllers' own state: who leads, and what each controller last reported.

use berth_core::Error;
use chrono::{DateTime, Utc};
use sqlx::{Acquire, PgConnection, PgExecutor};

use crate::db_error;

/// The advisory-lock key of the controller lease: ASCII "berthldr".
pub const LEADER_LOCK_KEY: i64 = 7_089_067_706_085_893_234;

/// Tries to take the leader lock for the session of `conn` (a dedicated connection); it is
/// held until that connection closes or [`leader_unlock`] runs. The session is ended by
/// Postgres once it has sent nothing for `silent` (`idle_session_timeout`), which frees the
/// lock: a leader that stopped (a paused process or VM, a network that drops packets
/// without closing the connection) kept it for as long as its TCP connection looked alive
/// (a leader stopped with SIGSTOP held it 65 s and more, until it was resumed, while a
/// standby tried every second); the leader renews every second, far within `silent`.
///
/// # Errors
/// As [`db_error`].
pub async fn leader_try_lock(conn: &mut PgConnection, silent: std::time::Duration) -> Result<bool, Error> {
    sqlx::query("SELECT set_config('idle_session_timeout', $1, false)")
        .bind(format!("{}ms", silent.as_millis()))
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock($1) AS "locked!""#, LEADER_LOCK_KEY)
        .fetch_one(conn)
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

/// Takes the lease for `holder` on the lock's connection: increments the epoch and returns
/// it. The row is locked `FOR UPDATE` first, which waits until every transaction that
/// checked the old epoch ([`leader_fence`] takes `FOR KEY SHARE`) has ended; after this
/// commits, no write fenced with an older epoch can commit.
///
/// # Errors
/// As [`db_error`].
pub async fn leader_take(conn: &mut PgConnection, holder: &str, since: DateTime<Utc>) -> Result<i64, Error> {
    let mut tx = conn.begin().await.map_err(db_error)?;
    sqlx::query!("SELECT epoch FROM controller_leader WHERE id FOR UPDATE")
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
    let epoch = sqlx::query_scalar!(
        r#"INSERT INTO controller_leader (id, holder, since, renewed_at, epoch) VALUES (true, $1, $2, now(), 1)
           ON CONFLICT (id) DO UPDATE SET holder = $1, since = $2, renewed_at = now(), epoch = controller_leader.epoch + 1
           RETURNING epoch"#,
        holder,
        since
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db_error)?;
    tx.commit().await.map_err(db_error)?;
    Ok(epoch)
}

/// The backend process of `conn`'s session.
///
/// # Errors
/// As [`db_error`].
pub async fn session_pid(conn: &mut PgConnection) -> Result<i32, Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(conn).await.map_err(db_error)
}

/// Ends the sessions that hold what the session `pid` waits for (`pg_blocking_pids`), and
/// returns how many it ended. A replica that holds the leader lock and waits in
/// [`leader_take`] waits only for transactions fenced with an older epoch: a leader that
/// stopped in the middle of one (a paused process or VM) held it, and every controller
/// with it, for as long as it stayed stopped.
///
/// # Errors
/// As [`db_error`] (a role that may not end another role's sessions).
pub async fn sessions_blocking_end(db: impl PgExecutor<'_>, pid: i32) -> Result<i64, Error> {
    sqlx::query_scalar("SELECT count(*) FILTER (WHERE pg_terminate_backend(b)) FROM unnest(pg_blocking_pids($1)) AS b")
        .bind(pid)
        .fetch_one(db)
        .await
        .map_err(db_error)
}

/// Renews the lease of `epoch`; `false` when another leader has taken it since. (A plain
/// update of a non-key column: it does not wait for the fenced transactions' key-share
/// locks.)
///
/// # Errors
/// As [`db_error`].
pub async fn leader_renew(db: impl PgExecutor<'_>, epoch: i64) -> Result<bool, Error> {
    let done = sqlx::query!("UPDATE controller_leader SET renewed_at = now() WHERE id AND epoch = $1", epoch)
        .execute(db)
        .await
        .map_err(db_error)?;
    Ok(done.rows_affected() == 1)
}

/// Fences the transaction `tx` with `epoch`: fails unless `epoch` is still the lease's, and
/// keeps a key-share lock on the lease row until `tx` ends, so a new leader cannot take the
/// lease while the write is in flight.
///
/// # Errors
/// `Unavailable` when another leader holds the lease now; else as [`db_error`].
pub async fn leader_fence(tx: &mut crate::Tx<'_>, epoch: i64) -> Result<(), Error> {
    let current = sqlx::query_scalar!("SELECT epoch FROM controller_leader WHERE id FOR KEY SHARE")
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_error)?;
    if current == Some(epoch) {
        Ok(())
    } else {
        Err(Error::Unavailable(format!("deposed: this replica led in epoch {epoch}, the lease is now at {current:?}")))
    }
}

/// The recorded leader: holder, since, last renewal, epoch.
///
/// # Errors
/// As [`db_error`].
pub async fn leader_fetch(
    db: impl PgExecutor<'_>,
) -> Result<Option<(String, DateTime<Utc>, DateTime<Utc>, i64)>, Error> {
    let row = sqlx::query!("SELECT holder, since, renewed_at, epoch FROM controller_leader")
        .fetch_optional(db)
        .await
        .map_err(db_error)?;
    Ok(row.map(|r| (r.holder, r.since, r.renewed_at, r.epoch)))
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
