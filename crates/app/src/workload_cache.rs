//! Workloads as `GET` by name reads them, kept between requests, with reads as fresh as
//! the database's (what the Kubernetes API server calls consistent reads from its cache).
//!
//! Before a read is answered, the cache is brought up to date from the change feed by a
//! read of the feed that *began after the request arrived*; so a read sees every write
//! committed before it, whichever replica (or tool) wrote it. The requests waiting meanwhile
//! share that one read: a burst of reads costs one statement, not one each, and a read of
//! what nobody wrote since is a lookup in memory. A workload not kept is read from the
//! store and kept; a read of the feed that failed sends its waiters to the store.
//!
//! The cache starts over (empty, from where the feed stands) every [`STARTS_OVER_EVERY`]:
//! far less than tombstones are kept, so no delete is missed however long it sat unused,
//! and it covers what the feed cannot see (a `TRUNCATE`, writes with triggers disabled).
//! It keeps at most [`MOST_KEPT`] workloads, those read since it started; once full, what
//! else is read is not kept until it starts over. There is one cache per database, as for
//! [`crate::access_cache`] (tests run several in one process).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_core::Error;
use berth_core::workload::Workload;
use berth_store::PgPool;
use berth_store::workload::{self as store, FeedRead};
use tokio::sync::{Notify, watch};

/// How long the cache builds on one start before it starts over.
pub const STARTS_OVER_EVERY: Duration = Duration::from_secs(60);

/// The longest a read of the feed may take (every read waits on it); past it the
/// connection is dropped and the waiting reads go to the store.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The most workloads kept.
pub const MOST_KEPT: usize = 50_000;

/// A workload by team and name, as committed when the request arrived; `None` when there
/// is none.
///
/// # Errors
/// As the store.
pub async fn workload(db: &PgPool, team: &str, name: &str) -> Result<Option<Arc<Workload>>, Error> {
    cache(db).workload(db, team, name).await
}

type Key = (String, String);

#[derive(Default)]
struct WorkloadCache {
    state: Mutex<State>,
    /// The reads of the feed completed, and whether the last one succeeded.
    completed: watch::Sender<(u64, bool)>,
    wake: Notify,
    reader_running: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Reads of the feed begun.
    begun: u64,
    completed: u64,
    /// Where the feed was read to, and when the cache started; `None` until it has.
    cursor: Option<(store::FeedCursor, Instant)>,
    kept: HashMap<Key, Arc<Workload>>,
}

static CACHES: crate::PerDatabase<WorkloadCache> = crate::PerDatabase::new();

fn cache(db: &PgPool) -> Arc<WorkloadCache> {
    CACHES.of(db)
}

impl WorkloadCache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn workload(self: &Arc<Self>, db: &PgPool, team: &str, name: &str) -> Result<Option<Arc<Workload>>, Error> {
        if !self.caught_up(db).await {
            return Ok(store::workload_fetch(db, team, name).await?.map(Arc::new));
        }
        let key = (team.to_owned(), name.to_owned());
        let read_at = {
            let state = self.state();
            if let Some(kept) = state.kept.get(&key) {
                return Ok(Some(kept.clone()));
            }
            state.completed
        };
        let Some(found) = store::workload_fetch(db, team, name).await?.map(Arc::new) else { return Ok(None) };
        let mut state = self.state();
        // Kept only if no read of the feed completed meanwhile: one that did may have
        // applied a later write (or the delete) of this workload before it was here.
        if state.completed == read_at && state.cursor.is_some() && state.kept.len() < MOST_KEPT {
            state.kept.insert(key, found.clone());
        }
        Ok(Some(found))
    }

    /// Waits for a read of the feed that begins after this call; whether it succeeded.
    async fn caught_up(self: &Arc<Self>, db: &PgPool) -> bool {
        let target = self.state().begun + 1;
        let mut completed = self.completed.subscribe();
        if !self.reader_running.swap(true, Ordering::AcqRel) {
            tokio::spawn(read_feed(self.clone(), db.clone()));
        }
        self.wake.notify_one();
        match completed.wait_for(|(done, _)| *done >= target).await {
            Ok(done) => done.1,
            Err(_) => false,
        }
    }

    /// Ends the read of the feed begun last, and wakes who waits on it: with what it read,
    /// or, when it failed (`None`), with nothing kept and their reads sent to the store.
    fn complete(&self, read: Option<FeedRead>) {
        let mut state = self.state();
        state.completed = state.begun;
        let done = state.completed;
        let ok = read.is_some();
        if let Some(read) = read {
            state.apply(read);
        } else {
            state.cursor = None;
            state.kept.clear();
        }
        drop(state);
        self.completed.send_replace((done, ok));
    }
}

impl State {
    /// Brings what is kept up to date with a read of the feed.
    fn apply(&mut self, read: FeedRead) {
        let started = match &self.cursor {
            Some((_, started)) => *started,
            None => {
                self.kept.clear();
                Instant::now()
            }
        };
        self.cursor = Some((read.cursor, started));
        // Only what is kept is brought up to date: what was written but never read costs
        // no memory, and a busy world (the scheduler rewriting queue positions, status
        // syncs) does not push out what readers ask for.
        for w in read.written {
            let key = (w.metadata.team.clone().unwrap_or_default(), w.metadata.name.clone());
            if let Some(kept) = self.kept.get_mut(&key)
                && version(kept) <= version(&w)
            {
                *kept = Arc::new(w);
            }
        }
        if !read.deleted.is_empty() {
            let deleted: HashSet<_> = read.deleted.into_iter().collect();
            self.kept.retain(|_, w| !deleted.contains(&w.metadata.uid));
        }
    }
}

/// A resource version as the number it is (as text, "10" < "9").
fn version(w: &Workload) -> u64 {
    w.metadata.resource_version.parse().unwrap_or(0)
}

/// Reads the feed each time it is woken, until the pool closes (or its runtime ends: the
/// next read starts another).
async fn read_feed(cache: Arc<WorkloadCache>, db: PgPool) {
    struct Stopped(Arc<WorkloadCache>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.reader_running.store(false, Ordering::Release);
            // Whoever waits on a read that will not come goes to the store, as after a
            // failed one.
            self.0.state().begun += 1;
            self.0.complete(None);
        }
    }
    let _stopped = Stopped(cache.clone());
    // A connection of its own: one from the pool costs a second round trip (sqlx pings it
    // on its way back), and the reads come thousands of times a second under load.
    let mut own: Option<berth_store::PgConnection> = None;
    loop {
        tokio::select! {
            () = cache.wake.notified() => {}
            () = db.close_event() => return,
        }
        let cursor = {
            let mut state = cache.state();
            state.begun += 1;
            if state.cursor.as_ref().is_some_and(|(_, started)| started.elapsed() >= STARTS_OVER_EVERY) {
                state.cursor = None;
            }
            state.cursor.as_ref().map(|(cursor, _)| cursor.clone())
        };
        let read = tokio::time::timeout(READ_TIMEOUT, async {
            let mut conn = match own.take() {
                Some(conn) => conn,
                None => berth_store::connect_alone(&db).await?,
            };
            let read = store::workload_feed_read(&mut conn, cursor).await?;
            // A connection that failed (or did not answer) is not used again.
            own = Some(conn);
            Ok(read)
        })
        .await
        .unwrap_or_else(|_| Err(Error::Unavailable("the workload change feed did not answer".into())));
        if let Err(e) = &read {
            tracing::warn!(error = %e, "reading the workload change feed failed; reads go to the store");
        }
        cache.complete(read.ok());
    }
}
