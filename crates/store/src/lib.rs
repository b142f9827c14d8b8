//! Berth's Postgres store. All SQL lives here, as functions named resource-first
//! (`workload_insert`, `team_list`), each taking the executor explicitly so callers can
//! join them into one transaction.
//!
//! # Guarantees
//! - Migrations run under Postgres's advisory lock (sqlx's migrator takes it), so several
//!   replicas may start at once.
//! - Database errors become domain errors in one place ([`db_error`]): unique and foreign
//!   key violations are conflicts, connection trouble is `Unavailable`, the rest is
//!   `Internal` with the detail kept for the log only.

pub mod audit;
pub mod changes;
pub mod cluster;
pub mod controller;
pub mod created_here;
pub mod dispatch;
pub mod event;
pub mod flavor;
pub mod idempotency;
pub mod identity;
pub mod ledger;
mod primary;
mod row;
pub mod team;
pub mod usage;
pub mod workload;

use std::sync::Arc;

use berth_core::Error;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
pub use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// A transaction on the Berth database.
pub type Tx<'a> = Transaction<'a, Postgres>;

/// The schema, embedded from `migrations/`.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// What names a database in what is kept per database in a process: tests and benchmarks
/// run several in one process, each under its own name. Not the host, which a failover
/// changes.
pub fn database_key(db: &PgPool) -> String {
    db.connect_options().get_database().unwrap_or_default().to_owned()
}

/// One `T` per database, made on first use and shared by every caller in the process (the
/// caches, queues and notifiers kept per database).
pub struct PerDatabase<T>(std::sync::Mutex<Option<std::collections::HashMap<String, Arc<T>>>>);

impl<T: Default> PerDatabase<T> {
    #[must_use]
    pub const fn new() -> Self {
        Self(std::sync::Mutex::new(None))
    }

    pub fn of(&self, db: &PgPool) -> Arc<T> {
        let mut all = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        all.get_or_insert_default().entry(database_key(db)).or_default().clone()
    }
}

impl<T: Default> Default for PerDatabase<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// How long a pooled connection may sit idle before it is pinged again when taken out.
pub const PING_IDLE_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

pub use primary::PRIMARY_MOVED;

/// Opens a connection pool. `url` may list several hosts, libpq's way
/// (`postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write`): the pool then
/// connects to the writable one and follows the primary when a failover moves it (see
/// `primary.rs`).
///
/// # Errors
/// [`Error::Invalid`] for an unparsable URL, [`Error::Unavailable`] when the database
/// cannot be reached (or, of several hosts, none is writable).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, Error> {
    let hosts = primary::parse(url)?;
    // Without JIT compilation: Postgres compiles a statement whose estimated cost passes
    // `jit_above_cost`, as a plan kept for any parameters often does (it guesses a third of
    // the table for a range), and compiling took longer than running it. The scheduler's
    // read of the change feed: 28 ms of JIT for a 36 ms read at 100,000 workloads; at
    // 127,000 (bench/controllers scale), 492 ms a read (median), and 15 ms without.
    let mut named = hosts.options.into_iter().map(|o| o.application_name("berthd").options([("jit", "off")]));
    if !hosts.read_write {
        let options = named.next().expect("one host at least");
        return pool_options(max_connections, None).connect_with(options).await.map_err(db_error);
    }
    let primary = primary::Primary::new(named.collect());
    let probe = primary.find(0).await?;
    let pool =
        pool_options(max_connections, Some(primary.clone())).connect_with(primary.options()).await.map_err(db_error)?;
    tokio::spawn(primary.watch(pool.clone(), probe));
    Ok(pool)
}

/// The pool's settings; with `primary`, every connection is to the writable host.
fn pool_options(max_connections: u32, primary: Option<Arc<primary::Primary>>) -> PgPoolOptions {
    let on_connect = primary.clone();
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(std::time::Duration::from_secs(5))
        // sqlx pings a connection when it comes back to the pool; pinging it again when it
        // is taken out doubled the round trips of every request. Only a connection that has
        // sat idle since (through a database restart, a dropped link) is pinged first.
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let primary = primary.clone();
            Box::pin(async move {
                // Made before the pool moved to another host: to the old primary.
                if primary.is_some_and(|p| meta.age > p.chosen_for()) {
                    return Ok(false);
                }
                if meta.idle_for >= PING_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _| {
            let primary = on_connect.clone();
            Box::pin(async move {
                if let Some(primary) = primary
                    && primary::in_recovery(conn).await?
                {
                    primary.suspect();
                    return Err(sqlx::Error::Protocol("the server is read-only (in recovery), not the primary".into()));
                }
                Ok(())
            })
        })
}

/// A connection outside `pool`, with its settings, for a reader that asks all the time: a
/// pooled connection costs a second round trip each time (sqlx pings it on its way back).
///
/// # Errors
/// As [`db_error`].
pub async fn connect_alone(pool: &PgPool) -> Result<PgConnection, Error> {
    sqlx::Connection::connect_with(&*pool.connect_options()).await.map_err(db_error)
}

/// Brings the schema up to date. Safe to call from several processes at once.
///
/// # Errors
/// [`Error::Internal`] when a migration fails or the database holds a newer schema.
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    MIGRATOR.run(pool).await.map_err(|e| Error::Internal(format!("migration failed: {e}")))
}

