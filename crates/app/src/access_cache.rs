//! What authorization reads on every request, kept between requests: users' role bindings
//! and the team tree. Postgres notifies channel [`CHANNEL`] when either changes, whichever
//! replica wrote it, and the cache then forgets everything. It serves only while it
//! listens: until its listener is connected, and from the moment that connection is known
//! lost until it is back, every request reads the store. A connection lost silently (no
//! reset reaches this host) is bounded by [`KEPT_FOR`]: no entry is served older.
//!
//! A read that raced a change is not kept: each entry is stored only if no change arrived
//! since the read began (the generation). A write through this process also forgets at
//! once ([`forget`]), so its own next request never sees the old bindings. There is one
//! cache per database, as for [`crate::feasibility`] (tests run several in one process).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_core::Error;
use berth_core::auth::{Grant, TeamTree};
use berth_store::PgPool;
use berth_store::identity as store;

/// The channel the store's triggers notify when role bindings or the team tree change.
pub const CHANNEL: &str = "berth_access";

/// At most this many users' bindings are kept; past it the cache starts over.
const MAX_USERS: usize = 10_000;

/// The longest an entry is served.
pub const KEPT_FOR: Duration = Duration::from_secs(10);

/// The cache of one database, shared by every request.
#[derive(Default)]
struct AccessCache {
    inner: Mutex<Inner>,
    listener_started: AtomicBool,
}

#[derive(Default)]
struct Inner {
    listening: bool,
    /// Counts changes heard (and listener restarts): a read that began before one is
    /// not stored.
    generation: u64,
    grants: HashMap<(String, String), (Instant, Vec<Grant>)>,
    tree: Option<(Instant, Arc<TeamTree>)>,
}

fn fresh<T: Clone>(entry: Option<&(Instant, T)>) -> Option<T> {
    entry.filter(|(read_at, _)| read_at.elapsed() < KEPT_FOR).map(|(_, v)| v.clone())
}

static CACHES: crate::PerDatabase<AccessCache> = crate::PerDatabase::new();

fn cache(db: &PgPool) -> Arc<AccessCache> {
    CACHES.of(db)
}

/// The grants bound to a user (`issuer`, `subject`).
///
/// # Errors
/// As the store.
pub async fn grants_of_user(db: &PgPool, issuer: &str, subject: &str) -> Result<Vec<Grant>, Error> {
    cache(db).grants_of_user(db, issuer, subject).await
}

/// Every team and its parent.
///
/// # Errors
/// As the store.
pub async fn team_tree(db: &PgPool) -> Result<Arc<TeamTree>, Error> {
    cache(db).team_tree(db).await
}

/// Forgets what is kept of `db`: role bindings or teams changed through this process.
pub fn forget(db: &PgPool) {
    cache(db).forget();
}

impl AccessCache {
    async fn grants_of_user(self: &Arc<Self>, db: &PgPool, issuer: &str, subject: &str) -> Result<Vec<Grant>, Error> {
        let key = (issuer.to_owned(), subject.to_owned());
        let generation = match self.lookup(db, |i| fresh(i.grants.get(&key))) {
            Ok(hit) => return Ok(hit),
            Err(generation) => generation,
        };
        let read_at = Instant::now();
        let grants = store::grants_of_user(db, issuer, subject).await?;
        self.store(generation, |i| {
            if i.grants.len() >= MAX_USERS {
                i.grants.clear();
            }
            i.grants.insert(key, (read_at, grants.clone()));
        });
        Ok(grants)
    }

    async fn team_tree(self: &Arc<Self>, db: &PgPool) -> Result<Arc<TeamTree>, Error> {
        let generation = match self.lookup(db, |i| fresh(i.tree.as_ref())) {
            Ok(hit) => return Ok(hit),
            Err(generation) => generation,
        };
        let read_at = Instant::now();
        let tree = Arc::new(TeamTree::new(store::team_parents(db).await?));
        self.store(generation, |i| i.tree = Some((read_at, tree.clone())));
        Ok(tree)
    }

    fn forget(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.grants.clear();
        inner.tree = None;
    }

    /// A hit while listening, or the generation a read from the store begins at. Starts
    /// the listener on first use.
    fn lookup<T>(self: &Arc<Self>, db: &PgPool, get: impl FnOnce(&Inner) -> Option<T>) -> Result<T, u64> {
        if !self.listener_started.swap(true, Ordering::AcqRel) {
            tokio::spawn(listen(self.clone(), db.clone()));
        }
        let inner = self.lock();
        match inner.listening.then(|| get(&inner)).flatten() {
            Some(hit) => Ok(hit),
            None => Err(inner.generation),
        }
    }

    fn store(&self, generation: u64, put: impl FnOnce(&mut Inner)) {
        let mut inner = self.lock();
        if inner.listening && inner.generation == generation {
            put(&mut inner);
        }
    }

    fn set_listening(&self, listening: bool) {
        self.forget();
        self.lock().listening = listening;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Listens on its own connection (not one of the pool's) until the pool closes; when the
/// connection is lost the cache stops serving until it listens again.
async fn listen(cache: Arc<AccessCache>, db: PgPool) {
    /// The listener's end, also when its runtime drops it (a test's): the cache serves no
    /// more, and its next use starts a listener anew.
    struct Stopped(Arc<AccessCache>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.set_listening(false);
            self.0.listener_started.store(false, Ordering::Release);
        }
    }
    let _stopped = Stopped(cache.clone());
    let listening = async {
        loop {
            // The pool's options as they are now: after a failover, the new primary's.
            let own = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with((*db.connect_options()).clone());
            let result: Result<(), sqlx::Error> = async {
                let mut listener = sqlx::postgres::PgListener::connect_with(&own).await?;
                listener.listen(CHANNEL).await?;
                cache.set_listening(true);
                // `None`: the connection was lost, and with it any change sent meanwhile.
                while listener.try_recv().await?.is_some() {
                    cache.forget();
                }
                Err(sqlx::Error::Protocol("the listening connection was lost".into()))
            }
            .await;
            own.close().await;
            cache.set_listening(false);
            if let Err(e) = result {
                tracing::warn!(error = %e, "access cache stopped listening; bindings are read from the store until it is back");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        () = listening => {}
        () = db.close_event() => {}
    }
}
