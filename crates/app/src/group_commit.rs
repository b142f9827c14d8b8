//! Group commit of submissions: new workloads submitted at the same time, one per request,
//! are written by one statement in one transaction, and each request is answered once
//! that transaction has committed.
//!
//! A single-row transaction costs Postgres nearly as much as one of a hundred rows (the
//! round trips, the statement, the commit's WAL flush), so one statement per submission
//! held creates to ~0.1 of pgbench's single-row insert rate. Here a submission joins the
//! queue of its database; a writer takes everything queued (up to [`MOST_PER_STATEMENT`])
//! and writes it, and submissions that arrive meanwhile make up the next statement. No
//! submission waits for others to arrive: one alone is written at once, so a burst forms
//! groups by itself. One statement is in flight per database, and a second only once a
//! submission has waited [`SECOND_WRITER_AFTER`] behind it (at most [`WRITERS`]), so that
//! a statement held up (a lock, a slow flush, a lost connection) does not hold up those
//! behind it.
//!
//! A writer runs as a task of its own, so a request that goes away mid-write cannot take
//! the answers of the others with it. Should a group's statement fail, each of its
//! submissions is written alone, so one that cannot be written (its team was deleted
//! meanwhile) fails by itself.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use berth_core::event::Actor;
use berth_core::meta::{Labels, Owner};
use berth_core::workload::{Workload, WorkloadSpec, WorkloadStatus};
use berth_core::{Error, TeamId, WorkloadId};
use berth_store::PgPool;
use berth_store::workload::{self as store, NewWorkload};
use tokio::sync::oneshot;

/// Statements in flight at once per database, at most. Fewer make larger groups: with 32
/// clients submitting, 4 writers wrote groups of 3.6 on average and 2,692 creates/s
/// (Postgres spent 190 µs a row), 1 writer 4,565/s with a p99 of 49 ms, 2 writers 4,272/s
/// with 36 ms. Two started at once made groups of 9 (bench/api-load: 6,854/s, p99 15 ms);
/// one, with the second started only for a submission kept waiting (3, 5 or 8 ms),
/// 7,278-7,650/s with a p99 of 16-22 ms.
const WRITERS: usize = 2;

/// How long a submission waits behind the statement in flight before it starts another
/// writer. A group's statement takes about a millisecond (0.71 ms on average for 16 rows
/// in bench/api-load); one that takes several is held up.
const SECOND_WRITER_AFTER: Duration = Duration::from_millis(5);

/// Submissions written by one statement at most.
const MOST_PER_STATEMENT: usize = 100;

/// A new workload to create, owned so that another task can write it.
pub struct Submission {
    pub uid: WorkloadId,
    pub team_uid: TeamId,
    pub team: String,
    pub name: String,
    pub labels: Labels,
    pub spec: WorkloadSpec,
    pub status: WorkloadStatus,
    pub owner: Owner,
    pub actor: Actor,
}

/// The answer to a submission: the workload created, or `None` when its name was taken.
type Answer = Result<Option<Workload>, Error>;

#[derive(Default)]
struct Queue {
    waiting: Vec<(Submission, oneshot::Sender<Answer>)>,
    writers: usize,
}

static QUEUES: crate::PerDatabase<Mutex<Queue>> = crate::PerDatabase::new();

/// Creates the workload, with its `Created` event and audit record, in a statement shared
/// with the submissions made meanwhile; `None` when a workload of that name exists (the
/// caller then takes the general path). Returns once the write has committed.
///
/// # Errors
/// As [`store::workload_create_many`]; [`Error::Unavailable`] when the write was stopped
/// before it answered (the process is shutting down).
pub async fn create(db: &PgPool, submission: Submission) -> Answer {
    let queue = QUEUES.of(db);
    let (answer, mut answered) = oneshot::channel();
    lock(&queue).waiting.push((submission, answer));
    start_writer(db, &queue, 1);
    let answer = match tokio::time::timeout(SECOND_WRITER_AFTER, &mut answered).await {
        Ok(answer) => answer,
        Err(_) => {
            start_writer(db, &queue, WRITERS);
            answered.await
        }
    };
    answer.unwrap_or_else(|_| Err(Error::Unavailable("the submission's write was stopped; retry".into())))
}

/// Starts a writer if submissions are queued and fewer than `up_to` writers run.
fn start_writer(db: &PgPool, queue: &Arc<Mutex<Queue>>, up_to: usize) {
    let start = {
        let mut q = lock(queue);
        let start = q.writers < up_to && !q.waiting.is_empty();
        if start {
            q.writers += 1;
        }
        start
    };
    if start {
        tokio::spawn(write(db.clone(), queue.clone()));
    }
}

