//! What the scheduler reads each cycle, kept in memory between cycles: every unfinished
//! workload, brought up to date from the store's change feed (the workloads written, and
//! those deleted, by transactions the last read did not see) instead of read again in
//! full, with the statuses its readers wrote themselves, as written, and with the
//! workloads this process's API created, as it created them ([`Inbox`]); and the nodes,
//! read again only when their version moved (a large site has tens of thousands).
//! Flavors, teams and clusters are few and read in full each time.
//!
//! The safety net is a full read: the first time, after any failed read, and in each
//! leader term (a term starts with an empty [`WorldCache`]) in the cycle; and every
//! [`FULL_READ_EVERY`] in a task of its own, whose result replaces the kept workloads at the
//! next read (which then applies the changes since the full read's cursor), so that no
//! cycle waits for it; a workload it found as kept stays the kept object, so that the
//! next snapshot derives only what changed. It also covers what the feed cannot see: a
//! `TRUNCATE`, writes with triggers disabled (`session_replication_role = replica`, a
//! restore).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_core::workload::{PendingReason, QueuePosition, StartEstimate, Workload};
use berth_core::{ClusterId, Error};
use berth_store::PgPool;
use berth_store::cluster::{ClusterNode, KeptNodes};
use berth_store::created_here::{Created, Inbox};
use berth_store::workload::{FeedCursor, StatusWrite, StatusWritten};
use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use crate::snapshot::World;

/// How often the workloads are read in full all the same.
pub const FULL_READ_EVERY: Duration = Duration::from_secs(120);

/// How long a deleted workload's tombstone is kept after the delete (by the database's
/// clock): far longer than a reader stays behind between full reads, and than a deleting
/// transaction stays open.
pub const TOMBSTONES_KEPT: Duration = Duration::from_secs(3600);

/// The kept world, shared by the reconcilers that read it (the scheduler, the estimates).
#[derive(Clone)]
pub struct WorldCache {
    kept: Arc<tokio::sync::Mutex<Kept>>,
    full_read_every: Duration,
}

impl Default for WorldCache {
    fn default() -> Self {
        Self::with_full_read_every(FULL_READ_EVERY)
    }
}

/// The unfinished workloads by uid.
type Workloads = BTreeMap<Uuid, Arc<Workload>>;

#[derive(Default)]
struct Kept {
    workloads: Workloads,
    nodes: Option<KeptNodes>,
    /// The change feed's cursor after the last read, and when the last full read was.
    read: Option<(FeedCursor, Instant)>,
    /// The versions the readers wrote themselves ([`WorldCache::wrote`]), kept as written,
    /// with the writing transaction: the feed's reads leave them out until the cursor has
    /// seen that transaction.
    own: Vec<(i64, i64)>,
    /// The periodic full read, under way in the background.
    full_read: Option<FullRead>,
    /// Where this process's API hands over the workloads it creates, so that the feed's
    /// reads leave them out (the scheduler read back every new row).
    created: Option<Inbox>,
    /// When the scheduler last wrote every queue position that moved (by the controllers'
    /// clock), see [`crate::scheduler::POSITIONS_REFRESH`].
    positions_written: Option<DateTime<Utc>>,
    /// What the last snapshot built of each workload.
    derived: Arc<std::sync::Mutex<crate::snapshot::Derivations>>,
}

/// Every unfinished workload as of a change feed cursor, read by a task of its own so that
/// the periodic full read (a second at 100,000 workloads) holds up no cycle. Dropped with
/// the kept world (a new leader term), it stops.
struct FullRead {
    started: Instant,
    task: tokio::task::JoinHandle<Result<(FeedCursor, Workloads), Error>>,
}

impl FullRead {
    fn start(db: &PgPool) -> Self {
        let db = db.clone();
        let task = tokio::spawn(async move {
            let mut tx = berth_store::begin_snapshot(&db).await?;
            let cursor = berth_store::workload::change_cursor(&mut *tx).await?;
            let all = berth_store::workload::workload_list_active(&mut *tx).await?;
            berth_store::commit(tx).await?;
            Ok((cursor, all.into_iter().map(|w| (w.metadata.uid, Arc::new(w))).collect()))
        });
        Self { started: Instant::now(), task }
    }
}

impl Drop for FullRead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a world was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Full,
    /// Changes only: how many workloads were written or deleted since.
    Changes(usize),
}

