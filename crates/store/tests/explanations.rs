//! What the controllers explain of pending workloads (reasons, queue positions, start
//! estimates), kept beside the workloads' rows and merged into their statuses as read.

use berth_core::WorkloadId;
use berth_core::workload::{PendingReason, Phase, QueuePosition, StartEstimate, Workload, WorkloadStatus};
use berth_store::workload::{self as store, Explanation};
use sqlx::PgPool;

mod support;

use support::{batch_workloads, cursor, names};

async fn fetch(db: &PgPool, name: &str) -> Workload {
    store::workload_fetch(db, "nlp", name).await.unwrap().unwrap()
}

fn reason(code: &str) -> PendingReason {
    PendingReason { code: code.into(), message: format!("{code} in words"), details: None }
}

fn explanation(w: &Workload, code: &str, global: u32) -> Explanation {
    Explanation {
        uid: WorkloadId(w.metadata.uid),
        attempt: w.status.attempt,
        pending_reason: Some(reason(code)),
        queue_position: Some(QueuePosition { global, team: global }),
    }
}

async fn explained_rows(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workload_explanations").fetch_one(db).await.unwrap()
}

async fn write_status(db: &PgPool, w: &Workload, status: WorkloadStatus) -> Workload {
    let mut tx = berth_store::begin(db).await.unwrap();
    let writes = [store::StatusWrite {
        uid: WorkloadId(w.metadata.uid),
        resource_version: w.metadata.resource_version.parse().unwrap(),
        status,
    }];
    assert_eq!(store::workload_write_statuses(&mut tx, &writes).await.unwrap().len(), 1);
    berth_store::commit(tx).await.unwrap();
    fetch(db, &w.metadata.name).await
}

/// A reason and a queue position written for a pending workload show in its status, by
/// every read, without moving its version (a client's `If-Match` still holds); GET's
/// cache finds it through the feed, and the scheduler's own read of the feed does not
/// read it back.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn what_is_explained_shows_in_a_pending_workloads_status_and_moves_no_version(db: PgPool) {
    let first = "UPDATE workloads SET spec = jsonb_set(spec, '{priority}', '5') WHERE name = 'w2'";
    batch_workloads(&mut db.acquire().await.unwrap(), 3, "Pending", &[first]).await;
    let (w1, w2) = (fetch(&db, "w1").await, fetch(&db, "w2").await);
    let since = cursor(&db).await;
    let written =
        store::workload_explain(&db, &[explanation(&w1, "NoClusterFits", 2), explanation(&w2, "Fragmented", 1)])
            .await
            .unwrap();
    assert_eq!(written, 2);

    let got = fetch(&db, "w1").await;
    assert_eq!(got.status.pending_reason, Some(reason("NoClusterFits")));
    assert_eq!(got.status.queue_position, Some(QueuePosition { global: 2, team: 2 }));
    assert_eq!(got.metadata.resource_version, w1.metadata.resource_version, "explaining moves no version");
    let stored: serde_json::Value =
        sqlx::query_scalar("SELECT status FROM workloads WHERE name = 'w1'").fetch_one(&db).await.unwrap();
    assert!(stored.get("pending_reason").is_none(), "the row itself is not written: {stored}");

    let mut conn = db.acquire().await.unwrap();
    let feed = store::workload_feed_read(&mut *conn, Some(since.clone())).await.unwrap();
    assert_eq!(names(feed.written.clone()), ["w1", "w2"], "GET's cache reads what was explained");
    assert!(feed.written.iter().all(|w| w.status.pending_reason.is_some()));
    let scheduler = store::workload_list_written_since(&mut *conn, &since, &[]).await.unwrap();
    assert!(scheduler.is_empty(), "the scheduler keeps what it explained: {:?}", names(scheduler));

    // The queue is in the order explained (w2 first: a higher priority), what is not
    // explained yet last.
    let (queue, pending, _) = store::workload_queue(&db, None, 10).await.unwrap();
    assert_eq!(pending, 3);
    let order: Vec<_> = queue.iter().map(|w| w.metadata.name.as_str()).collect();
    assert_eq!(order, ["w2", "w1", "w3"]);
    let many = store::workload_fetch_many(&db, &[w1.metadata.uid, w2.metadata.uid]).await.unwrap();
    assert!(many.iter().all(|w| w.status.queue_position.is_some()));
    let active = store::workload_list_active(&db).await.unwrap();
    assert_eq!(active.iter().filter(|w| w.status.pending_reason.is_some()).count(), 2);

    // An estimate keeps the reason of the same attempt; a new reason keeps the estimate.
    let estimate = StartEstimate { at: chrono::Utc::now(), basis: "now".into() };
    assert_eq!(
        store::workload_estimate(&db, &[(WorkloadId(w1.metadata.uid), 0, Some(estimate.clone()))]).await.unwrap(),
        1
    );
    store::workload_explain(&db, &[explanation(&w1, "QuotaLimitReached", 1)]).await.unwrap();
    let got = fetch(&db, "w1").await;
    assert_eq!(got.status.pending_reason, Some(reason("QuotaLimitReached")));
    assert_eq!(got.status.estimated_start.as_ref().map(|e| &e.basis), Some(&estimate.basis));
}

