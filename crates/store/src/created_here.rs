//! Workloads this process created, handed to its own readers of the change feed (the
//! controllers' kept world, [`Inbox`]) once their transaction has committed, so that they
//! need not read them back: in a burst of submissions the scheduler's read of the feed read
//! every new row whole (13 µs of Postgres a row, 14 % of its statement time while
//! `bench/api-load` creates), right after this process had sent it.
//!
//! What is handed over only spares a read: a reader still reads the feed, and leaves out
//! of it the rows still at the version handed over. A workload written meanwhile (cancelled,
//! deleted) comes through the feed at its new version, and what another replica created
//! only through the feed. An inbox nobody empties holds at most [`KEPT_AT_MOST`]; what
//! does not fit is dropped, and then read from the feed.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use berth_core::workload::Workload;

use crate::{PerDatabase, PgPool};

/// The most workloads an inbox holds until it is emptied.
pub const KEPT_AT_MOST: usize = 50_000;

/// A workload as its creating statement wrote it, its spec cut as the scheduler reads it
/// ([`crate::workload::spec_for_scheduling`]: no script, command or environment, so that a
/// full inbox holds no more than the workloads' shapes), and that statement's transaction
/// (as [`crate::workload::change_cursor`] counts).
#[derive(Debug, Clone)]
pub struct Created {
    pub workload: Workload,
    pub written_by: i64,
}

/// The inboxes open on one database.
#[derive(Default)]
struct Readers(Mutex<Vec<Weak<Mutex<Vec<Created>>>>>);

static READERS: PerDatabase<Readers> = PerDatabase::new();

/// Where the workloads created in this process from now on are handed over, until it is
/// dropped.
pub struct Inbox(Arc<Mutex<Vec<Created>>>);

impl Inbox {
    /// Opens an inbox on `db`.
    #[must_use]
    pub fn open(db: &PgPool) -> Self {
        let inbox = Arc::default();
        lock(&READERS.of(db).0).push(Arc::downgrade(&inbox));
        Self(inbox)
    }

    /// What was handed over since the last take, in the order it committed.
    #[must_use]
    pub fn take(&self) -> Vec<Created> {
        std::mem::take(&mut *lock(&self.0))
    }
}

/// Hands `created`, written by transaction `written_by`, which has committed, to every
/// inbox open on `db` (cut for the scheduler once, however many are open).
pub fn committed<'a>(db: &PgPool, written_by: i64, created: impl Iterator<Item = &'a Workload>) {
    let readers = READERS.of(db);
    let mut readers = lock(&readers.0);
    let mut open: Vec<Arc<Mutex<Vec<Created>>>> = Vec::with_capacity(readers.len());
    readers.retain(|inbox| inbox.upgrade().map(|inbox| open.push(inbox)).is_some());
    if open.is_empty() {
        return;
    }
    let cut: Vec<Created> = created
        .map(|w| {
            let mut workload = w.clone();
            crate::workload::spec_for_scheduling(&mut workload.spec);
            Created { workload, written_by }
        })
        .collect();
    for inbox in open {
        let mut inbox = lock(&inbox);
        if inbox.len() + cut.len() <= KEPT_AT_MOST {
            inbox.extend(cut.iter().cloned());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