/// Everything the scheduler looks at, read in full in one consistent snapshot (what a
/// first read of a new [`WorldCache`] does).
///
/// # Errors
/// Store errors.
pub async fn read_full(db: &PgPool, now: DateTime<Utc>) -> Result<World, Error> {
    WorldCache::default().load(db, now).await.map(|(world, _)| world)
}

impl WorldCache {
    /// A kept world read in full in the background every `every` (tests).
    pub fn with_full_read_every(every: Duration) -> Self {
        Self { kept: Arc::default(), full_read_every: every }
    }

    /// The world at `now` (the controllers' clock): the kept workloads brought up to
    /// date, or read in full when due.
    ///
    /// # Errors
    /// Store errors (the next read is then a full one).
    pub async fn load(&self, db: &PgPool, now: DateTime<Utc>) -> Result<(World, Read), Error> {
        let mut kept = self.kept.lock().await;
        let read = kept.refresh(db, self.full_read_every, now).await;
        if read.is_err() {
            *kept = Kept::default();
        }
        read
    }

    /// Every cluster's nodes, as stored now (read only when they changed since the last).
    ///
    /// # Errors
    /// Store errors.
    pub async fn nodes(&self, db: &PgPool) -> Result<Arc<Vec<(ClusterId, ClusterNode)>>, Error> {
        let mut kept = self.kept.lock().await;
        // One snapshot, so that the version kept is the nodes'.
        let mut tx = berth_store::begin_snapshot(db).await?;
        let nodes = berth_store::cluster::cluster_nodes_current(&mut tx, &mut kept.nodes).await?;
        berth_store::commit(tx).await?;
        Ok(nodes)
    }

    /// Whether every queue position that moved is due to be written: none was in this
    /// term, or the last time is `every` ago.
    pub async fn positions_due(&self, now: DateTime<Utc>, every: Duration) -> bool {
        self.kept
            .lock()
            .await
            .positions_written
            .is_none_or(|at| now - at >= TimeDelta::from_std(every).unwrap_or_default())
    }

    /// Every queue position that moved was written at `at`.
    pub async fn positions_written(&self, at: DateTime<Utc>) {
        self.kept.lock().await.positions_written = Some(at);
    }