/// A workload requeued (its next attempt) does not show what was explained of its last
/// wait, and one that stops waiting loses it; what a race leaves (a reason written as its
/// workload went) is purged. A status written with an explanation in it does not put it
/// into the row.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn what_was_explained_of_another_attempt_or_phase_is_not_shown_and_goes(db: PgPool) {
    batch_workloads(&mut db.acquire().await.unwrap(), 3, "Pending", &[]).await;
    let w1 = fetch(&db, "w1").await;
    store::workload_explain(&db, &[explanation(&w1, "NoClusterFits", 1)]).await.unwrap();

    let requeued = write_status(&db, &w1, WorkloadStatus { attempt: 1, ..WorkloadStatus::default() }).await;
    assert_eq!(requeued.status.pending_reason, None, "attempt 0's reason is not attempt 1's");
    store::workload_estimate(&db, &[(WorkloadId(w1.metadata.uid), 1, None)]).await.unwrap();
    assert_eq!(fetch(&db, "w1").await.status.pending_reason, None, "an estimate of attempt 1 drops attempt 0's reason");
    store::workload_explain(&db, &[explanation(&requeued, "Fragmented", 1)]).await.unwrap();
    let explained = fetch(&db, "w1").await;
    assert_eq!(explained.status.pending_reason, Some(reason("Fragmented")));

    // A status carrying what the reader saw explained, as a controller's `..status.clone()`
    // does: the row keeps none of it.
    let admitted = WorkloadStatus { phase: Phase::Admitted, ..explained.status.clone() };
    let admitted = write_status(&db, &explained, admitted).await;
    assert_eq!(admitted.status.pending_reason, None);
    let stored: serde_json::Value =
        sqlx::query_scalar("SELECT status FROM workloads WHERE name = 'w1'").fetch_one(&db).await.unwrap();
    assert!(stored.get("pending_reason").is_none() && stored.get("queue_position").is_none(), "{stored}");
    assert_eq!(explained_rows(&db).await, 0, "a workload that stops waiting loses its row");

    // Rows of workloads gone, or no longer pending, are purged; a pending one's stays.
    let (w2, w3) = (fetch(&db, "w2").await, fetch(&db, "w3").await);
    store::workload_explain(&db, &[explanation(&w1, "Late", 1), explanation(&w2, "A", 1), explanation(&w3, "B", 2)])
        .await
        .unwrap();
    sqlx::query("DELETE FROM workloads WHERE name = 'w3'").execute(&db).await.unwrap();
    assert_eq!(store::workload_explanations_purge(&db).await.unwrap(), 2, "w1 (admitted) and w3 (gone)");
    assert_eq!(explained_rows(&db).await, 1);
    assert_eq!(fetch(&db, "w2").await.status.pending_reason, Some(reason("A")));
}