fn lock(queue: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes what is queued, group by group, until nothing is.
async fn write(db: PgPool, queue: Arc<Mutex<Queue>>) {
    // Counts the writer out, under the same lock as the last look at the queue (so that a
    // submission queued after it is seen, or starts a writer of its own). Should the task
    // be dropped mid-write (its runtime ends), submissions still queued when the last
    // writer goes are answered with an error (their senders dropped), not left waiting.
    struct Writer(Arc<Mutex<Queue>>, bool);
    impl Drop for Writer {
        fn drop(&mut self) {
            if !self.1 {
                let mut q = lock(&self.0);
                q.writers -= 1;
                if q.writers == 0 {
                    q.waiting.clear();
                }
            }
        }
    }
    let mut writer = Writer(queue.clone(), false);
    // One connection for as long as submissions keep coming (up to `HELD_AT_MOST`, so that
    // the pool's checks, a primary that moved among them, see it again), on which the
    // statement is planned once (see `GenericPlans`); without one, the pool's. Taken before
    // the first group: what arrives meanwhile joins it (taken after, groups of live
    // submissions were smaller, and Postgres spent 10 % more on them).
    let mut held = hold(&db).await;
    loop {
        let group: Vec<_> = {
            let mut q = lock(&queue);
            if q.waiting.is_empty() {
                q.writers -= 1;
                writer.1 = true;
                break;
            }
            let n = q.waiting.len().min(MOST_PER_STATEMENT);
            q.waiting.drain(..n).collect()
        };
        if held.as_ref().is_none_or(|(_, since)| since.elapsed() >= HELD_AT_MOST) {
            if let Some((conn, _)) = held.take() {
                conn.give_back().await;
            }
            held = hold(&db).await;
        }
        let (submissions, answers): (Vec<_>, Vec<_>) = group.into_iter().unzip();
        for (answer, result) in answers.into_iter().zip(write_group(&db, &mut held, &submissions).await) {
            // The request may have gone away; its workload is written all the same.
            let _ = answer.send(result);
        }
        crate::change_notice::workloads_submitted(&db);
    }
    if let Some((conn, _)) = held {
        conn.give_back().await;
    }
}

/// The longest a writer keeps one connection.
const HELD_AT_MOST: Duration = Duration::from_secs(1);

async fn hold(db: &PgPool) -> Option<(berth_store::GenericPlans, Instant)> {
    match berth_store::GenericPlans::acquire(db).await {
        Ok(conn) => Some((conn, Instant::now())),
        Err(e) => {
            tracing::warn!(error = %e, "group commit: no connection of its own; writing through the pool");
            None
        }
    }
}

/// The answer to each submission of the group, in order: written on the `held` connection
/// when there is one. Should its statement fail there, that connection is let go (it may be
/// the one that broke) and the group is written through the pool; should the group's
/// statement fail, each submission is written alone.
async fn write_group(
    db: &PgPool,
    held: &mut Option<(berth_store::GenericPlans, Instant)>,
    submissions: &[Submission],
) -> Vec<Answer> {
    let new: Vec<NewWorkload<'_>> = submissions.iter().map(new_workload).collect();
    let message = crate::workload::CREATED_MESSAGE;
    // Each statement is a transaction of its own: once it answers, it has committed.
    let committed = |created: store::CreatedMany| {
        created.committed(db);
        created.workloads
    };
    if let Some((conn, _)) = held {
        if let Ok(created) = store::workload_create_many(conn.connection(), &new, message).await {
            return committed(created).into_iter().map(Ok).collect();
        }
        *held = None;
    }
    match store::workload_create_many(db, &new, message).await {
        Ok(created) => committed(created).into_iter().map(Ok).collect(),
        Err(e) if new.len() == 1 => vec![Err(e)],
        Err(_) => {
            let mut answers = Vec::with_capacity(new.len());
            for n in &new {
                let alone = store::workload_create_many(db, std::slice::from_ref(n), message);
                answers.push(alone.await.map(|created| committed(created).pop().flatten()));
            }
            answers
        }
    }
}

fn new_workload(s: &Submission) -> NewWorkload<'_> {
    NewWorkload {
        uid: s.uid,
        team_uid: s.team_uid,
        team: &s.team,
        name: &s.name,
        labels: &s.labels,
        spec: &s.spec,
        status: &s.status,
        owner: Some(&s.owner),
        actor: &s.actor,
    }
}
