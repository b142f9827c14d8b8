//! Leadership: only one replica runs the controllers, and only the current leader's writes
//! land.
//!
//! - **Lock.** The leader holds a Postgres session advisory lock on a connection of its
//!   own. If the connection breaks (the process died, the network failed, someone ran
//!   `pg_terminate_backend`) Postgres frees the lock at once and a standby, which tries
//!   every second, gets it. A leader that stops without its connection closing (a paused
//!   process or VM, a network that drops packets) sends nothing more, and Postgres ends
//!   the session after [`SILENT`] (`idle_session_timeout`), which frees the lock as well.
//! - **Epoch.** Having the lock, a replica takes the lease: it increments the lease row's
//!   `epoch` (`leader_take`), after locking the row `FOR UPDATE`, which waits until every
//!   transaction still fenced with the old epoch has ended; one still open after
//!   [`PATIENCE`] is ended (`pg_terminate_backend`): a leader paused in the middle of one
//!   held the lease, and every controller with it, for as long as it stayed paused, while
//!   the standby had the lock. Its controllers then run with that epoch in their
//!   [`Context`].
//! - **Fencing.** Every controller write begins with [`Context::begin`], which checks in
//!   the same transaction that the epoch is still the lease's and keeps a `FOR KEY SHARE`
//!   lock on the row until it commits (the Chubby sequencer, or Kubernetes' lease with a
//!   resourceVersion precondition). So the old leader — which keeps running its
//!   controllers until its next renewal fails, up to a couple of seconds — cannot write
//!   once the new one has taken the lease: its writes fail. Backend submissions happen
//!   inside the dispatcher's fenced claim, so a deposed leader submits nothing new.
//!   (Cancels are not fenced: each is one the new leader would send too, and repeating it
//!   is harmless.)
//! - **Renewal.** Every second the leader renews the lease of its epoch over the lock
//!   connection (an update of `renewed_at` only, which does not wait for fenced writes);
//!   when that fails or finds another epoch it stops its controllers.

use std::time::Duration;

use berth_core::Error;
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, PgConnection};
use tokio::sync::watch;

use crate::Context;

const RETRY: Duration = Duration::from_secs(1);
const RENEW: Duration = Duration::from_secs(1);
/// How long the lock's session may send nothing before Postgres ends it and frees the lock
/// for a standby (a stopped or cut-off leader); the leader renews every [`RENEW`]. As
/// Kubernetes' leader election's lease (15 s).
const SILENT: Duration = Duration::from_secs(15);
/// How long a replica that has the lock waits for the transactions fenced with the old
/// epoch before it ends them ([`take_lease`]).
pub const PATIENCE: Duration = Duration::from_secs(5);
/// Connections of the controllers' own pool (seven loops; the dispatcher uses two at once).
const TERM_POOL_SIZE: u32 = 12;

/// Competes for leadership and runs the controllers while leading, until `stop` turns true.
pub async fn run(ctx: Context, holder: String, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        match acquire(&ctx).await {
            Ok(Some(conn)) => {
                tracing::info!(holder, "leading the controllers");
                lead(&ctx, &holder, conn, &mut stop).await;
                tracing::info!(holder, "no longer leading the controllers");
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not compete for leadership"),
        }
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

async fn acquire(ctx: &Context) -> Result<Option<PgConnection>, Error> {
    let mut conn = ctx.db.connect_options().connect().await.map_err(berth_store::db_error)?;
    Ok(berth_store::controller::leader_try_lock(&mut conn, SILENT).await?.then_some(conn))
}

/// Takes the lease on the lock's connection `conn` ([`berth_store::controller::leader_take`]),
/// ending the transactions fenced with the old epoch that are still open after `patience`.
///
/// # Errors
/// As `leader_take`.
pub async fn take_lease(
    db: &berth_store::PgPool,
    conn: &mut PgConnection,
    holder: &str,
    since: chrono::DateTime<chrono::Utc>,
    patience: Duration,
) -> Result<i64, Error> {
    let pid = berth_store::controller::session_pid(conn).await?;
    let db = db.clone();
    let ender = tokio::spawn(async move {
        tokio::time::sleep(patience).await;
        loop {
            match berth_store::controller::sessions_blocking_end(&db, pid).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(
                    ended = n,
                    "ended transactions of the previous leader still open {patience:?} after this replica got the lock"
                ),
                Err(e) => tracing::warn!(error = %e, "could not end the previous leader's open transactions"),
            }
            tokio::time::sleep(RETRY).await;
        }
    });
    let taken = berth_store::controller::leader_take(conn, holder, since).await;
    ender.abort();
    taken
}

async fn lead(ctx: &Context, holder: &str, mut conn: PgConnection, stop: &mut watch::Receiver<bool>) {
    let since = ctx.clock.now();
    let epoch = match take_lease(&ctx.db, &mut conn, holder, since, PATIENCE).await {
        Ok(epoch) => epoch,
        Err(e) => {
            tracing::warn!(error = %e, "could not take the lease");
            return;
        }
    };
    tracing::info!(holder, epoch, "took the lease");
    // The controllers get a pool of their own for this term, closed when it ends:
    // stopping them aborts each pass wherever it is, which can leave a connection inside
    // a transaction, and such a connection must never go back to the pool the API
    // writes through (seen in bench/slurm: later autocommit inserts ran inside the
    // abandoned transaction and were rolled back with it).
    let pool =
        PgPoolOptions::new().max_connections(TERM_POOL_SIZE).connect_lazy_with((*ctx.db.connect_options()).clone());
    // A term starts from full reads: of the world, of the admitted work and of the work on
    // backends.
    let term = Context {
        db: pool.clone(),
        epoch: Some(epoch),
        world: Default::default(),
        dispatch: Default::default(),
        followed: Default::default(),
        ..ctx.clone()
    };
    let mut controllers = crate::runner::start(&term, holder);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            () = tokio::time::sleep(RENEW) => {}
        }
        let renewed = tokio::time::timeout(RENEW * 2, berth_store::controller::leader_renew(&mut conn, epoch)).await;
        if !matches!(renewed, Ok(Ok(true))) {
            tracing::error!(epoch, "lost the leader lease (renewal failed); stopping the controllers");
            break;
        }
    }
    controllers.shutdown().await;
    pool.close().await;
    let _ = berth_store::controller::leader_unlock(&mut conn).await;
}
