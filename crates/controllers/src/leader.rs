//! Leadership: only one replica runs the controllers. The leader holds a Postgres session
//! advisory lock on a connection of its own and renews its record every second over that
//! connection. If the connection breaks (the process died, the network failed) Postgres
//! frees the lock at once and a standby, which tries every second, takes over; a leader
//! whose renewal fails stops its controllers before anyone else can have the lock for
//! long. Even two overlapping leaders cannot dispatch a workload twice: the dispatcher
//! claims rows with `FOR UPDATE SKIP LOCKED` and looks up the job of any attempt with a
//! dispatch intent left over before submitting.

use std::time::Duration;

use berth_core::Error;
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, PgConnection};
use tokio::sync::watch;

use crate::Context;

const RETRY: Duration = Duration::from_secs(1);
const RENEW: Duration = Duration::from_secs(1);
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
    Ok(berth_store::controller::leader_try_lock(&mut conn).await?.then_some(conn))
}

async fn lead(ctx: &Context, holder: &str, mut conn: PgConnection, stop: &mut watch::Receiver<bool>) {
    let since = chrono::Utc::now();
    if berth_store::controller::leader_record(&mut conn, holder, since).await.is_err() {
        return;
    }
    // The controllers get a pool of their own for this term, closed when it ends:
    // stopping them aborts each pass wherever it is, which can leave a connection inside
    // a transaction, and such a connection must never go back to the pool the API
    // writes through (seen in bench/slurm: later autocommit inserts ran inside the
    // abandoned transaction and were rolled back with it).
    let pool =
        PgPoolOptions::new().max_connections(TERM_POOL_SIZE).connect_lazy_with((*ctx.db.connect_options()).clone());
    let term = Context { db: pool.clone(), ..ctx.clone() };
    let mut controllers = crate::runner::start(&term, holder);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            () = tokio::time::sleep(RENEW) => {}
        }
        let renewed =
            tokio::time::timeout(RENEW * 2, berth_store::controller::leader_record(&mut conn, holder, since)).await;
        if !matches!(renewed, Ok(Ok(()))) {
            tracing::error!("lost the leader lease (renewal failed); stopping the controllers");
            break;
        }
    }
    controllers.shutdown().await;
    pool.close().await;
    let _ = berth_store::controller::leader_unlock(&mut conn).await;
}
