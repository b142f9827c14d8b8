//! Notifies the controllers, on every replica, of workload submissions: one notification
//! for many submissions, sent from a transaction of its own right after theirs commit.
//!
//! A notification inside each submission's transaction would hold Postgres' notify lock
//! until that transaction's commit is flushed to disk, so only one submission could commit
//! at a time (pgbench here: 6,900 single-row inserts/s, 2,700/s with a NOTIFY in each).
//! At most one notification is in flight per database, and one is sent at most every
//! [`GAP`]; submissions that commit meanwhile are covered by the next one. Should one fail, or a request be dropped between its commit
//! and this call, the controllers still look on their interval.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use berth_store::PgPool;
use tokio::sync::Notify;

/// The least time between two notifications. Each is a transaction of its own, with a
/// commit to flush: one per group of submissions was half of the commits Postgres made in a
/// burst of creates (bench/api-load: 16,913 in 12 s for 96,339 creates). The scheduler
/// waits longer between its cycles (`min_cycle_interval`, 100 ms).
const GAP: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Default)]
struct Notifier {
    running: AtomicBool,
    wake: Notify,
}

static NOTIFIERS: crate::PerDatabase<Notifier> = crate::PerDatabase::new();

/// Workloads were submitted to `db` and their transaction has committed.
pub fn workloads_submitted(db: &PgPool) {
    let notifier = NOTIFIERS.of(db);
    if !notifier.running.swap(true, Ordering::AcqRel) {
        tokio::spawn(send(notifier.clone(), db.clone()));
    }
    notifier.wake.notify_one();
}

/// Sends a notification each time it is woken, until the pool closes (or its runtime
/// ends: the next submission starts another).
async fn send(notifier: Arc<Notifier>, db: PgPool) {
    struct Stopped(Arc<Notifier>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.running.store(false, Ordering::Release);
        }
    }
    let _stopped = Stopped(notifier.clone());
    loop {
        tokio::select! {
            () = notifier.wake.notified() => {}
            () = db.close_event() => return,
        }
        if let Err(e) = berth_store::workload::notify_workloads_submitted(&db).await {
            tracing::warn!(error = %e, "could not notify the controllers of submissions; they look on their interval");
        }
        tokio::time::sleep(GAP).await;
    }
}