    /// Keeps the statuses its readers wrote (`written`, of `writes`) as the database now
    /// holds them, and leaves them out of the next reads: a cycle's writes are not read
    /// back by the next (the scheduler writes each new workload's pending reason or
    /// admission, so reading them back doubled what it read).
    pub async fn wrote(&self, writes: Vec<StatusWrite>, written: Vec<StatusWritten>) {
        let versions: HashMap<Uuid, StatusWritten> = written.into_iter().map(|w| (w.uid, w)).collect();
        let found: Vec<_> = {
            let kept = self.kept.lock().await;
            if kept.read.is_none() {
                return;
            }
            writes
                .into_iter()
                .filter_map(|w| {
                    let v = *versions.get(&w.uid.0)?;
                    let was = kept.workloads.get(&v.uid).filter(|was| older(was, &v))?;
                    Some((was.clone(), w.status, v))
                })
                .collect()
        };
        // Off the runtime: a cycle admits up to 100,000 workloads.
        let made = crate::off_runtime(move || {
            found
                .into_iter()
                .filter_map(|(was, status, v)| {
                    // As a read would give it: through the JSON the database holds.
                    let status = serde_json::to_value(status).and_then(serde_json::from_value).ok()?;
                    let mut next = Workload::clone(&was);
                    next.metadata.resource_version = v.resource_version.to_string();
                    next.metadata.update_timestamp = v.updated_at;
                    next.status = status;
                    Some((Arc::new(next), v))
                })
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(made) = made else { return };
        let mut kept = self.kept.lock().await;
        let Kept { workloads, own, read, .. } = &mut *kept;
        if read.is_none() {
            return;
        }
        for (next, v) in made {
            // Another reader may have read this version, or a later one, meanwhile.
            if !workloads.get(&v.uid).is_some_and(|was| older(was, &v)) {
                continue;
            }
            if next.status.phase.is_final() {
                workloads.remove(&v.uid);
            } else {
                workloads.insert(v.uid, next);
            }
            own.push((v.resource_version, v.written_by));
        }
    }

    /// Keeps what its readers explained of pending workloads (`explained`: each with the
    /// version it was explained at) as the database now holds it. Explaining moves no
    /// version, so nothing is left out of the next reads; a workload kept at another
    /// version since is left as that read gave it.
    pub async fn explained(&self, explained: Vec<(Uuid, i64, Explained)>) {
        let mut kept = self.kept.lock().await;
        if kept.read.is_none() {
            return;
        }
        for (uid, version, part) in explained {
            let Some(was) = kept.workloads.get_mut(&uid) else { continue };
            if was.metadata.resource_version.parse::<i64>() != Ok(version) {
                continue;
            }
            let next = Arc::make_mut(was);
            match part {
                Explained::Reason { pending_reason, queue_position } => {
                    next.status.pending_reason = Some(pending_reason);
                    next.status.queue_position = queue_position;
                }
                Explained::Estimate(estimate) => next.status.estimated_start = estimate,
            }
        }
    }

    /// The next read is a full one.
    pub async fn invalidate(&self) {
        *self.kept.lock().await = Kept::default();
    }
}

/// What a reader explained of a pending workload ([`WorldCache::explained`]).
pub enum Explained {
    /// The scheduler's reason and queue position.
    Reason { pending_reason: PendingReason, queue_position: Option<QueuePosition> },
    /// The estimates' start.
    Estimate(Option<StartEstimate>),
}

/// The full read `all` with each workload that equals the one `kept` (field by field: a
/// write behind the feed's back that left the version as it was still counts) as the kept
/// object, so that what the snapshot derived of it holds: after each full read the next
/// cycle derived all 147,000 workloads anew (660 ms of its 846, `bench/controllers scale`).
/// What the readers explained of a workload kept at the version the full read found is
/// theirs too: explaining moves no version, so the feed's reads after the swap would not
/// bring back a reason written after the full read's snapshot, and the kept world would
/// hold the older one (the next cycle, finding the plan's reason equal to it, would not
/// write, and the reason written last would stand). Returns it and the objects to free.
fn keep_unchanged(mut all: Workloads, kept: Workloads) -> (Workloads, Vec<Arc<Workload>>) {
    let mut replaced = Vec::with_capacity(kept.len());
    // Both by uid: one walk through the two.
    let mut kept = kept.into_iter().peekable();
    for (uid, w) in &mut all {
        while let Some((_, gone)) = kept.next_if(|(k, _)| k < uid) {
            replaced.push(gone);
        }
        if let Some((_, was)) = kept.next_if(|(k, _)| k == uid) {
            if was.metadata.resource_version == w.metadata.resource_version {
                let read = Arc::make_mut(w);
                read.status.pending_reason.clone_from(&was.status.pending_reason);
                read.status.queue_position = was.status.queue_position;
                read.status.estimated_start.clone_from(&was.status.estimated_start);
            }
            replaced.push(if was == *w { std::mem::replace(w, was) } else { was });
        }
    }
    replaced.extend(kept.map(|(_, w)| w));
    (all, replaced)
}

/// Whether `was` is kept at a version older than `written`.
fn older(was: &Workload, written: &StatusWritten) -> bool {
    was.metadata.resource_version.parse::<i64>().is_ok_and(|v| v < written.resource_version)
}

impl Kept {
    /// Keeps the workloads created here that a read from `since` would return (those it
    /// returns at a later version, or as deleted, are then put right by that read), and
    /// leaves them out of it.
    fn keep_created(&mut self, since: &FeedCursor, created: Vec<Created>) {
        for Created { workload: w, written_by } in created {
            let Ok(version) = w.metadata.resource_version.parse::<i64>() else { continue };
            if since.saw(written_by) || w.status.phase.is_final() {
                continue;
            }
            let kept_newer = (self.workloads.get(&w.metadata.uid))
                .is_some_and(|was| was.metadata.resource_version.parse::<i64>().is_ok_and(|v| v >= version));
            if !kept_newer {
                self.workloads.insert(w.metadata.uid, Arc::new(w));
            }
            self.own.push((version, written_by));
        }
    }

    async fn refresh(
        &mut self,
        db: &PgPool,
        full_read_every: Duration,
        now: DateTime<Utc>,
    ) -> Result<(World, Read), Error> {
        // A finished background full read replaces the kept workloads (before this read's
        // snapshot, so the full read's is older); the changes since its cursor are then
        // read as after any read.
        let mut swapped = false;
        if self.full_read.as_ref().is_some_and(|f| f.task.is_finished())
            && let Some(mut done) = self.full_read.take()
        {
            let (cursor, all) = (&mut done.task).await.map_err(|e| Error::Internal(e.to_string()))??;
            let kept = std::mem::take(&mut self.workloads);
            let (all, replaced) = crate::off_runtime(move || keep_unchanged(all, kept)).await?;
            self.workloads = all;
            // Freeing the replaced objects takes tens of milliseconds at 100,000: not in the cycle.
            tokio::task::spawn_blocking(move || drop(replaced));
            self.read = Some((cursor, done.started));
            // Its snapshot may be older than the readers' own writes: read them again.
            self.own.clear();
            swapped = true;
        }
        if let Some((_, full_at)) = self.read
            && full_at.elapsed() >= full_read_every
            && self.full_read.is_none()
        {
            self.full_read = Some(FullRead::start(db));
        }
        // Taken before the snapshot, so that the snapshot sees every one.
        let created = self.created.get_or_insert_with(|| Inbox::open(db)).take();
        let mut tx = berth_store::begin_snapshot(db).await?;
        let cursor = berth_store::workload::change_cursor(&mut *tx).await?;
        let flavors = berth_store::flavor::flavor_names(&mut *tx).await?;
        let teams = berth_store::team::team_list_all(&mut *tx).await?;
        let clusters = berth_store::cluster::cluster_list_all(&mut *tx).await?;
        let nodes = berth_store::cluster::cluster_nodes_current(&mut tx, &mut self.nodes).await?;
        let read = match self.read.take() {
            Some((since, full_at)) => {
                self.keep_created(&since, created);
                let own: Vec<i64> = self.own.iter().map(|&(version, _)| version).collect();
                let written = berth_store::workload::workload_list_written_since(&mut *tx, &since, &own).await?;
                let deleted = berth_store::workload::workload_deleted_since(&mut *tx, &since).await?;
                let changes = written.len() + deleted.len();
                for w in written {
                    if w.status.phase.is_final() {
                        self.workloads.remove(&w.metadata.uid);
                    } else {
                        self.workloads.insert(w.metadata.uid, Arc::new(w));
                    }
                }
                for uid in deleted {
                    self.workloads.remove(&uid);
                }
                self.own.retain(|&(_, by)| !cursor.saw(by));
                self.read = Some((cursor, full_at));
                if swapped { Read::Full } else { Read::Changes(changes) }
            }
            None => {
                let all = berth_store::workload::workload_list_active(&mut *tx).await?;
                self.workloads = all.into_iter().map(|w| (w.metadata.uid, Arc::new(w))).collect();
                self.read = Some((cursor, Instant::now()));
                self.own.clear();
                Read::Full
            }
        };
        berth_store::commit(tx).await?;
        let workloads = self.workloads.values().cloned().collect();
        Ok((World { now, flavors, teams, clusters, nodes, workloads, derived: self.derived.clone() }, read))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::workload::PendingReason;

    fn workload(version: u64, reason: &str) -> Arc<Workload> {
        let mut w: Workload = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "team": "nlp", "uid": Uuid::nil(), "generation": 1,
                         "resource_version": version.to_string(),
                         "creation_timestamp": "2026-12-07T00:00:00Z", "update_timestamp": "2026-12-07T00:00:00Z"},
            "spec": {"kind": "batch", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}}},
            "status": {},
        }))
        .unwrap();
        w.status.pending_reason = Some(PendingReason { code: reason.into(), message: reason.into(), details: None });
        Arc::new(w)
    }

    /// A full read taken before the scheduler explained a workload anew does not bring the
    /// older reason back into the kept world; a workload written since (another version)
    /// is as the full read found it.
    #[test]
    fn a_full_read_keeps_what_was_explained_since_its_snapshot() {
        let kept: Workloads = [(Uuid::nil(), workload(5, "Written after the full read"))].into();
        let all: Workloads = [(Uuid::nil(), workload(5, "As the full read found it"))].into();
        let (all, _) = keep_unchanged(all, kept.clone());
        assert!(Arc::ptr_eq(&all[&Uuid::nil()], &kept[&Uuid::nil()]), "the kept object stays");
        let reason = |w: &Workloads| w[&Uuid::nil()].status.pending_reason.clone().unwrap().code;
        assert_eq!(reason(&all), "Written after the full read");

        let (all, _) = keep_unchanged([(Uuid::nil(), workload(6, "A new version"))].into(), kept);
        assert_eq!(reason(&all), "A new version");
    }
}