/// Checks that the database answers.
///
/// # Errors
/// [`Error::Unavailable`] when it does not.
pub async fn ping(pool: &PgPool) -> Result<(), Error> {
    sqlx::query_scalar!("SELECT 1 AS one").fetch_one(pool).await.map_err(db_error).map(|_| ())
}

/// Begins a transaction.
///
/// # Errors
/// [`Error::Unavailable`] when no connection can be had.
pub async fn begin(pool: &PgPool) -> Result<Tx<'static>, Error> {
    pool.begin().await.map_err(db_error)
}

/// Commits a transaction.
///
/// # Errors
/// As [`db_error`].
pub async fn commit(tx: Tx<'_>) -> Result<(), Error> {
    tx.commit().await.map_err(db_error)
}

/// Maps a database error to a domain error. SQL text and server messages stay in the
/// `Internal`/`Unavailable` detail, which the HTTP layer logs and never returns.
pub fn db_error(e: sqlx::Error) -> Error {
    match &e {
        sqlx::Error::Database(db) => {
            let constraint = db.constraint().unwrap_or_default().to_owned();
            match db.code().as_deref() {
                Some("23505") => Error::conflict(field_of(&constraint), "an object with this name already exists"),
                Some("23503") => {
                    Error::Conflict { field: None, message: "the object is still referenced by other objects".into() }
                }
                Some("23514" | "22P02" | "22003" | "22021") => {
                    Error::Internal(format!("a value was rejected by the database: {e}"))
                }
                // 25006: a write reached a server that turned read-only (a demoted primary,
                // before the pool follows the new one).
                Some("40001" | "40P01" | "55P03" | "57014" | "53300" | "25006") => Error::Unavailable(e.to_string()),
                // The server is shutting down, restarting, or starting up; the connection
                // broke (class 08).
                Some("57P01" | "57P02" | "57P03") => Error::Unavailable(e.to_string()),
                Some(code) if code.starts_with("08") => Error::Unavailable(e.to_string()),
                _ => Error::Internal(e.to_string()),
            }
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            Error::Unavailable(e.to_string())
        }
        _ => Error::Internal(e.to_string()),
    }
}

fn field_of(constraint: &str) -> &'static str {
    if constraint.ends_with("name_key") { "/metadata/name" } else { "" }
}

/// Serializes all writes to the team tree (parents, guarantees) for the rest of the
/// transaction, so two concurrent writes cannot both pass a check that spans rows.
///
/// # Errors
/// As [`db_error`].
pub async fn lock_team_tree(tx: &mut Tx<'_>) -> Result<(), Error> {
    // An arbitrary constant key: ASCII "berthtre".
    sqlx::query!("SELECT pg_advisory_xact_lock(7089067706085893477)").execute(&mut **tx).await.map_err(db_error)?;
    Ok(())
}

/// A connection of the pool on which every statement is planned once, for any parameters
/// (`plan_cache_mode = force_generic_plan`), instead of for the parameters of each call
/// where Postgres finds that cheaper to run; for a statement run often with small arrays
/// (a group commit's few rows), planning each call cost as much as running it. Given back
/// with [`GenericPlans::give_back`], the connection returns to the pool as it was; dropped
/// otherwise, it is closed, so no other caller gets it with the setting.
pub struct GenericPlans(Option<sqlx::pool::PoolConnection<Postgres>>);

impl GenericPlans {
    /// # Errors
    /// As [`db_error`].
    pub async fn acquire(pool: &PgPool) -> Result<Self, Error> {
        let mut conn = Self(Some(pool.acquire().await.map_err(db_error)?));
        sqlx::query!("SET plan_cache_mode = force_generic_plan").execute(conn.connection()).await.map_err(db_error)?;
        Ok(conn)
    }

    pub fn connection(&mut self) -> &mut PgConnection {
        self.0.as_deref_mut().expect("held until given back")
    }

    /// Returns the connection to the pool with the setting undone.
    pub async fn give_back(mut self) {
        if sqlx::query!("RESET plan_cache_mode").execute(self.connection()).await.is_ok() {
            drop(self.0.take());
        }
    }
}

impl Drop for GenericPlans {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.0 {
            conn.close_on_drop();
        }
    }
}

/// Begins a read-only transaction that sees one consistent snapshot of the database (for
/// the scheduler, which reads several tables and must not see half of a change).
///
/// # Errors
/// As [`db_error`].
pub async fn begin_snapshot(pool: &PgPool) -> Result<Tx<'static>, Error> {
    let mut tx = pool.begin().await.map_err(db_error)?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    Ok(tx)
}