/// The queue lists a team's workloads in the scheduler's order for the team (priority,
/// then submission), whatever order their positions were written in: beyond the head a
/// position is written only once it is a tenth off, so as stored, one of priority 27 came
/// before one of 35 and two had the same team position (found from outside, through
/// `/api/v1/queue`). The team's stored positions are the places its workloads take;
/// positions increase down the list; what is not placed yet comes last.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_queue_keeps_each_teams_own_order_whatever_positions_were_written(db: PgPool) {
    batch_workloads(
        &mut db.acquire().await.unwrap(),
        6,
        "Pending",
        &[
            // w1..w6 submitted in that order, a second apart; w3 and w5 of priority 35.
            "UPDATE workloads SET created_at = now() - (10 - substr(name, 2)::int) * interval '1 second'",
            "UPDATE workloads SET spec = jsonb_set(spec, '{priority}', '35') WHERE name IN ('w3', 'w5')",
            "INSERT INTO teams (uid, name, spec) VALUES (gen_random_uuid(), 'cv', '{}')",
            "INSERT INTO workloads (uid, team_uid, team_name, name, kind, phase, flavors, spec)
             SELECT gen_random_uuid(), (SELECT uid FROM teams WHERE name = 'cv'), 'cv', 'c1', 'batch', 'Pending',
                    '{h100}', spec FROM workloads WHERE name = 'w1'",
        ],
    )
    .await;
    let at = |w: &Workload, global: u32, team: u32| Explanation {
        queue_position: Some(QueuePosition { global, team }),
        ..explanation(w, "NoClusterFits", global)
    };
    // As written by cycles apart: w5 (35) last written behind w4 (0), w3 (35) and w2 (0)
    // on one position; cv's c1 placed between them.
    let c1 = store::workload_fetch(&db, "cv", "c1").await.unwrap().unwrap();
    let mut written = vec![at(&c1, 280, 1)];
    for (name, global, team) in [("w1", 150, 1), ("w2", 264, 225), ("w3", 264, 225), ("w4", 300, 240), ("w5", 310, 241)]
    {
        written.push(at(&fetch(&db, name).await, global, team));
    }
    store::workload_explain(&db, &written).await.unwrap();

    let (queue, pending, _) = store::workload_queue(&db, None, 10).await.unwrap();
    assert_eq!(pending, 7);
    let listed: Vec<(&str, Option<(u32, u32)>)> =
        queue.iter().map(|w| (w.metadata.name.as_str(), w.status.queue_position.map(|p| (p.global, p.team)))).collect();
    assert_eq!(
        listed,
        [
            ("w3", Some((150, 1))),
            ("w5", Some((264, 2))),
            ("w1", Some((265, 3))),
            ("c1", Some((280, 1))),
            ("w2", Some((300, 4))),
            ("w4", Some((310, 5))),
            ("w6", None),
        ]
    );
    // One team's queue: the same order and places.
    let (nlp, _, _) = store::workload_queue(&db, Some(&["nlp".to_owned()]), 3).await.unwrap();
    let listed: Vec<_> =
        nlp.iter().map(|w| (w.metadata.name.as_str(), w.status.queue_position.map(|p| p.team))).collect();
    assert_eq!(listed, [("w3", Some(1)), ("w5", Some(2)), ("w1", Some(3))]);
    // An empty queue waits for 0 GPUs, not -0 (an empty sum of floats).
    let (none, pending, gpus) = store::workload_queue(&db, Some(&["nobody".to_owned()]), 3).await.unwrap();
    assert_eq!((none.len(), pending), (0, 0));
    assert!(gpus == 0.0 && gpus.is_sign_positive(), "{gpus}");
}
