//! End-to-end flows on real Postgres with simulated clusters: the store, the scheduler,
//! the reconcilers and the sim backend together. DATABASE_URL must point at a server that
//! lets the role create databases (scripts/test sets that up).

mod support;

use berth_adapters::JobState;
use berth_controllers::runner::Report;
use berth_controllers::{cluster_health, deletion, dispatcher, orphans, preemption, scheduler, status_sync};
use berth_core::usage::{GroupBy, ReportRequest};
use berth_core::workload::{Phase, Workload};
use serde_json::json;
use support::Plane;

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_submitted_workload_runs_and_succeeds(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    let w = p.submit("nlp", "train", 1, 8.0, json!({})).await;
    p.settle().await;
    let running = p.workload("nlp", "train").await;
    assert_eq!(running.status.phase, Phase::Running);
    let a = running.status.admission.as_ref().unwrap();
    assert_eq!((a.cluster.as_str(), a.borrowed, a.placement.len()), ("sim-a", false, 1));
    assert!(running.status.backend_ref.is_some() && running.status.started_at.is_some());
    let team = berth_app::team::team_get(&p.ctx.db, &p.actor, "nlp").await.unwrap();
    assert_eq!(team.status.usage[0].allocated, 8.0);

    p.advance(600);
    p.settle().await;
    let done = p.workload("nlp", "train").await;
    assert_eq!((done.status.phase, done.status.exit_code), (Phase::Succeeded, Some(0)));
    assert_eq!(p.events(&w).await, ["Created", "Admitted", "Running", "Succeeded"]);
    assert_eq!(p.jobs("sim-a").await.len(), 1);
}

/// Work dispatched since the scheduler's (or status sync's own) last read is followed by
/// status sync's very next pass, whatever it reads the workloads from (a kept world must be
/// caught up first).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn status_sync_follows_work_dispatched_since_the_last_read_of_the_world(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    p.submit("nlp", "train", 1, 8.0, json!({})).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(status_sync::reconcile(&p.ctx).await.unwrap().watched, 0, "only admitted so far");
    dispatcher::reconcile(&p.ctx).await.unwrap();
    assert!(matches!(p.phase("nlp", "train").await, Phase::Dispatched | Phase::Running));
    p.advance(600);
    let synced = status_sync::reconcile(&p.ctx).await.unwrap();
    assert_eq!((synced.watched, synced.finished), (1, 1));
    assert_eq!(p.phase("nlp", "train").await, Phase::Succeeded);
}

/// The change notifications tell a write of statuses alone (with the phases written) from
/// every other change, so the scheduler can sleep through a burst of dispatches.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_write_of_statuses_alone_notifies_the_phases_it_wrote(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let mut changes = berth_store::changes::ChangeFeed::listen(&p.ctx.db).await.unwrap();
    // A submission notifies from a transaction of its own, after it committed.
    p.submit("nlp", "train", 1, 8.0, json!({})).await;
    let created = tokio::time::timeout(std::time::Duration::from_secs(5), changes.next()).await;
    assert_eq!(created.expect("a submission notifies").unwrap(), berth_store::changes::Change::Submitted);
    scheduler::reconcile(&p.ctx).await.unwrap();
    dispatcher::reconcile(&p.ctx).await.unwrap();
    berth_app::workload::workload_delete(&p.ctx.db, &p.actor, "nlp", "train", None).await.unwrap();
    let mut seen = Vec::new();
    while let Ok(change) = tokio::time::timeout(std::time::Duration::from_secs(1), changes.next()).await {
        let payload = change.unwrap().payload().to_owned();
        if payload.starts_with("workloads") {
            seen.push(payload);
        }
    }
    // Admitted; dispatched to a sim cluster, whose jobs start at once; the deletion mark
    // (not a status write).
    assert_eq!(seen, ["workloads status:Admitted", "workloads status:Running", "workloads"]);

    // A burst of submissions: notified in fewer notifications, the last after every commit.
    let names: Vec<String> = (0..20).map(|i| format!("b{i}")).collect();
    futures_util::future::join_all(names.iter().map(|n| p.submit("nlp", n, 1, 1.0, json!({})))).await;
    let committed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workloads WHERE name LIKE 'b%'").fetch_one(&p.ctx.db).await.unwrap();
    assert_eq!(committed, 20);
    let mut notified = 0;
    while let Ok(change) = tokio::time::timeout(std::time::Duration::from_secs(1), changes.next()).await {
        assert_eq!(change.unwrap(), berth_store::changes::Change::Submitted);
        notified += 1;
    }
    assert!((1..=20).contains(&notified), "{notified} notifications for 20 submissions");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn borrowed_work_is_reclaimed_and_a_resumable_workload_is_requeued(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 8, None).await;
    p.team("b", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    let first = p.submit("b", "b1", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    let second = p.submit("b", "b2", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    assert_eq!(p.phase("b", "b1").await, Phase::Running);
    let borrowed = p.workload("b", "b2").await;
    assert_eq!(borrowed.status.phase, Phase::Running);
    assert!(borrowed.status.admission.as_ref().unwrap().borrowed);

    p.submit("a", "a1", 1, 8.0, json!({})).await;
    p.settle().await;
    // b2 is told to stop and gets its grace period; a1 waits for its GPUs.
    assert_eq!(p.phase("b", "b2").await, Phase::Preempting);
    let waiting = p.workload("a", "a1").await;
    assert_eq!(waiting.status.pending_reason.unwrap().code, "WaitingForReclaim");

    p.advance(30);
    p.settle().await;
    assert_eq!(p.phase("a", "a1").await, Phase::Running);
    assert_eq!(p.phase("b", "b1").await, Phase::Running, "only the borrowed workload is preempted");
    let requeued = p.workload("b", "b2").await;
    assert_eq!((requeued.status.phase, requeued.status.attempt), (Phase::Pending, 1));
    assert_eq!(requeued.status.submitted_at, second.status.submitted_at, "keeps its place in the queue");
    assert_eq!(p.events(&requeued).await, ["Created", "Admitted", "Running", "Preempted", "StopRequested", "Requeued"]);
    let cancelled: Vec<_> = p.jobs("sim-a").await.into_iter().filter(|j| j.state == JobState::Cancelled).collect();
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].key.workload, second.metadata.uid);
    let _ = first;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn higher_priority_work_preempts_lower_priority_work_of_the_same_team(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, Some(8)).await;
    p.cluster("sim-a", 1, json!({})).await;
    p.submit("nlp", "low", 1, 8.0, json!({"priority": 1})).await;
    p.settle().await;
    p.submit("nlp", "high", 1, 8.0, json!({"priority": 100})).await;
    p.settle().await;
    assert_eq!(p.phase("nlp", "low").await, Phase::Preempting);
    p.advance(30);
    p.settle().await;
    assert_eq!(p.phase("nlp", "high").await, Phase::Running);
    let low = p.workload("nlp", "low").await;
    assert_eq!((low.status.phase, low.status.reason.as_deref()), (Phase::Failed, Some("Preempted")), "not resumable");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_gang_that_fits_on_only_one_cluster_goes_there(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 32, None).await;
    p.cluster("small", 1, json!({})).await;
    p.cluster("big", 3, json!({})).await;
    p.submit("nlp", "gang", 3, 8.0, json!({})).await;
    p.settle().await;
    let w = p.workload("nlp", "gang").await;
    assert_eq!(w.status.phase, Phase::Running);
    assert_eq!(w.status.admission.unwrap().cluster, "big");
    assert!(p.jobs("small").await.is_empty());
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cordoned_cluster_receives_nothing(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    let spec = json!({"kind": "sim", "cordoned": true,
        "sim": {"node_groups": [{"name": "n", "count": 1, "flavor": "h100", "gpus_per_node": 8}]}});
    p.apply_cluster("sim-a", json!({"spec": spec})).await;
    p.submit("nlp", "train", 1, 1.0, json!({})).await;
    p.settle().await;
    let w = p.workload("nlp", "train").await;
    assert_eq!(w.status.phase, Phase::Pending);
    assert_eq!(w.status.pending_reason.unwrap().code, "ClustersCordoned");
    assert!(p.jobs("sim-a").await.is_empty());
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn deleting_a_running_workload_cancels_its_job_then_removes_it(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    let w = p.submit("nlp", "train", 1, 8.0, json!({})).await;
    p.settle().await;
    let actor = berth_app::context::OpContext::system("test");
    berth_app::workload::workload_delete(&p.ctx.db, &actor, "nlp", "train", None).await.unwrap();
    p.settle().await;
    let jobs = p.jobs("sim-a").await;
    assert!(jobs[0].cancelling && jobs[0].state == JobState::Running, "the job has its grace period");
    p.advance(30);
    p.settle().await;
    assert!(berth_app::workload::workload_get(&p.ctx.db, &p.actor, "nlp", "train").await.is_err(), "removed");
    assert_eq!(p.jobs("sim-a").await[0].state, JobState::Cancelled);
    let reasons = p.events(&w).await;
    assert_eq!(reasons.last().map(String::as_str), Some("Deleted"));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_refused_cancel_is_reported_in_the_controllers_status_and_asked_again(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    p.submit("nlp", "train", 1, 8.0, json!({})).await;
    p.settle().await;
    // The cluster answers, but refuses to cancel.
    p.cluster("sim-a", 1, json!({"refuse_cancels": true})).await;
    let actor = berth_app::context::OpContext::system("test");
    berth_app::workload::workload_delete(&p.ctx.db, &actor, "nlp", "train", None).await.unwrap();
    for _ in 0..2 {
        let status = deletion::reconcile(&p.ctx).await.unwrap();
        assert_eq!((status.cancel_errors, status.cancels_sent), (1, 0), "{status:?}");
        let error = status.error.clone().unwrap_or_default();
        assert!(error.contains("nlp/train") && error.contains("sim-a") && error.contains("refuse"), "{error}");
        assert!(status.deleting > 0, "it keeps the workload, and polls: {status:?}");
        assert!(!p.jobs("sim-a").await[0].cancelling, "nothing was cancelled");
    }
    assert!(berth_app::workload::workload_get(&p.ctx.db, &p.actor, "nlp", "train").await.is_ok(), "kept");
    // Once the cluster takes cancels again, the next pass cancels and the grace period runs.
    p.cluster("sim-a", 1, json!({})).await;
    let status = deletion::reconcile(&p.ctx).await.unwrap();
    assert_eq!((status.cancels_sent, status.cancel_errors, status.error), (1, 0, None));
    assert!(p.jobs("sim-a").await[0].cancelling);
    p.advance(30);
    p.settle().await;
    assert!(berth_app::workload::workload_get(&p.ctx.db, &p.actor, "nlp", "train").await.is_err(), "removed");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_unreachable_clusters_pending_work_moves_to_the_other_cluster(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 16, None).await;
    p.cluster("a", 1, json!({"node_groups": [{"name": "n", "count": 1, "flavor": "h100", "gpus_per_node": 8}]})).await;
    p.apply_cluster(
        "b",
        json!({"metadata": {"labels": {"tier": "spot"}}, "spec": {"kind": "sim",
        "sim": {"node_groups": [{"name": "n", "count": 1, "flavor": "h100", "gpus_per_node": 8}]}}}),
    )
    .await;
    p.step().await; // inventories
    // Admitted to a (reservation tier first), but a goes down before it is dispatched.
    p.submit("nlp", "train", 1, 8.0, json!({})).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(p.workload("nlp", "train").await.status.admission.unwrap().cluster, "a");
    p.cluster("a", 1, json!({"unreachable": true})).await;
    dispatcher::reconcile(&p.ctx).await.unwrap();
    assert_eq!(p.phase("nlp", "train").await, Phase::Admitted, "not dispatched to a cluster that does not answer");
    p.settle().await;
    let w = p.workload("nlp", "train").await;
    assert_eq!(w.status.phase, Phase::Running);
    assert_eq!((w.status.admission.unwrap().cluster.as_str(), w.status.attempt), ("b", 1));
    let a = berth_store::cluster::cluster_fetch(&p.ctx.db, "a").await.unwrap().unwrap();
    assert_eq!(a.status.health, berth_core::cluster::ClusterHealth::Unreachable);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_dispatcher_reads_what_was_admitted_since_and_looks_through_everything_when_a_cluster_changes(
    db: berth_store::PgPool,
) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 16, None).await;
    p.cluster("a", 1, json!({})).await;
    p.step().await; // inventories
    // a stops answering; its health is not marked yet, so the scheduler still admits to it.
    p.cluster("a", 1, json!({"unreachable": true})).await;
    assert!(dispatcher::reconcile(&p.ctx).await.unwrap().looked_through_all, "a cluster changed");
    p.submit("nlp", "train", 1, 8.0, json!({})).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    let pass = dispatcher::reconcile(&p.ctx).await.unwrap();
    assert_eq!((pass.looked_through_all, pass.deferred), (false, 1), "the admission, read from the change feed");
    // Nothing written since: the deferred workload waits for a look through everything.
    let pass = dispatcher::reconcile(&p.ctx).await.unwrap();
    assert_eq!((pass.looked_through_all, pass.deferred), (false, 0));
    assert_eq!(p.phase("nlp", "train").await, Phase::Admitted);
    // a answers again: the next pass looks through every admitted workload.
    p.cluster("a", 1, json!({})).await;
    let pass = dispatcher::reconcile(&p.ctx).await.unwrap();
    assert_eq!((pass.looked_through_all, pass.dispatched), (true, 1));
    assert_ne!(p.phase("nlp", "train").await, Phase::Admitted);
    // So does every pass once `resync` has passed since the last that did.
    let ctx = berth_controllers::Context {
        config: berth_controllers::Config { resync: std::time::Duration::ZERO, ..p.ctx.config.clone() },
        ..p.ctx.clone()
    };
    assert!(dispatcher::reconcile(&ctx).await.unwrap().looked_through_all);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn status_sync_forgets_running_work_removed_without_a_write_first(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 16, None).await;
    p.cluster("a", 1, json!({})).await;
    let w = p.submit("nlp", "train", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("nlp", "train").await, Phase::Running);
    // As a cascade from its team would: the row goes, leaving only its tombstone.
    sqlx::query("DELETE FROM workloads WHERE uid = $1").bind(w.metadata.uid).execute(&p.ctx.db).await.unwrap();
    p.assert_followed_is_current().await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn every_reconciler_changes_nothing_when_run_twice(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 8, None).await;
    p.team("b", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    for i in 0..3 {
        p.submit("b", &format!("b{i}"), 1, 8.0, json!({"resumable": true})).await;
    }
    p.settle().await;
    p.submit("a", "a1", 1, 8.0, json!({})).await;
    p.submit("a", "a2", 1, 4.0, json!({})).await;
    let actor = berth_app::context::OpContext::system("test");
    berth_app::workload::workload_delete(&p.ctx.db, &actor, "b", "b0", None).await.unwrap();
    // Each reconciler, on a state with work in every phase: the first run may act; the
    // second finds nothing to do and writes nothing.
    let c = &p.ctx;
    macro_rules! twice {
        ($m:ident) => {{
            $m::reconcile(c).await.unwrap();
            let before = p.fingerprint().await;
            let again = $m::reconcile(c).await.unwrap();
            assert_eq!(again.changes(), 0, "{} acted twice: {again:?}", stringify!($m));
            assert_eq!(p.fingerprint().await, before, "{} wrote on its second run", stringify!($m));
        }};
    }
    twice!(cluster_health);
    twice!(scheduler);
    twice!(dispatcher);
    twice!(status_sync);
    twice!(preemption);
    twice!(deletion);
    twice!(orphans);
}

/// The review found reasons, the queue, and preempted workloads' status and events naming
/// teams and workloads their reader may not read. Each path, read by a member of one team
/// while the other reclaims from it, now says *that* it happens, never *whose* work it is;
/// a platform admin still reads every name.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_reclaim_is_told_to_each_team_without_the_other_teams_names(db: berth_store::PgPool) {
    use berth_app::context::OpContext;
    use berth_core::auth::{Grant, Principal, Role};
    let p = Plane::new(db).await;
    p.team("alpha", None, 8, None).await;
    p.team("borrower", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("borrower", "keep", 1, 8.0, json!({})).await;
    p.settle().await;
    p.submit("borrower", "lent", 1, 8.0, json!({})).await;
    p.settle().await;
    p.submit("alpha", "reclaimer", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("borrower", "lent").await, Phase::Preempting);

    let db = &p.ctx.db;
    let member = async |team: &str| {
        let principal = Principal {
            subject: format!("member-of-{team}"),
            issuer: "berth".into(),
            service_account: None,
            service_account_uid: None,
            service_account_team: None,
            grants: vec![Grant { role: Role::Member, team: Some(team.into()) }],
            workload: None,
        };
        OpContext::for_request(db, principal, None, "berth").await.unwrap()
    };
    let (alpha, borrower) = (member("alpha").await, member("borrower").await);
    let page = berth_core::page::PageRequest::new(None, None).unwrap();
    let events_page = berth_core::page::PageRequest::new(None, None).unwrap();
    let text = |v: &dyn erased::Show| v.show();

    // What alpha reads of its waiting workload, in every place it shows.
    let waiting = berth_app::workload::workload_get(db, &alpha, "alpha", "reclaimer").await.unwrap();
    let queue = berth_app::workload::workload_queue(db, &alpha, None, 100).await.unwrap();
    let listed = berth_app::workload::workload_list(db, &alpha, None, Default::default(), &page).await.unwrap();
    let events = berth_app::history::workload_events(db, &alpha, "alpha", "reclaimer", &events_page).await.unwrap();
    for seen in [text(&waiting), text(&queue), text(&listed.items), text(&events.items)] {
        assert!(!seen.contains("borrower") && !seen.contains("lent"), "alpha read the other team's names: {seen}");
    }
    let reason = waiting.status.pending_reason.unwrap();
    assert_eq!(reason.code, "WaitingForReclaim");
    assert!(reason.message.contains("another team's workload"), "{}", reason.message);

    // What the borrower reads of its preempted workload.
    let lent = berth_app::workload::workload_get(db, &borrower, "borrower", "lent").await.unwrap();
    let events = berth_app::history::workload_events(db, &borrower, "borrower", "lent", &events_page).await.unwrap();
    for seen in [text(&lent), text(&events.items)] {
        assert!(!seen.contains("alpha") && !seen.contains("reclaimer"), "the borrower read alpha's names: {seen}");
    }
    assert!(lent.status.message.as_deref().unwrap().contains("another team reclaims its guarantee"), "{lent:?}");

    // The platform admin reads every name.
    let admin = p.workload("borrower", "lent").await;
    assert!(admin.status.message.as_deref().unwrap().contains("alpha/reclaimer"), "{admin:?}");
}

/// Serializes what a reader receives, to search it for names.
mod erased {
    pub trait Show {
        fn show(&self) -> String;
    }
    impl<T: serde::Serialize> Show for T {
        fn show(&self) -> String {
            serde_json::to_string(self).unwrap()
        }
    }
}

/// The review's department whose limit equals its guarantee: a child within its own
/// guarantee reclaims its sibling's borrowed work and runs once the grace period is over,
/// through the real store, scheduler and controllers.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_department_at_its_limit_reclaims_for_a_child_within_its_guarantee(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("mini", None, 8, Some(8)).await;
    p.team("ma", Some("mini"), 4, None).await;
    p.team("mb", Some("mini"), 4, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    for i in 0..8 {
        p.submit("mb", &format!("mb{i}"), 1, 1.0, json!({})).await;
    }
    p.settle().await;
    for i in 0..8 {
        assert_eq!(p.phase("mb", &format!("mb{i}")).await, Phase::Running);
    }
    // The department reports what its subtree holds (the review saw 0, "under by 8").
    let mini = berth_app::team::team_get(&p.ctx.db, &p.actor, "mini").await.unwrap();
    let usage = &mini.status.usage[0];
    assert_eq!((usage.allocated, usage.subtree_allocated, usage.subtree_borrowed), (0.0, 8.0, 0.0), "{usage:?}");
    let mb = berth_app::team::team_get(&p.ctx.db, &p.actor, "mb").await.unwrap();
    let usage = &mb.status.usage[0];
    assert_eq!((usage.allocated, usage.borrowed, usage.subtree_allocated), (8.0, 4.0, 8.0), "{usage:?}");
    p.submit("ma", "ma1", 1, 4.0, json!({})).await;
    p.settle().await;
    p.advance(30);
    p.settle().await;
    assert_eq!(p.phase("ma", "ma1").await, Phase::Running);
    let mut running = 0;
    for i in 0..8 {
        running += usize::from(p.phase("mb", &format!("mb{i}")).await == Phase::Running);
    }
    assert_eq!(running, 4, "mb keeps its own guarantee");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_guarantee_moved_between_teams_is_reclaimed_from_work_admitted_in_the_old_one(db: berth_store::PgPool) {
    // Found from outside: vision's guarantee given to speech (8 → 0, 8 → 16) while vision's
    // v1 ran in it; speech's second job, within its new guarantee, waited "no cluster has
    // room" until v1 ended, because v1 kept the in-quota of its admission.
    let p = Plane::new(db).await;
    p.team("vision", None, 8, None).await;
    p.team("speech", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("vision", "v1", 1, 8.0, json!({"resumable": true})).await;
    p.submit("speech", "s1", 1, 8.0, json!({})).await;
    p.settle().await;
    assert!(!p.workload("vision", "v1").await.status.admission.unwrap().borrowed);
    p.team("vision", None, 0, None).await;
    p.team("speech", None, 16, None).await;
    p.submit("speech", "s2", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("vision", "v1").await, Phase::Preempting, "v1 is beyond vision's guarantee now");
    p.advance(30);
    p.settle().await;
    assert_eq!(p.phase("speech", "s2").await, Phase::Running);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_child_team_takes_its_guarantee_back_from_its_departments_own_work(db: berth_store::PgPool) {
    // Found from outside (limits equal to guarantees): department d (16, may hold 16) ran
    // 16 GPUs of its own; its child c, guaranteed the same 16, then waited with nothing,
    // since d's work counted in-quota. d's own guarantee is what c's leaves: none.
    let p = Plane::new(db).await;
    p.team("d", None, 16, Some(16)).await;
    p.team("c", Some("d"), 16, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("d", "d1", 1, 8.0, json!({"resumable": true})).await;
    p.submit("d", "d2", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    for name in ["d1", "d2"] {
        let w = p.workload("d", name).await;
        assert_eq!(w.status.phase, Phase::Running, "{name}");
        assert!(w.status.admission.unwrap().borrowed, "{name} is beyond d's own guarantee");
    }
    // d's status says so too (it said 0 borrowed: 16 held of 16 guaranteed).
    let d = berth_app::team::team_get(&p.ctx.db, &p.actor, "d").await.unwrap();
    let usage = &d.status.usage[0];
    assert_eq!((usage.allocated, usage.borrowed, usage.subtree_borrowed), (16.0, 16.0, 0.0), "{usage:?}");
    p.submit("c", "c1", 1, 8.0, json!({})).await;
    p.settle().await;
    let preempting = [p.phase("d", "d1").await, p.phase("d", "d2").await];
    assert_eq!(preempting.iter().filter(|&&ph| ph == Phase::Preempting).count(), 1, "{preempting:?}");
    p.advance(30);
    p.settle().await;
    let c1 = p.workload("c", "c1").await;
    assert_eq!(c1.status.phase, Phase::Running);
    assert!(!c1.status.admission.unwrap().borrowed);
}

/// Found from outside: a department's own job beyond its own guarantee waited with "no
/// cluster has room" alone, though a smaller one would have taken its GPUs back. Its
/// reason now says it would borrow, what the department's own work uses of its own
/// guarantee, and that borrowed work preempts no other team's work; a job within that
/// guarantee does reclaim.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_job_that_would_borrow_says_so_where_no_cluster_has_room(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("research", None, 16, None).await;
    p.team("nlp", Some("research"), 8, None).await;
    p.team("x", None, 0, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("x", "x1", 1, 8.0, json!({"resumable": true})).await;
    p.submit("x", "x2", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    p.submit("research", "big", 2, 6.0, json!({})).await;
    p.settle().await;
    let big = p.workload("research", "big").await;
    assert_eq!(big.status.phase, Phase::Pending);
    let reason = big.status.pending_reason.unwrap();
    assert_eq!(reason.code, "NoClusterFits");
    assert!(
        reason.message.ends_with(
            ". In h100 it would borrow: team research's own work (its guarantee less its teams') uses 0 of 8 \
             guaranteed GPUs and this asks 12; borrowed work starts only where GPUs are free and is no reason to \
             preempt another team's work (work within the guarantee is)"
        ),
        "{}",
        reason.message
    );
    let borrowing = &reason.details.unwrap()["attempts"][0]["borrowing"];
    assert_eq!(borrowing["team"], "research");
    assert_eq!((borrowing["used"].as_f64(), borrowing["own_guarantee"].as_f64()), (Some(0.0), Some(8.0)));
    assert_eq!((p.phase("x", "x1").await, p.phase("x", "x2").await), (Phase::Running, Phase::Running));
    // A team above its fair share, guaranteed nothing, is told the same (found from
    // outside: only teams below their share were).
    p.submit("x", "x3", 1, 8.0, json!({})).await;
    p.settle().await;
    let x3 = p.workload("x", "x3").await.status.pending_reason.unwrap();
    assert!(
        x3.message.contains(". In h100 it would borrow: team x uses 16 of 0 guaranteed GPUs and this asks 8;"),
        "{}",
        x3.message
    );
    // Within its own guarantee, it takes one of x's jobs back.
    p.submit("research", "small", 1, 8.0, json!({})).await;
    p.settle().await;
    let preempting = [p.phase("x", "x1").await, p.phase("x", "x2").await];
    assert_eq!(preempting.iter().filter(|&&ph| ph == Phase::Preempting).count(), 1, "{preempting:?}");
    let small = p.workload("research", "small").await.status.pending_reason.unwrap();
    assert!(!small.message.contains("it would borrow"), "{}", small.message);
}

/// b2 borrows, a1 reclaims it: b2 is `Preempting` with its cancel sent when its cluster
/// stops answering. Returns the plane with a1 waiting.
async fn preempting_when_the_cluster_goes_down(p: &Plane) {
    p.team("a", None, 8, None).await;
    p.team("b", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("b", "b1", 1, 8.0, json!({"resumable": true})).await;
    p.submit("b", "b2", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    assert!(p.workload("b", "b2").await.status.admission.unwrap().borrowed);
    p.submit("a", "a1", 1, 8.0, json!({})).await;
    p.settle().await;
    let b2 = p.workload("b", "b2").await;
    assert_eq!(b2.status.phase, Phase::Preempting);
    assert!(b2.status.cancel_requested_at.is_some());
    p.cluster("sim-a", 2, json!({"unreachable": true})).await;
    for _ in 0..3 {
        p.step().await;
    }
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_preempted_workload_whose_cluster_goes_down_is_still_requeued_when_it_answers_again(db: berth_store::PgPool) {
    // The fault-injection finding: b2 went Preempting → Unknown during the outage, and once
    // the cluster answered, its job (cancelled by Berth) read as cancelled outside Berth:
    // Failed, CancelledOnBackend.
    let mut p = Plane::new(db).await;
    p.ctx.config.unknown_timeout = std::time::Duration::from_secs(3600);
    preempting_when_the_cluster_goes_down(&p).await;
    let b2 = p.workload("b", "b2").await;
    assert_eq!(b2.status.phase, Phase::Preempting, "its preemption goes on through the outage");
    assert!(b2.status.unknown_since.is_some());
    assert_eq!(p.phase("a", "a1").await, Phase::Pending, "b2 may still run: its GPUs stay held");
    // The grace period ends during the outage; then the cluster answers again.
    p.advance(30);
    p.step().await;
    p.cluster("sim-a", 2, json!({})).await;
    p.settle().await;
    let b2 = p.workload("b", "b2").await;
    assert_eq!(
        (b2.status.phase, b2.status.attempt, b2.status.reason.as_deref()),
        (Phase::Pending, 1, Some("Preempted"))
    );
    assert_eq!(p.phase("a", "a1").await, Phase::Running);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_preempted_workload_whose_cluster_stays_down_ends_as_the_preemption_would(db: berth_store::PgPool) {
    // unknown_timeout is zero here: the preemption ends at the next pass after the cluster
    // was found unreachable, requeued (b2 is resumable), never CancelledOnBackend.
    let p = Plane::new(db).await;
    preempting_when_the_cluster_goes_down(&p).await;
    let b2 = p.workload("b", "b2").await;
    assert_eq!(
        (b2.status.phase, b2.status.attempt, b2.status.reason.as_deref()),
        (Phase::Pending, 1, Some("Preempted"))
    );
    assert!(b2.status.message.unwrap().contains("stayed unreachable"));
}

/// A leader ("old") that holds the lease on a connection of its own and has a fenced
/// transaction open, and a connection for another replica.
struct OldLeader {
    p: Plane,
    epoch: i64,
    ctx: berth_controllers::Context,
    conn: sqlx::PgConnection,
    tx: berth_store::Tx<'static>,
    new_conn: sqlx::PgConnection,
}

impl OldLeader {
    async fn writing(db: berth_store::PgPool) -> Self {
        use sqlx::ConnectOptions;
        let options = db.connect_options();
        let p = Plane::new(db).await;
        let mut conn = options.connect().await.unwrap();
        let epoch = berth_store::controller::leader_take(&mut conn, "old", chrono::Utc::now()).await.unwrap();
        let ctx = berth_controllers::Context { epoch: Some(epoch), ..p.ctx.clone() };
        let tx = ctx.begin().await.expect("the leader writes");
        let new_conn = options.connect().await.unwrap();
        Self { p, epoch, ctx, conn, tx, new_conn }
    }
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_leader_paused_inside_a_transaction_does_not_hold_the_lease_forever(db: berth_store::PgPool) {
    // Found from outside (kill -STOP of the leader, 3 times in 14): a leader paused inside
    // a fenced transaction held the lease row's lock; the standby had the lock 15 s later
    // but waited for the lease until the paused process was resumed (60 s and more), and
    // no controller ran anywhere. The standby now ends such a transaction after PATIENCE.
    // The paused leader's transaction: fenced, then nothing more.
    let OldLeader { p, epoch: old_epoch, conn: _held, tx: paused, mut new_conn, .. } = OldLeader::writing(db).await;
    let started = std::time::Instant::now();
    let patience = std::time::Duration::from_millis(500);
    let taking = berth_controllers::leader::take_lease(&p.ctx.db, &mut new_conn, "new", chrono::Utc::now(), patience);
    let epoch = tokio::time::timeout(std::time::Duration::from_secs(30), taking)
        .await
        .expect("the lease is taken while the old leader stays paused")
        .unwrap();
    assert_eq!(epoch, old_epoch + 1);
    assert!(started.elapsed() >= patience, "the old leader's transaction had its chance");
    // Resumed, the old leader's write does not land.
    assert!(berth_store::commit(paused).await.is_err(), "a deposed leader's transaction committed");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_deposed_leaders_writes_fail_and_a_new_leader_waits_for_those_in_flight(db: berth_store::PgPool) {
    // The fault-injection finding: when the leader's lock connection was killed, a standby
    // took over while the old leader's controllers still wrote for up to 0.8 s. Now a new
    // leader's epoch waits for the writes fenced with the old one, and later ones fail.
    use berth_store::controller::{leader_renew, leader_take};
    let OldLeader { p, epoch: old_epoch, ctx: old, conn: mut old_conn, tx: in_flight, mut new_conn } =
        OldLeader::writing(db).await;

    let taker: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut new_conn).await.unwrap();
    let taking = tokio::spawn(async move {
        let epoch = leader_take(&mut new_conn, "new", chrono::Utc::now()).await.unwrap();
        (epoch, new_conn)
    });
    // The taker's session is seen waiting for the lease row's lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: Option<String> = sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
            .bind(taker)
            .fetch_one(&p.ctx.db)
            .await
            .unwrap();
        if waiting.as_deref() == Some("Lock") {
            break;
        }
        assert!(!taking.is_finished(), "the lease was taken while a write of the old epoch was in flight");
        assert!(std::time::Instant::now() < deadline, "the taker never waited for the lock: {waiting:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!taking.is_finished(), "the lease is not taken while a write of the old epoch is in flight");
    berth_store::commit(in_flight).await.expect("the write in flight lands");
    let (new_epoch, _new_conn) = taking.await.unwrap();
    assert_eq!(new_epoch, old_epoch + 1);

    let Err(e) = old.begin().await else { panic!("a deposed leader's write began") };
    assert!(matches!(e, berth_core::Error::Unavailable(ref m) if m.contains("deposed")), "{e}");
    assert!(!leader_renew(&mut old_conn, old_epoch).await.unwrap(), "the old lease cannot be renewed");
    let new = berth_controllers::Context { epoch: Some(new_epoch), ..p.ctx.clone() };
    // A whole pass of the new leader's controllers writes.
    p.team("a", None, 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    cluster_health::reconcile(&new).await.unwrap();
    age_last_sync(&p, 3600).await;
    assert!(cluster_health::reconcile(&old).await.is_err(), "the old leader's status write fails");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_leader_that_stops_without_closing_its_connection_loses_the_lock(db: berth_store::PgPool) {
    // Found from outside: a leader stopped with SIGSTOP kept its connection, and with it
    // the lock, for 65 s and more while a standby tried every second. A lock session that
    // sends nothing for its time is ended by Postgres, which frees the lock.
    use berth_store::controller::leader_try_lock;
    use sqlx::ConnectOptions;
    let options = db.connect_options();
    let silent = std::time::Duration::from_secs(1);
    let mut stopped = options.connect().await.unwrap();
    let mut standby = options.connect().await.unwrap();
    assert!(leader_try_lock(&mut stopped, silent).await.unwrap());
    assert!(!leader_try_lock(&mut standby, silent).await.unwrap(), "held while its session lives");
    // The standby retries every second, as leader::run does; the stopped leader sends nothing.
    let mut tries = 0;
    while !leader_try_lock(&mut standby, silent).await.unwrap() {
        tries += 1;
        assert!(tries < 10, "the lock was never freed");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let ended = sqlx::query("SELECT 1").execute(&mut stopped).await;
    assert!(ended.is_err(), "the stopped leader's session was ended");
}

/// Makes every cluster's stored `last_sync` `seconds` old.
async fn age_last_sync(p: &Plane, seconds: i32) {
    sqlx::query(
        "UPDATE clusters SET status = jsonb_set(status, '{last_sync}', to_jsonb(now() - make_interval(secs => $1)))",
    )
    .bind(f64::from(seconds))
    .execute(&p.ctx.db)
    .await
    .unwrap();
}

/// An idle site wrote each cluster's status at every health refresh (every 2 s) only to move
/// `last_sync`, and each write woke the scheduler for a whole cycle. Now a refresh that finds
/// the cluster as it was writes once a minute; any other change is written at once.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_health_refresh_that_finds_nothing_new_writes_once_a_minute(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.cluster("sim-a", 1, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let version = || async {
        let c = berth_store::cluster::cluster_fetch(&p.ctx.db, "sim-a").await.unwrap().unwrap();
        (c.metadata.resource_version, c.status)
    };
    let (first, status) = version().await;
    assert_eq!(status.health, berth_core::cluster::ClusterHealth::Healthy);
    cluster_health::reconcile(&p.ctx).await.unwrap();
    assert_eq!(version().await.0, first, "a refresh seconds later that finds nothing new writes nothing");

    age_last_sync(&p, 59).await;
    let (aged, _) = version().await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    assert_eq!(version().await.0, aged, "59 s is not yet a minute");

    age_last_sync(&p, 61).await;
    let (stale, before) = version().await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let (after, status) = version().await;
    assert_ne!(after, stale, "a minute on, the refresh is stored");
    assert!(status.last_sync > before.last_sync, "{:?} then {:?}", before.last_sync, status.last_sync);

    // A failed refresh is written at once, seconds after the last.
    p.cluster("sim-a", 1, json!({"unreachable": true})).await;
    let (outage, _) = version().await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let (failed, status) = version().await;
    assert_ne!(failed, outage);
    assert_eq!(status.consecutive_failures, 1);
}

/// The overcommit a review found: a running 8-GPU workload was shrunk to 2 by a PUT, Berth
/// then counted 2 while the job held 8, and admitted new work onto the full node. The
/// shrink is refused now, so the new work waits and no second job reaches the cluster.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_running_workload_cannot_be_shrunk_so_nothing_is_admitted_onto_its_full_node(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("nlp", None, 16, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    p.submit("nlp", "big", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("nlp", "big").await, Phase::Running);

    let shrunk = serde_json::from_value(json!({"spec": {"kind": "training",
        "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 2}}, "sim": {"duration_seconds": 600}}}))
    .unwrap();
    let refused = berth_app::workload::workload_apply(&p.ctx.db, &p.actor, "nlp", "big", &shrunk, None).await;
    let Err(berth_core::Error::Invalid(errors)) = refused else { panic!("the shrink must be refused: {refused:?}") };
    assert_eq!(errors[0].field, "/spec/tasks/resources/gpus");

    p.submit("nlp", "small", 1, 6.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("nlp", "small").await, Phase::Pending);
    assert_eq!(p.workload("nlp", "big").await.spec.tasks.resources.gpus, 8.0);
    assert_eq!(p.jobs("sim-a").await.len(), 1, "only the big workload's job");
}

/// Pending work gets an estimated start from the running work's `max_runtime_seconds` and
/// the queue ahead of it; in a simulated run whose runtimes are known, the estimates made
/// at submission are compared with the actual starts (the distribution is printed).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn estimated_starts_match_the_actual_starts_when_runtimes_are_known(db: berth_store::PgPool) {
    const STEP: i64 = 5;
    let p = Plane::new(db).await;
    p.team("a", None, 16, None).await;
    p.cluster("c", 2, json!({})).await;
    // 14 workloads of 4, 8 or 16 GPUs running 5 to 20 minutes, each limited to its runtime
    // (a job that reaches its limit exactly still succeeds).
    let shapes = [(1, 8.0), (1, 4.0), (2, 8.0), (1, 8.0), (1, 4.0), (1, 4.0), (1, 8.0)];
    let mut names = Vec::new();
    for i in 0..14 {
        let (count, gpus) = shapes[i % shapes.len()];
        let minutes = [5, 10, 15, 20][i % 4] as u64;
        let name = format!("w{i}");
        let extra = json!({"sim": {"duration_seconds": minutes * 60}, "max_runtime_seconds": minutes * 60});
        p.submit("a", &name, count, gpus, extra).await;
        names.push(name);
    }
    p.step().await;
    berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    let mut estimated = std::collections::HashMap::new();
    for name in &names {
        let w = p.workload("a", name).await;
        if w.status.phase == Phase::Pending {
            let e =
                w.status.estimated_start.clone().unwrap_or_else(|| panic!("{name} has no estimate: {:?}", w.status));
            assert!(e.basis.contains("max_runtime_seconds"), "{}", e.basis);
            estimated.insert(name.clone(), e.at);
        } else {
            assert!(w.status.estimated_start.is_none(), "{name} is {:?}: no estimate", w.status.phase);
        }
    }
    assert!(estimated.len() >= 8, "most of them wait: {estimated:?}");
    for _ in 0..1500 {
        // Ends seen, then admissions and dispatches, in one step: a start lags the end
        // that allows it by less than a step.
        p.advance(STEP);
        status_sync::reconcile(&p.ctx).await.unwrap();
        scheduler::reconcile(&p.ctx).await.unwrap();
        dispatcher::reconcile(&p.ctx).await.unwrap();
        status_sync::reconcile(&p.ctx).await.unwrap();
        let mut started = true;
        for name in estimated.keys() {
            started &= p.workload("a", name).await.status.started_at.is_some();
        }
        if started {
            break;
        }
    }
    let mut errors = Vec::new();
    for (name, at) in &estimated {
        let started = p.workload("a", name).await.status.started_at.unwrap_or_else(|| panic!("{name} never started"));
        errors.push((started - *at).num_seconds());
    }
    errors.sort_unstable();
    let q = |f: f64| errors[((errors.len() - 1) as f64 * f).round() as usize];
    println!(
        "estimated_start error (actual − estimate, s) over {} workloads: min {} p50 {} p90 {} max {} (controllers step every {STEP} s)",
        errors.len(),
        errors[0],
        q(0.5),
        q(0.9),
        errors[errors.len() - 1]
    );
    // Each job of a chain starts up to a step after the end that allows it: a chain of
    // four starts up to four steps late.
    assert!(errors.iter().all(|e| (-2..=4 * STEP + 2).contains(e)), "{errors:?}");
}

/// A simulated cluster whose clock runs 60 times faster ends a job at its one-hour limit
/// after a minute: the estimate of the work waiting for it says so (it said an hour), and
/// the work starts then.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn estimates_count_a_simulated_cluster_s_time(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 16, None).await;
    p.cluster("fast", 1, json!({"time_scale": 60})).await;
    p.submit("a", "limited", 1, 8.0, json!({"sim": {"duration_seconds": 7200}, "max_runtime_seconds": 3600})).await;
    p.step().await;
    p.submit("a", "next", 1, 8.0, json!({"max_runtime_seconds": 600})).await;
    p.step().await;
    berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    let started = p.workload("a", "limited").await.status.started_at.expect("limited runs");
    let e = p.workload("a", "next").await.status.estimated_start.expect("an estimate");
    let expected = started + chrono::TimeDelta::seconds(60);
    assert!((e.at - expected).num_seconds().abs() <= 1, "{} vs {expected}", e.at);
    for _ in 0..13 {
        p.advance(5);
        p.step().await;
    }
    let next = p.workload("a", "next").await;
    let actual = next.status.started_at.unwrap_or_else(|| panic!("next waits still: {:?}", next.status));
    assert!((actual - e.at).num_seconds().abs() <= 5, "started {actual}, estimated {}", e.at);
}

/// A workload waiting for work without a runtime limit has no estimate; one waiting for
/// work with a limit has one, when that limit is reached. A running workload's limit cannot
/// change: its job keeps the one it was submitted with.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn work_that_waits_for_unlimited_work_has_no_estimate(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 16, None).await;
    p.cluster("c", 2, json!({})).await;
    p.submit("a", "forever", 1, 8.0, json!({})).await;
    p.submit("a", "limited", 1, 8.0, json!({"max_runtime_seconds": 3600})).await;
    p.step().await;
    // next takes the node limited frees; wide needs forever's too.
    p.submit("a", "next", 1, 8.0, json!({"max_runtime_seconds": 600})).await;
    p.submit("a", "wide", 2, 8.0, json!({"max_runtime_seconds": 600})).await;
    p.step().await;
    let status = berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    assert_eq!((status.pending, status.estimated), (2, 1));
    assert!(p.workload("a", "wide").await.status.estimated_start.is_none());
    let limited = p.workload("a", "limited").await;
    let e = p.workload("a", "next").await.status.estimated_start.expect("an estimate");
    let expected = limited.status.started_at.unwrap() + chrono::TimeDelta::seconds(3600);
    assert!((e.at - expected).num_seconds().abs() <= 1, "{} vs {expected}", e.at);
    assert!(e.basis.starts_with("when a/limited reaches its max_runtime_seconds"), "{}", e.basis);
    let input = serde_json::from_value(json!({"spec": {"kind": "training",
        "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 8.0}},
        "sim": {"duration_seconds": 600}, "max_runtime_seconds": 7200}}))
    .unwrap();
    let refused = berth_app::workload::workload_apply(&p.ctx.db, &p.actor, "a", "limited", &input, None).await;
    let Err(berth_core::Error::Invalid(errors)) = refused else { panic!("{refused:?}") };
    assert_eq!(errors[0].field, "/spec/max_runtime_seconds");
    // Cancelled, next waits no more: it has no estimate.
    let next = berth_app::workload::workload_cancel(&p.ctx.db, &p.actor, "a", "next", None).await.unwrap();
    assert_eq!(next.status.phase, Phase::Cancelled);
    assert!(next.status.estimated_start.is_none(), "{:?}", next.status);
}

/// Work that reaches its `max_runtime_seconds` ends Failed with a reason of its own
/// (Slurm's TIMEOUT), not as a job that failed; work that ends in time succeeds.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn work_past_its_time_limit_ends_with_time_limit_reached(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 16, None).await;
    p.cluster("c", 2, json!({})).await;
    p.submit("a", "long", 1, 8.0, json!({"sim": {"duration_seconds": 3600}, "max_runtime_seconds": 600})).await;
    p.submit("a", "short", 1, 8.0, json!({"sim": {"duration_seconds": 300}, "max_runtime_seconds": 600})).await;
    p.settle().await;
    assert_eq!(p.phase("a", "long").await, Phase::Running);
    p.advance(601);
    p.settle().await;
    let long = p.workload("a", "long").await;
    assert_eq!(long.status.phase, Phase::Failed);
    assert_eq!(long.status.reason.as_deref(), Some("TimeLimitReached"), "{:?}", long.status);
    assert!(long.status.message.as_deref().unwrap().contains("max_runtime_seconds"), "{:?}", long.status.message);
    let short = p.workload("a", "short").await;
    assert_eq!((short.status.phase, short.status.reason.as_deref()), (Phase::Succeeded, Some("Completed")));
}

/// Every attempt that held GPUs leaves one ledger record with the facts of its run: a
/// preempted and requeued workload has two, whose GPU time is its two runs; the records
/// outlive their workloads and team.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn each_attempt_leaves_one_ledger_record_that_outlives_its_team(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    let priced = serde_json::from_value(json!({"spec": {"price": {"per_gpu_hour": 3.0}}})).unwrap();
    berth_app::flavor::flavor_apply(&p.ctx.db, &p.actor, "h100", &priced, None).await.unwrap();
    p.team("a", None, 8, None).await;
    p.team("b", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("b", "b1", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    p.submit("b", "b2", 1, 8.0, json!({"resumable": true})).await;
    p.settle().await;
    p.submit("a", "a1", 1, 8.0, json!({})).await;
    p.settle().await;
    // b2's grace period (30 s), then everyone's 600 s, then b2's second run.
    p.advance(30);
    p.settle().await;
    p.advance(600);
    p.settle().await;
    p.advance(600);
    p.settle().await;
    assert_eq!(p.phase("b", "b2").await, Phase::Succeeded);
    let ledger = |db: &berth_store::PgPool| {
        let db = db.clone();
        async move {
            sqlx::query_as::<_, (String, i32, String, Vec<String>, String, String, f64, bool, f64)>(
                "SELECT workload, attempt, outcome, teams, cluster, backend, gpus, borrowed,
                        extract(epoch FROM ended_at - started_at)::float8
                 FROM usage_ledger ORDER BY workload, attempt",
            )
            .fetch_all(&db)
            .await
            .unwrap()
        }
    };
    let records = ledger(&p.ctx.db).await;
    let brief: Vec<(&str, i32, &str, f64)> = records.iter().map(|r| (r.0.as_str(), r.1, r.2.as_str(), r.8)).collect();
    assert_eq!(
        brief,
        [
            ("a1", 0, "succeeded", 600.0),
            ("b1", 0, "succeeded", 600.0),
            ("b2", 0, "preempted", 30.0),
            ("b2", 1, "succeeded", 600.0)
        ]
    );
    assert!(records.iter().all(|r| r.4 == "sim-a" && r.5 == "sim" && r.6 == 8.0), "{records:?}");
    assert!(records[2].7, "b2's first run was on borrowed quota");
    // Another pass writes nothing twice.
    p.settle().await;
    assert_eq!(ledger(&p.ctx.db).await.len(), 4);
    // The workloads and their team go; their records stay, named as they were.
    for name in ["b1", "b2"] {
        berth_app::workload::workload_delete(&p.ctx.db, &p.actor, "b", name, None).await.unwrap();
    }
    berth_app::team::team_delete(&p.ctx.db, &p.actor, "b", None).await.unwrap();
    let kept = ledger(&p.ctx.db).await;
    assert_eq!(kept.len(), 4);
    assert_eq!(kept[1].3, ["b"]);
    // And so does the report: b's 8 GPUs for 600 + 30 + 600 s, of which the 30 s borrowed.
    let now = p.ctx.clock.now();
    let req =
        ReportRequest { from: now - chrono::TimeDelta::days(1), to: now, group_by: vec![GroupBy::Team], bucket: None };
    let report = berth_app::accounting::usage_report(&p.ctx.db, &p.actor, &req, now).await.unwrap();
    let b = report.rows.iter().find(|r| r.team.as_deref() == Some("b")).expect("b's row");
    assert!((b.gpu_hours - 8.0 * 1230.0 / 3600.0).abs() < 1e-9, "{b:?}");
    assert!((b.borrowed_gpu_hours - 8.0 * 30.0 / 3600.0).abs() < 1e-9, "{b:?}");
    assert!((b.cost - 3.0 * b.gpu_hours).abs() < 1e-9, "each attempt kept the flavor's price: {b:?}");
    let totals = report.teams.iter().find(|t| t.team == "b").expect("b's totals");
    assert_eq!(totals.subtree, totals.own);
    assert!((report.totals.gpu_hours - 8.0 * 1830.0 / 3600.0).abs() < 1e-9, "{:?}", report.totals);
}

/// A team that moves in the tree takes its running work with it, but not the hours that work
/// used before: the ledger is cut at the move. t runs 8 GPUs under d1 for an hour, moves to
/// d2, and runs 600 s more: an hour before the move reads the same, under d1, while t runs
/// and after it ended (before, the one record written at the end put the whole run under
/// d2, and d1's subtree lost it), and the two parts add up to the whole run.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_team_that_moves_leaves_the_hours_before_the_move_with_its_old_parent(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("d1", None, 8, None).await;
    p.team("d2", None, 8, None).await;
    p.team("t", Some("d1"), 8, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    p.submit("t", "run", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("t", "run").await, Phase::Running);
    // As if it had run an hour (the simulated clock cannot run behind the wall clock the
    // move is made at).
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "UPDATE workloads SET status = jsonb_set(status, '{started_at}',
             to_jsonb(to_char(((status->>'started_at')::timestamptz - interval '1 hour') AT TIME ZONE 'UTC',
                              'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')))
         WHERE name = 'run' RETURNING (status->>'started_at')::timestamptz",
    )
    .fetch_one(&p.ctx.db)
    .await
    .unwrap();
    let before_move = |p: &Plane| {
        let (db, actor) = (p.ctx.db.clone(), p.actor.clone());
        async move {
            let (from, to) = (started - chrono::TimeDelta::hours(1), started + chrono::TimeDelta::minutes(30));
            let req = ReportRequest { from, to, group_by: vec![GroupBy::Team], bucket: None };
            let report = berth_app::accounting::usage_report(&db, &actor, &req, chrono::Utc::now()).await.unwrap();
            let subtree =
                |team: &str| report.teams.iter().find(|t| t.team == team).map_or(0.0, |t| t.subtree.gpu_hours);
            (subtree("d1"), subtree("d2"))
        }
    };
    assert_eq!(before_move(&p).await, (4.0, 0.0), "30 minutes of 8 GPUs under d1");
    p.team("t", Some("d2"), 8, None).await;
    assert_eq!(before_move(&p).await, (4.0, 0.0), "while t runs under d2");
    p.advance(600);
    p.settle().await;
    assert_eq!(p.phase("t", "run").await, Phase::Succeeded);
    assert_eq!(before_move(&p).await, (4.0, 0.0), "once the run has ended");
    let parts: Vec<(i32, String, Vec<String>, f64)> = sqlx::query_as(
        "SELECT part, outcome, teams, extract(epoch FROM ended_at - started_at)::float8
         FROM usage_ledger ORDER BY part",
    )
    .fetch_all(&p.ctx.db)
    .await
    .unwrap();
    let brief: Vec<(i32, &str, Vec<String>)> = parts.iter().map(|r| (r.0, r.1.as_str(), r.2.clone())).collect();
    assert_eq!(brief, [(0, "moved", vec!["t".into(), "d1".into()]), (1, "succeeded", vec!["t".into(), "d2".into()])]);
    assert!(parts[0].3 >= 3600.0, "{parts:?}");
    assert!((parts[0].3 + parts[1].3 - 4200.0).abs() < 1e-6, "the parts add up to the whole run: {parts:?}");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger_open_parts").fetch_one(&p.ctx.db).await.unwrap();
    assert_eq!(open, 0, "the ended attempt has no open part left");
    // Another pass writes nothing twice.
    p.settle().await;
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_ledger").fetch_one(&p.ctx.db).await.unwrap();
    assert_eq!(records, 2);
}

/// A budget of `stop_borrowing` stops a team borrowing once it is used up, with the pending
/// reason naming it and when it resets; what runs keeps running; the next period lets
/// borrowing resume.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_used_up_budget_stops_borrowing_until_its_period_resets(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("b", None, 8, None).await;
    let input = serde_json::from_value(json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 8}],
        "budgets": [{"gpu_hours": 1, "period": "week", "action": "stop_borrowing"}]}}))
    .unwrap();
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "a", &input, None).await.unwrap();
    p.cluster("sim-a", 3, json!({})).await;
    let long = json!({"sim": {"duration_seconds": 30 * 86_400}});
    p.submit("a", "in-quota", 1, 8.0, long.clone()).await;
    p.submit("a", "borrower", 1, 8.0, long.clone()).await;
    p.settle().await;
    assert!(p.workload("a", "borrower").await.status.admission.unwrap().borrowed);
    // 16 GPUs for 15 minutes: 4 GPU-hours of a budget of 1.
    p.advance(900);
    p.settle().await;
    let team = berth_app::team::team_get(&p.ctx.db, &p.actor, "a").await.unwrap();
    let budget = &team.status.budgets[0];
    assert_eq!(budget.state, berth_core::usage::BudgetState::Exhausted, "{budget:?}");
    assert!((budget.used_gpu_hours - 4.0).abs() < 0.01, "{budget:?}");
    let page = berth_core::page::PageRequest::new(None, None).unwrap();
    let events = berth_app::history::team_events(&p.ctx.db, &p.actor, "a", &page).await.unwrap();
    let reasons: Vec<&str> = events.items.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["BudgetExhausted"], "crossed 80 % and 100 % in one pass: one event");
    // More borrowing waits, with the budget and its reset named; in-quota work of another
    // team runs; nothing running is stopped.
    p.submit("a", "more", 1, 8.0, long.clone()).await;
    p.settle().await;
    let more = p.workload("a", "more").await;
    assert_eq!(more.status.phase, Phase::Pending);
    let reason = more.status.pending_reason.expect("a reason");
    assert_eq!(reason.code, "BudgetExhausted", "{reason:?}");
    let resets = budget.resets_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        reason.message.contains("1 GPU-hour of all flavors per week") && reason.message.contains(&resets),
        "{}",
        reason.message
    );
    assert_eq!(p.phase("a", "borrower").await, Phase::Running);
    assert_eq!(p.phase("a", "in-quota").await, Phase::Running);
    // Nothing running has a runtime limit: only the budget's reset says when it starts.
    berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    let e = p.workload("a", "more").await.status.estimated_start.expect("an estimate");
    assert_eq!(e.at, budget.resets_at, "{e:?}");
    assert!(e.basis.starts_with("when the budget of 1 GPU-hour of all flavors per week resets"), "{}", e.basis);
    // The next week: the budget starts from 0 and borrowing resumes.
    let to_reset = (budget.resets_at - p.ctx.clock.now()).num_seconds() + 1;
    p.advance(to_reset);
    p.settle().await;
    let team = berth_app::team::team_get(&p.ctx.db, &p.actor, "a").await.unwrap();
    assert_eq!(team.status.budgets[0].state, berth_core::usage::BudgetState::Ok, "{:?}", team.status.budgets);
    assert_eq!(team.status.budgets[0].period_start, budget.resets_at);
    let more = p.workload("a", "more").await;
    assert_eq!(more.status.phase, Phase::Running, "{:?}", more.status.pending_reason);
    assert!(more.status.admission.unwrap().borrowed);
}

/// A budget declared or lowered stops work at once, not only once the budgets controller
/// has added it up again (up to 10 s later; work was admitted meanwhile): lowered below
/// what its period used, or declared at 0 GPU-hours.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_budget_lowered_below_its_use_or_declared_at_zero_stops_new_work_at_once(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    let team = |gpu_hours: f64| {
        serde_json::from_value(json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 16}],
            "budgets": [{"gpu_hours": gpu_hours, "period": "week", "action": "stop_new"}]}}))
        .unwrap()
    };
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "a", &team(100.0), None).await.unwrap();
    p.cluster("sim-a", 4, json!({})).await;
    let long = json!({"sim": {"duration_seconds": 30 * 86_400}});
    p.submit("a", "first", 1, 8.0, long.clone()).await;
    p.settle().await;
    // 8 GPUs for 30 minutes: 4 GPU-hours of 100.
    p.advance(1800);
    p.settle().await;
    let used = berth_app::team::team_get(&p.ctx.db, &p.actor, "a").await.unwrap().status.budgets[0].used_gpu_hours;
    assert!((used - 4.0).abs() < 0.01, "{used}");
    // Lowered to 2, then a submission: the scheduler's next cycle, before the budgets
    // controller's next pass, keeps it waiting.
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "a", &team(2.0), None).await.unwrap();
    p.submit("a", "next", 1, 8.0, long.clone()).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    let next = p.workload("a", "next").await;
    assert_eq!(next.status.phase, Phase::Pending);
    let reason = next.status.pending_reason.expect("a reason");
    assert_eq!(reason.code, "BudgetExhausted", "{reason:?}");
    assert!(reason.message.contains("2 GPU-hours of all flavors per week"), "{}", reason.message);
    // A new team whose budget is 0 from the start.
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "b", &team(0.0), None).await.unwrap();
    p.submit("b", "first", 1, 8.0, long).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    let first = p.workload("b", "first").await;
    assert_eq!(first.status.phase, Phase::Pending);
    assert_eq!(first.status.pending_reason.map(|r| r.code), Some("BudgetExhausted".into()));
    // Raised again above what was used: work runs.
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "a", &team(100.0), None).await.unwrap();
    scheduler::reconcile(&p.ctx).await.unwrap();
    assert_ne!(p.phase("a", "next").await, Phase::Pending);
}

/// The scheduler's kept world follows the change feed: a write still uncommitted when the
/// world is read arrives with the next read (it commits after a later one started), is
/// all that keeps being looked for meanwhile, and deleted workloads leave it; a full read
/// is the same, and so is its plan.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_kept_world_misses_no_write_that_commits_late_nor_any_delete(db: berth_store::PgPool) {
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let (world, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!((read, world.workloads.len()), (berth_controllers::world::Read::Full, 0));
    let early = p.submit("nlp", "early", 1, 1.0, json!({})).await;

    // A writer takes its transaction id and holds it open across a read; a later writer
    // commits first.
    let mut slow = db.begin().await.unwrap();
    sqlx::query("UPDATE workloads SET labels = '{\"slow\": \"yes\"}' WHERE uid = $1")
        .bind(early.metadata.uid)
        .execute(&mut *slow)
        .await
        .unwrap();
    let late = p.submit("nlp", "late", 1, 1.0, json!({})).await;
    let (world, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert!(matches!(read, berth_controllers::world::Read::Changes(_)), "{read:?}");
    let uids: Vec<_> = world.workloads.iter().map(|w| w.metadata.uid).collect();
    assert!(uids.contains(&early.metadata.uid) && uids.contains(&late.metadata.uid));
    assert!(world.workloads.iter().all(|w| w.metadata.labels.is_empty()), "the slow write is not visible yet");
    // The open transaction holds back only itself: what the last read saw is not read
    // again (the feed's cursor was once the oldest open transaction, and every read
    // returned all that was written since it began).
    let (_, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, berth_controllers::world::Read::Changes(0), "nothing new while the slow write is open");
    let (_, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, berth_controllers::world::Read::Changes(0));
    slow.commit().await.unwrap();
    let (world, _) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    let kept = world.workloads.iter().find(|w| w.metadata.uid == early.metadata.uid).unwrap();
    assert_eq!(kept.metadata.labels.get("slow").map(String::as_str), Some("yes"), "the late commit is read");

    // A pending workload deleted (removed at once) leaves the kept world.
    berth_app::workload::workload_delete(&db, &p.actor, "nlp", "late", None).await.unwrap();
    let (world, _) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert!(world.workloads.iter().all(|w| w.metadata.uid != late.metadata.uid), "a deleted workload is gone");
    p.assert_kept_world_is_current().await;

    // So do finished ones, and work runs as before.
    p.cluster("sim-a", 1, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("nlp", "early").await, Phase::Running);
    p.advance(600);
    p.settle().await;
    assert_eq!(p.phase("nlp", "early").await, Phase::Succeeded);
    let (world, _) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert!(world.workloads.is_empty(), "finished work leaves the kept world");
}

/// What a reader of the kept world writes itself (the scheduler's reasons and admissions)
/// is kept as written and not read back; and a background full read whose snapshot may be
/// older than such a write, replacing the kept world, loses none of them.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_kept_world_keeps_its_readers_own_writes_and_a_full_read_loses_none(db: berth_store::PgPool) {
    use berth_controllers::world::{Read, WorldCache, read_full};
    use berth_core::workload::WorkloadStatus;
    use berth_store::workload::StatusWrite;
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let w = p.submit("nlp", "w", 1, 1.0, json!({})).await;
    // A full read starts beside every read that has none under way.
    let cache = WorldCache::with_full_read_every(std::time::Duration::ZERO);
    let (mut full_reads, mut nothing_read) = (0, 0);
    for pass in 0..60 {
        let (world, read) = cache.load(&db, chrono::Utc::now()).await.unwrap();
        full_reads += usize::from(read == Read::Full);
        nothing_read += usize::from(read == Read::Changes(0));
        assert_eq!(world.workloads, read_full(&db, chrono::Utc::now()).await.unwrap().workloads, "pass {pass}");
        let kept = &world.workloads[0];
        let write = StatusWrite {
            uid: berth_core::WorkloadId(w.metadata.uid),
            resource_version: kept.metadata.resource_version.parse().unwrap(),
            status: WorkloadStatus { message: Some(format!("pass {pass}")), ..kept.status.clone() },
        };
        let mut tx = db.begin().await.unwrap();
        let written =
            berth_store::workload::workload_write_statuses(&mut tx, std::slice::from_ref(&write)).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(written.len(), 1, "pass {pass}");
        cache.wrote(vec![write], written).await;
    }
    assert!(full_reads > 1, "background full reads replaced the kept world ({full_reads})");
    assert!(nothing_read > 0, "a write of its own is not read back");
}

/// The scheduler reads a spec's `run` as its image and whether there is anything to run,
/// not the script, command and environment themselves; the full read, the change feed and
/// the workloads this process created (handed over, not read back) give it the same way.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_scheduler_reads_no_script_command_or_environment(db: berth_store::PgPool) {
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let (_, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, berth_controllers::world::Read::Full);
    let run = json!({"image": "pytorch:2", "script": "#!/bin/sh\ntrain --secret-flag", "env": {"TOKEN": "t"}});
    p.submit("nlp", "scripted", 1, 1.0, json!({"run": run})).await;
    p.submit("nlp", "commanded", 1, 1.0, json!({"run": {"command": ["train", "--fast"]}})).await;
    p.submit("nlp", "image-only", 1, 1.0, json!({"run": {"image": "pytorch:2"}})).await;
    let elided = |image: Option<&str>| {
        let mut run = json!({"command": ["(elided)"], "env": {}});
        if let Some(image) = image {
            run["image"] = json!(image);
        }
        run
    };
    let assert_cut = |world: &berth_controllers::snapshot::World| {
        let run_of = |name: &str| {
            let w = world.workloads.iter().find(|w| w.metadata.name == name).unwrap();
            serde_json::to_value(&w.spec.run).unwrap()
        };
        assert_eq!(run_of("scripted"), elided(Some("pytorch:2")));
        assert_eq!(run_of("commanded"), elided(None));
        assert_eq!(run_of("image-only"), json!({"image": "pytorch:2", "command": [], "env": {}}));
    };
    let (world, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, berth_controllers::world::Read::Changes(0), "created here: handed over, not read back");
    assert_cut(&world);
    p.assert_kept_world_is_current().await;
    // Written by another process, they come through the feed.
    sqlx::query("UPDATE workloads SET labels = '{\"again\": \"yes\"}'").execute(&db).await.unwrap();
    let (world, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, berth_controllers::world::Read::Changes(3));
    assert_cut(&world);
    p.assert_kept_world_is_current().await;
}

/// What this process creates, alone or in a batch, reaches the kept world without being
/// read back from the change feed; one written or deleted again before the next read comes
/// as the feed has it, and a secret in a created workload's environment is not kept.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_kept_world_takes_what_this_process_created_without_reading_it_back(db: berth_store::PgPool) {
    use berth_controllers::world::Read;
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let (_, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, Read::Full);
    let env = json!({"run": {"command": ["train"], "env": {"TOKEN": "secret"}}});
    for name in ["alone", "changed", "deleted"] {
        p.submit("nlp", name, 1, 1.0, env.clone()).await;
    }
    let item = |name: &str| {
        json!({"metadata": {"name": name},
               "spec": {"kind": "training", "tasks": {"count": 2, "resources": {"flavors": ["h100"], "gpus": 1}}}})
    };
    let batch = serde_json::from_value(json!({"items": [item("batch-a"), item("batch-b")]})).unwrap();
    berth_app::workload::workload_create_batch(&db, &p.actor, "nlp", &batch, None).await.unwrap();
    // Another writer changes one (at a new version, as every writer of the store does) and
    // deletes another before the next read.
    sqlx::query(
        "UPDATE workloads SET labels = '{\"changed\": \"yes\"}', resource_version = nextval('resource_version_seq')
         WHERE name = 'changed'",
    )
    .execute(&db)
    .await
    .unwrap();
    berth_app::workload::workload_delete(&db, &p.actor, "nlp", "deleted", None).await.unwrap();
    let (world, read) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(read, Read::Changes(2), "only the changed and the deleted one are read");
    let mut names: Vec<_> = world.workloads.iter().map(|w| w.metadata.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["alone", "batch-a", "batch-b", "changed"]);
    let changed = world.workloads.iter().find(|w| w.metadata.name == "changed").unwrap();
    assert_eq!(changed.metadata.labels.get("changed").map(String::as_str), Some("yes"));
    assert!(world.workloads.iter().all(|w| w.spec.run.env.is_empty()), "no environment is kept");
    p.assert_kept_world_is_current().await;
    // And it schedules them as usual.
    p.cluster("sim-a", 1, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("nlp", "batch-b").await, Phase::Running);
    p.assert_kept_world_is_current().await;
}

/// Start estimates wait for the scheduler's first look at new work: it admits what fits,
/// and an estimate written before that made its admissions stale (100,000 submitted at
/// once: a cycle of 11.9 s written for nothing).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn start_estimates_wait_until_the_scheduler_has_left_work_waiting(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 16, None).await;
    p.cluster("c", 2, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    p.submit("a", "limited", 1, 8.0, json!({"max_runtime_seconds": 3600})).await;
    p.submit("a", "other", 1, 8.0, json!({})).await;
    p.submit("a", "next", 1, 8.0, json!({"max_runtime_seconds": 600})).await;
    let estimates = berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    assert_eq!((estimates.pending, estimates.updated), (3, 0), "{estimates:?}");
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.admitted, cycle.explained, cycle.stale), (2, 1, 0));
    let estimates = berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    assert_eq!(estimates.updated, 1, "{estimates:?}");
    let e = p.workload("a", "next").await.status.estimated_start.expect("an estimate");
    assert!(e.basis.starts_with("when a/limited reaches its max_runtime_seconds"), "{}", e.basis);
}

/// A cycle that admits more than `EARLY_ADMISSIONS` commits the first of them, with their
/// events, before the rest of its writes, so that their dispatch can start meanwhile. The
/// team's row is held by another transaction, so the cycle's usage write waits: the first
/// are admitted and the others not, until the row is let go.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cycle_that_admits_many_commits_its_first_admissions_before_the_rest(db: berth_store::PgPool) {
    use berth_controllers::scheduler::EARLY_ADMISSIONS;
    let p = Plane::new(db.clone()).await;
    let n = EARLY_ADMISSIONS as u32 + 50;
    p.team("a", None, n, None).await;
    p.cluster("c", n.div_ceil(8), json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    for i in 0..n {
        p.submit("a", &format!("w{i}"), 1, 1.0, json!({})).await;
    }
    let count = |sql: &'static str| {
        let db = db.clone();
        async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(&db).await.unwrap() }
    };
    let admitted = || count("SELECT count(*) FROM workloads WHERE phase = 'Admitted'");
    let events = || count("SELECT count(*) FROM events WHERE reason = 'Admitted'");
    let mut holder = db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM teams WHERE name = 'a' FOR UPDATE").execute(&mut *holder).await.unwrap();
    let ctx = p.ctx.clone();
    let cycle = tokio::spawn(async move { scheduler::reconcile(&ctx).await });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while admitted().await < EARLY_ADMISSIONS as i64 {
        assert!(std::time::Instant::now() < deadline, "the first admissions were not committed on their own");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!cycle.is_finished(), "the cycle's usage write waits for the team's row");
    assert_eq!((admitted().await, events().await), (EARLY_ADMISSIONS as i64, EARLY_ADMISSIONS as i64));
    holder.rollback().await.unwrap();
    let status = cycle.await.unwrap().unwrap();
    assert_eq!((status.admitted, status.stale), (n as usize, 0));
    assert_eq!((admitted().await, events().await), (i64::from(n), i64::from(n)));
    let team = berth_store::team::team_fetch(&db, "a").await.unwrap().unwrap();
    assert_eq!(team.status.usage[0].allocated, f64::from(n), "the usage of every admission");
}

/// Queue positions: the head's are written as they move, those further back every
/// `POSITIONS_REFRESH` where they are more than a `POSITIONS_TOLERANCE`th off (writing each
/// move would rewrite the whole queue each cycle; writing each at the refresh, every 10 s).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn queue_positions_behind_the_head_are_refreshed_on_their_period_when_a_tenth_off(db: berth_store::PgPool) {
    use berth_controllers::scheduler::{POSITIONS_KEPT_CURRENT, POSITIONS_REFRESH, POSITIONS_TOLERANCE};
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let queued = POSITIONS_KEPT_CURRENT + 100;
    for i in 1..=queued {
        p.submit("nlp", &format!("w{i}"), 1, 1.0, json!({})).await;
    }
    let position = |w: berth_core::workload::Workload| w.status.queue_position.map(|q| q.global);
    let positions = || async {
        let mut all = Vec::new();
        for i in 1..=queued {
            all.push(position(p.workload("nlp", &format!("w{i}")).await));
        }
        all
    };
    scheduler::reconcile(&p.ctx).await.unwrap();
    let first: Vec<_> = (1..=queued).map(Some).collect();
    assert_eq!(positions().await, first);
    // Some of higher priority go ahead of them all.
    let urgent = |prefix: &'static str, n: u32| {
        let p = &p;
        async move {
            for k in 0..n {
                p.submit("nlp", &format!("{prefix}-{k}"), 1, 1.0, json!({"priority": 5})).await;
            }
        }
    };
    urgent("first", 1).await;
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(position(p.workload("nlp", "first-0").await), Some(1), "a new workload's position is written at once");
    // w100 leaves the head at once: left at 100, it would stand there beside w99.
    let moved: Vec<_> = (1..=queued).map(|i| Some(if i <= POSITIONS_KEPT_CURRENT { i + 1 } else { i })).collect();
    assert_eq!(positions().await, moved, "the head moved; the rest waits for the refresh");
    assert_eq!(cycle.explained, POSITIONS_KEPT_CURRENT as usize + 1);
    // At the refresh, a move of one is within a tenth of every position behind the head.
    p.ctx.clock.advance(POSITIONS_REFRESH);
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(positions().await, moved, "a move within a tenth is not written");
    assert_eq!(cycle.explained, 0);
    // 15 more go ahead, 16 in all: at the refresh, w1..w143 are written (16 off of 159
    // or less is more than a tenth), w144..w200 keep what they had (16 of 160 or more).
    assert_eq!(POSITIONS_TOLERANCE, 10);
    urgent("second", 15).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    p.ctx.clock.advance(POSITIONS_REFRESH);
    scheduler::reconcile(&p.ctx).await.unwrap();
    let refreshed: Vec<_> = (1..=queued).map(|i| Some(if i <= 143 { i + 16 } else { i })).collect();
    assert_eq!(positions().await, refreshed);
}

/// A refresh writes at most `REFRESH_WRITES_MAX` positions, the most off first; the rest
/// wait for the next (under reclaim churn most of the queue is off at every refresh).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_refresh_writes_at_most_its_share_of_positions_the_most_off_first(db: berth_store::PgPool) {
    use berth_controllers::scheduler::{POSITIONS_KEPT_CURRENT, POSITIONS_REFRESH, REFRESH_WRITES_MAX};
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let (head, behind, ahead) = (POSITIONS_KEPT_CURRENT as usize, REFRESH_WRITES_MAX + 100, 150);
    let queued = head + behind;
    for i in 1..=queued {
        p.submit("nlp", &format!("w{i}"), 1, 1.0, json!({})).await;
    }
    scheduler::reconcile(&p.ctx).await.unwrap();
    let positions = || async {
        let rows: Vec<(String, Option<i32>)> = sqlx::query_as(
            "SELECT w.name, (e.queue_position ->> 'global')::int
             FROM workloads w LEFT JOIN workload_explanations e USING (uid) WHERE w.name LIKE 'w%'",
        )
        .fetch_all(&db)
        .await
        .unwrap();
        let mut at = vec![None; queued];
        for (name, position) in rows {
            at[name[1..].parse::<usize>().unwrap() - 1] = position.map(|g| g as usize);
        }
        at
    };
    assert_eq!(positions().await, (1..=queued).map(Some).collect::<Vec<_>>());
    for k in 0..ahead {
        p.submit("nlp", &format!("ahead-{k}"), 1, 1.0, json!({"priority": 5})).await;
    }
    scheduler::reconcile(&p.ctx).await.unwrap();
    // Everyone moved back 150: more than a tenth for all (150 of 1,350 at most). The head's
    // are written at once; of the 1,100 behind it, the 1,000 most off (those nearest the
    // front) at the refresh, the last 100 at the next.
    p.ctx.clock.advance(POSITIONS_REFRESH);
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(cycle.explained, REFRESH_WRITES_MAX);
    let first = queued - 100;
    let expected: Vec<_> = (1..=queued).map(|i| Some(if i <= first { i + ahead } else { i })).collect();
    assert_eq!(positions().await, expected);
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(cycle.explained, 0, "the rest wait for the next refresh");
    p.ctx.clock.advance(POSITIONS_REFRESH);
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(cycle.explained, 100);
    assert_eq!(positions().await, (1..=queued).map(|i| Some(i + ahead)).collect::<Vec<_>>());
}

/// A burst's first reasons are written `NEW_REASONS_MAX` at a time behind the head, the
/// front of the queue first; the cycles after write the rest (writing 20,000 at once held up
/// the cycle, and every admission behind it, for a second).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_bursts_first_reasons_are_written_a_share_at_a_time_the_front_first(db: berth_store::PgPool) {
    use berth_controllers::scheduler::{NEW_REASONS_MAX, POSITIONS_KEPT_CURRENT};
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let head = POSITIONS_KEPT_CURRENT as usize;
    let queued = head + NEW_REASONS_MAX + 50;
    // No cluster: all of them wait.
    for i in 1..=queued {
        p.submit("nlp", &format!("w{i}"), 1, 1.0, json!({})).await;
    }
    let explained = || async {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT w.name FROM workloads w JOIN workload_explanations e USING (uid)
             WHERE w.name LIKE 'w%' AND e.pending_reason IS NOT NULL AND e.queue_position IS NOT NULL",
        )
        .fetch_all(&db)
        .await
        .unwrap();
        let mut at: Vec<usize> = rows.iter().map(|(n,)| n[1..].parse().unwrap()).collect();
        at.sort_unstable();
        at
    };
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.admitted, cycle.explained, cycle.deferred), (0, head + NEW_REASONS_MAX, 50), "{cycle:?}");
    assert_eq!(explained().await, (1..=queued - 50).collect::<Vec<_>>(), "the front of the queue first");
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.explained, cycle.deferred), (50, 0), "{cycle:?}");
    assert_eq!(explained().await, (1..=queued).collect::<Vec<_>>());
    let last = p.workload("nlp", &format!("w{queued}")).await.status.queue_position.unwrap();
    assert_eq!((last.global, last.team), (queued as u32, queued as u32));
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.explained, cycle.deferred), (0, 0), "nothing left to write");
}

/// The scheduler's reasons and queue positions move no workload's version: a client that
/// read a pending workload can still change it with `If-Match`, however the queue moved
/// meanwhile (each reason written was a new version, and such a write a 412).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn explaining_a_pending_workload_moves_no_version_and_a_conditional_write_holds(db: berth_store::PgPool) {
    use berth_core::apply::IfMatch;
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    // No cluster: both wait, the later one ahead (a higher priority).
    let read = p.submit("nlp", "w1", 1, 1.0, json!({})).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    p.submit("nlp", "w0", 1, 1.0, json!({"priority": 5})).await;
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(cycle.explained, 2, "{cycle:?}");
    let w1 = p.workload("nlp", "w1").await;
    assert_eq!(w1.status.pending_reason.as_ref().map(|r| r.code.as_str()), Some("PlacementMatchesNoCluster"));
    assert_eq!(w1.status.queue_position.map(|q| q.global), Some(2), "moved behind w0");
    assert_eq!(w1.metadata.resource_version, read.metadata.resource_version);

    let mut spec = serde_json::to_value(&read.spec).unwrap();
    spec["priority"] = json!(3);
    let input = serde_json::from_value(json!({"spec": spec})).unwrap();
    let if_match = IfMatch::Versions(vec![read.metadata.resource_version.clone()]);
    let (changed, _) = berth_app::workload::workload_apply(&db, &p.actor, "nlp", "w1", &input, Some(&if_match))
        .await
        .expect("the version read still holds");
    assert_eq!(changed.spec.priority, 3);
}

/// The kept nodes are read again whenever any cluster's inventory is written: a refresh
/// that finds new nodes, another replica's write, a cluster's delete (a cascade).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_kept_nodes_follow_every_write_of_an_inventory(db: berth_store::PgPool) {
    let p = Plane::new(db.clone()).await;
    let count = || async { p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap().0.nodes.len() };
    p.cluster("sim-a", 1, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    assert_eq!(count().await, 1);
    p.cluster("sim-b", 2, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    assert_eq!(count().await, 3, "a refresh that finds another cluster's nodes");
    p.assert_kept_world_is_current().await;

    let one = "(SELECT cluster_uid, name FROM cluster_nodes ORDER BY cluster_uid, name LIMIT 1)";
    sqlx::query(&format!("UPDATE cluster_nodes SET gpus = 4 WHERE (cluster_uid, name) = {one}"))
        .execute(&db)
        .await
        .unwrap();
    let (world, _) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert_eq!(world.nodes.iter().filter(|(_, n)| n.gpus == 4).count(), 1, "a write from elsewhere");
    // Cluster health compares with what is stored now, and puts the inventory back.
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let (world, _) = p.ctx.world.load(&db, p.ctx.clock.now()).await.unwrap();
    assert!(world.nodes.iter().all(|(_, n)| n.gpus == 8), "{:?}", world.nodes);

    berth_app::cluster::cluster_delete(&db, &p.actor, "sim-b", None).await.unwrap();
    assert_eq!(count().await, 1, "a cluster's delete takes its nodes");
    p.assert_kept_world_is_current().await;
}

/// A statement that says "notify later" sends nothing, and only it: the next statement of
/// the same transaction notifies as before.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn notify_later_covers_one_statement(db: berth_store::PgPool) {
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let mut changes = berth_store::changes::ChangeFeed::listen(&db).await.unwrap();
    p.submit("nlp", "train", 1, 1.0, json!({})).await;
    let submitted = tokio::time::timeout(std::time::Duration::from_secs(5), changes.next()).await;
    assert_eq!(submitted.expect("the submission notifies").unwrap(), berth_store::changes::Change::Submitted);
    let update = "UPDATE workloads SET labels = jsonb_build_object('n', $1::text), \
                  generation = generation + (set_config('berth.notify', $2, true) = 'x')::int";
    let mut tx = db.begin().await.unwrap();
    sqlx::query(update).bind("1").bind("later").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(500), changes.next()).await;
    assert!(quiet.is_err(), "a statement that notifies later sends nothing");
    let mut tx = db.begin().await.unwrap();
    sqlx::query(update).bind("2").bind("later").execute(&mut *tx).await.unwrap();
    sqlx::query("UPDATE workloads SET labels = '{}'").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), changes.next()).await;
    assert_eq!(next.expect("the next statement notifies").unwrap().payload(), "workloads");
}

/// A team's min runtime holds off the reclaim of its borrowed work until the work has run
/// that long (on the controllers' clock), and the owner's waiting workload says until
/// when; a workload may ask for less protection than its team allows, never more.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn borrowed_work_within_its_min_runtime_is_reclaimed_only_once_it_has_run_that_long(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 8, None).await;
    let team_b =
        json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 8}], "preemption": {"min_runtime_seconds": 600}}});
    let input = serde_json::from_value(team_b).unwrap();
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "b", &input, None).await.unwrap();
    p.cluster("sim-a", 2, json!({})).await;

    let more = json!({"spec": {"kind": "training", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 8}},
        "preemption": {"min_runtime_seconds": 601}}});
    let input = serde_json::from_value(more).unwrap();
    let refused = berth_app::workload::workload_apply(&p.ctx.db, &p.actor, "b", "greedy", &input, None).await;
    let Err(berth_core::Error::Invalid(errors)) = refused else { panic!("accepted: {refused:?}") };
    assert_eq!(errors[0].field, "/spec/preemption/min_runtime_seconds");
    assert!(errors[0].message.contains("at most 600"), "{}", errors[0].message);

    p.submit("b", "b1", 1, 8.0, json!({"sim": {"duration_seconds": 3600}})).await;
    p.settle().await;
    p.submit("b", "b2", 1, 8.0, json!({"sim": {"duration_seconds": 3600}})).await;
    p.settle().await;
    assert!(p.workload("b", "b2").await.status.admission.unwrap().borrowed);
    assert_eq!(p.phase("b", "b2").await, Phase::Running);

    p.advance(300);
    p.submit("a", "a1", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("b", "b2").await, Phase::Running, "protected for 600 s from its start");
    let reason = p.workload("a", "a1").await.status.pending_reason.unwrap();
    assert_eq!(reason.code, "WaitingForMinRuntime");
    assert!(reason.message.contains("b/b2"), "{}", reason.message);
    let started = p.workload("b", "b2").await.status.started_at.unwrap();
    let until = (started + chrono::TimeDelta::seconds(600)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(reason.details.unwrap()["protected_until"], until);

    p.advance(300);
    p.settle().await;
    assert_eq!(p.phase("b", "b2").await, Phase::Preempting);
    assert_eq!(p.phase("b", "b1").await, Phase::Running, "only the borrowed workload is preempted");
    p.advance(30);
    p.settle().await;
    assert_eq!(p.phase("a", "a1").await, Phase::Running);
}

/// The periodic full read runs beside the cycles and replaces the kept world at the next
/// read after it finishes: what the change feed cannot see (a row deleted with its
/// tombstone, a row written with the feed's trigger off and its version left as it was, as
/// a restore or hand-made SQL would) is as the full read found it then, what was written
/// meanwhile is kept, and a workload the full read found unchanged stays the kept object
/// (so the snapshot's derivation of it holds).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_background_full_read_finds_what_the_feed_cannot_see_and_loses_nothing(db: berth_store::PgPool) {
    use berth_controllers::world::{Read, WorldCache, read_full};
    let p = Plane::new(db.clone()).await;
    p.team("nlp", None, 8, None).await;
    let every = std::time::Duration::from_secs(1);
    let cache = WorldCache::with_full_read_every(every);
    let started = std::time::Instant::now();
    assert_eq!(cache.load(&db, chrono::Utc::now()).await.unwrap().1, Read::Full);
    let ghost = p.submit("nlp", "ghost", 1, 1.0, json!({})).await;
    let steady = p.submit("nlp", "steady", 1, 1.0, json!({})).await;
    let hidden = p.submit("nlp", "hidden", 1, 1.0, json!({})).await;
    let find =
        |w: &berth_controllers::snapshot::World, uid| w.workloads.iter().find(|w| w.metadata.uid == uid).cloned();
    let has = |w: &berth_controllers::snapshot::World, uid| find(w, uid).is_some();
    let object = |w: &berth_controllers::snapshot::World, uid| find(w, uid).expect("kept");
    let before = cache.load(&db, chrono::Utc::now()).await.unwrap().0;
    assert!(has(&before, ghost.metadata.uid));

    // Behind the feed's back: the row and its tombstone; a label, the version left as it was.
    sqlx::query("DELETE FROM workloads WHERE uid = $1").bind(ghost.metadata.uid).execute(&db).await.unwrap();
    sqlx::query("DELETE FROM workload_tombstones WHERE uid = $1").bind(ghost.metadata.uid).execute(&db).await.unwrap();
    let mut tx = db.begin().await.unwrap();
    sqlx::query("ALTER TABLE workloads DISABLE TRIGGER workloads_writer").execute(&mut *tx).await.unwrap();
    sqlx::query(r#"UPDATE workloads SET labels = '{"restored": "yes"}' WHERE uid = $1"#)
        .bind(hidden.metadata.uid)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE workloads ENABLE TRIGGER workloads_writer").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let (world, read) = cache.load(&db, chrono::Utc::now()).await.unwrap();
    if started.elapsed() < every {
        assert!(matches!(read, Read::Changes(0)), "{read:?}");
        assert!(has(&world, ghost.metadata.uid), "the feed cannot see it");
        assert!(object(&world, hidden.metadata.uid).metadata.labels.is_empty(), "nor this");
    }

    let after = p.submit("nlp", "after", 1, 1.0, json!({})).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let world = loop {
        let (world, read) = cache.load(&db, chrono::Utc::now()).await.unwrap();
        if read == Read::Full {
            break world;
        }
        assert!(std::time::Instant::now() < deadline, "no background full read came back");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!has(&world, ghost.metadata.uid), "the full read does not find it");
    assert!(has(&world, after.metadata.uid), "a write since is kept");
    assert_eq!(object(&world, hidden.metadata.uid).metadata.labels["restored"], "yes", "the full read's");
    let (was, is) = (object(&before, steady.metadata.uid), object(&world, steady.metadata.uid));
    assert!(std::sync::Arc::ptr_eq(&was, &is), "unchanged, it is the object kept before");
    assert_eq!(world.workloads, read_full(&db, chrono::Utc::now()).await.unwrap().workloads);
}

/// A preempted workload gets the time to checkpoint it asks for (`spec.checkpoint`), up
/// to its cluster's maximum, instead of the server's grace period (30 s here): the owner
/// is told when the grace ends, and gets its GPUs that much sooner.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_preempted_workload_gets_the_checkpoint_grace_it_asks_for_up_to_its_clusters_maximum(
    db: berth_store::PgPool,
) {
    let p = Plane::new(db).await;
    p.team("a", None, 8, None).await;
    p.team("b", None, 8, None).await;
    let nodes = json!([{"name": "n", "count": 2, "flavor": "h100", "gpus_per_node": 8}]);
    p.apply_cluster(
        "sim-a",
        json!({"spec": {"kind": "sim", "max_checkpoint_grace_seconds": 20, "sim": {"node_groups": nodes}}}),
    )
    .await;
    let long = json!({"resumable": true, "sim": {"duration_seconds": 3600}});
    p.submit("b", "b1", 1, 8.0, long.clone()).await;
    p.settle().await;
    let mut quick = long.clone();
    quick["checkpoint"] = json!({"grace_seconds": 5});
    p.submit("b", "b2", 1, 8.0, quick).await;
    p.settle().await;
    assert!(p.workload("b", "b2").await.status.admission.unwrap().borrowed);

    p.submit("a", "a1", 1, 8.0, json!({})).await;
    p.settle().await;
    let b2 = p.workload("b", "b2").await;
    assert_eq!(b2.status.phase, Phase::Preempting);
    let told = b2.status.cancel_requested_at.unwrap();
    let reason = p.workload("a", "a1").await.status.pending_reason.unwrap();
    let grace_ends = (told + chrono::TimeDelta::seconds(5)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(reason.details.unwrap()["grace_ends_at"], grace_ends, "{}", reason.message);
    // a1's estimated start: when b2's grace ends (b2 has no runtime limit).
    berth_controllers::estimates::reconcile(&p.ctx).await.unwrap();
    let e = p.workload("a", "a1").await.status.estimated_start.expect("an estimate");
    let whole = chrono::DateTime::from_timestamp(told.timestamp(), 0).unwrap();
    assert_eq!(e.at, whole + chrono::TimeDelta::seconds(5), "{}", e.basis);
    assert!(e.basis.starts_with("when b/b2 stops, as it was told to"), "{}", e.basis);
    let notice: (String, serde_json::Value) =
        sqlx::query_as("SELECT message, details FROM events WHERE object_uid = $1 AND reason = 'StopRequested'")
            .bind(b2.metadata.uid)
            .fetch_one(&p.ctx.db)
            .await
            .unwrap();
    assert_eq!(
        (notice.1["grace_seconds"].as_u64(), notice.1["kill_at"].as_str()),
        (Some(5), Some(grace_ends.as_str()))
    );
    assert!(notice.0.starts_with("told to stop: 5 s to checkpoint"), "{}", notice.0);
    p.advance(6);
    p.settle().await;
    assert_eq!(p.phase("a", "a1").await, Phase::Running, "b2 stopped after its 5 s, not the server's 30");
    assert_eq!(p.workload("b", "b2").await.status.attempt, 1);
}

/// Asking for more time to checkpoint than the cluster allows gets its maximum.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_checkpoint_grace_above_the_clusters_maximum_is_cut_to_it(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("t", None, 8, Some(8)).await;
    let nodes = json!([{"name": "n", "count": 1, "flavor": "h100", "gpus_per_node": 8}]);
    p.apply_cluster(
        "sim-a",
        json!({"spec": {"kind": "sim", "max_checkpoint_grace_seconds": 20, "sim": {"node_groups": nodes}}}),
    )
    .await;
    let slow = json!({"priority": -1, "checkpoint": {"grace_seconds": 3600}, "sim": {"duration_seconds": 3600}});
    p.submit("t", "slow", 1, 8.0, slow).await;
    p.settle().await;
    p.submit("t", "urgent", 1, 8.0, json!({"priority": 10})).await;
    p.settle().await;
    assert_eq!(p.phase("t", "slow").await, Phase::Preempting);
    p.advance(19);
    p.settle().await;
    assert_eq!(p.phase("t", "slow").await, Phase::Preempting, "within its 20 s");
    p.advance(2);
    p.settle().await;
    assert_eq!(p.phase("t", "urgent").await, Phase::Running);
}

/// The checkpoint handshake: of two preempted jobs with 60 s to checkpoint, the one that
/// says its checkpoint is written (2 s after the notice, with the token in its
/// environment) is stopped then; the one that says nothing is stopped at the end of its
/// grace. Both resume in their next attempt, told so in their environment. The token
/// speaks for its own attempt only.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_job_that_acknowledges_its_checkpoint_is_released_then_and_one_that_does_not_at_its_grace(
    db: berth_store::PgPool,
) {
    let p = Plane::new(db).await;
    p.team("t", None, 16, Some(16)).await;
    let nodes = json!([{"name": "n", "count": 2, "flavor": "h100", "gpus_per_node": 8}]);
    let spec = json!({"kind": "sim", "max_checkpoint_grace_seconds": 120, "sim": {"node_groups": nodes}});
    p.apply_cluster("sim-a", json!({ "spec": spec })).await;
    let low = json!({"priority": -1, "resumable": true, "checkpoint": {"grace_seconds": 60},
                     "sim": {"duration_seconds": 3600}});
    p.submit("t", "acks", 1, 8.0, low.clone()).await;
    p.submit("t", "silent", 1, 8.0, low).await;
    p.settle().await;
    let acks = p.workload("t", "acks").await;
    let env = p.environment("sim-a", &acks).await;
    assert_eq!(env["BERTH_API_URL"], "http://berth.test");
    assert_eq!(env["BERTH_CHECKPOINTED_URL"], "http://berth.test/api/v1/teams/t/workloads/acks/checkpointed");
    assert!(!env.contains_key("BERTH_RESUME"), "a first attempt resumes nothing");
    let job = p.caller(&env["BERTH_JOB_TOKEN"]).await;
    let not_yet = berth_app::workload::workload_checkpointed(&p.ctx.db, &job, "t", "acks").await.unwrap_err();
    assert!(matches!(not_yet, berth_core::Error::Conflict { .. }), "nothing to acknowledge before the notice");
    // The token reads nothing and speaks for no other workload.
    let get = berth_app::workload::workload_get(&p.ctx.db, &job, "t", "acks").await.unwrap_err();
    assert!(matches!(get, berth_core::Error::NotFound { .. }), "{get:?}");
    let other = berth_app::workload::workload_checkpointed(&p.ctx.db, &job, "t", "silent").await.unwrap_err();
    assert!(matches!(other, berth_core::Error::NotFound { .. }), "{other:?}");

    p.submit("t", "urgent", 2, 8.0, json!({"priority": 10, "sim": {"duration_seconds": 30}})).await;
    p.settle().await;
    assert_eq!(p.phase("t", "acks").await, Phase::Preempting);
    assert_eq!(p.phase("t", "silent").await, Phase::Preempting);
    // When the notice was given, by the sim's clock (by the controllers', which also run on
    // with the wall clock, it was as much later as the test took to get here: more than a
    // second on a loaded machine).
    let told = p.sim_now();

    p.advance(2);
    berth_app::workload::workload_checkpointed(&p.ctx.db, &job, "t", "acks").await.unwrap();
    berth_app::workload::workload_checkpointed(&p.ctx.db, &job, "t", "acks").await.unwrap();
    // The pass that stops the job writes nothing (so `settle` would stop there); the next
    // one finds the job gone.
    p.step().await;
    p.settle().await;
    let requeued = p.workload("t", "acks").await;
    assert_eq!((requeued.status.phase, requeued.status.attempt), (Phase::Pending, 1), "released 2 s after the notice");
    let first = p.jobs("sim-a").await.into_iter().find(|j| j.key == berth_controllers::job_key(&acks)).unwrap();
    assert_eq!(first.state, JobState::Cancelled);
    let stopped_after = (first.finished_at.unwrap() - told).num_milliseconds();
    assert!((1_000..3_000).contains(&stopped_after), "its job stopped at the acknowledgement: {stopped_after} ms");
    assert_eq!(
        p.events(&acks).await,
        ["Created", "Admitted", "Running", "Preempted", "StopRequested", "Checkpointed", "Requeued"],
        "notice, acknowledgement (once) and release"
    );
    assert_eq!(p.phase("t", "silent").await, Phase::Preempting, "the other waits out its grace");
    let over = berth_app::workload::workload_checkpointed(&p.ctx.db, &job, "t", "acks").await.unwrap_err();
    assert!(matches!(over, berth_core::Error::Conflict { .. }), "the token's attempt is over: {over:?}");

    p.advance(57);
    p.settle().await;
    assert_eq!(p.phase("t", "silent").await, Phase::Preempting, "59 s into its 60");
    p.advance(2);
    p.settle().await;
    assert_eq!(p.workload("t", "silent").await.status.attempt, 1, "stopped at the end of its grace");
    assert_eq!(p.phase("t", "urgent").await, Phase::Running);

    p.advance(31);
    p.settle().await;
    for name in ["acks", "silent"] {
        let w = p.workload("t", name).await;
        assert_eq!((w.status.phase, w.status.attempt), (Phase::Running, 1), "{name}");
        let env = p.environment("sim-a", &w).await;
        assert_eq!((env["BERTH_RESUME"].as_str(), env["BERTH_PREVIOUS_ATTEMPT"].as_str()), ("1", "0"), "{name}");
        assert_ne!(env["BERTH_JOB_TOKEN"], "", "{name}: a token for the new attempt");
    }
}

/// A notebook answers at its URL and opens with a token only its owner (and team admins)
/// may read; activity it reports keeps it; once idle for its timeout it is stopped and its
/// GPUs go to the work that waits.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_idle_notebook_is_stopped_after_its_timeout_and_its_gpus_freed(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("t", None, 8, Some(8)).await;
    p.cluster("sim-a", 1, json!({})).await;
    let notebook = json!({"kind": "notebook", "notebook": {"idle_timeout_seconds": 600},
                          "sim": {"duration_seconds": 1_000_000}});
    p.submit("t", "nb", 1, 8.0, notebook).await;
    p.settle().await;
    let nb = p.workload("t", "nb").await;
    assert_eq!(nb.status.phase, Phase::Running);
    let url = nb.status.backend_ref.as_ref().unwrap().url.clone().unwrap();
    assert!(url.starts_with("http://sim-") && url.ends_with(".sim.invalid"), "{url}");
    let env = p.environment("sim-a", &nb).await;
    let endpoint =
        berth_app::workload::workload_endpoint(&p.ctx.db, &p.actor, Some(&support::issuer()), "t", "nb").await.unwrap();
    assert_eq!((endpoint.url.as_str(), endpoint.token.as_deref()), (url.as_str(), Some(env["JUPYTER_TOKEN"].as_str())));
    let started = nb.status.started_at.unwrap();
    assert_eq!(endpoint.idle_stop_at, Some(started + chrono::TimeDelta::seconds(600)));
    // The token opens the notebook: a teammate who may not cancel it may not read it.
    let bob = berth_core::auth::Principal {
        subject: "bob".into(),
        grants: vec![berth_core::auth::Grant { role: berth_core::auth::Role::Member, team: Some("t".into()) }],
        ..p.actor.principal.clone()
    };
    let teammate = berth_app::context::OpContext::for_request(&p.ctx.db, bob, None, "berth").await.unwrap();
    let refused = berth_app::workload::workload_endpoint(&p.ctx.db, &teammate, None, "t", "nb").await.unwrap_err();
    assert!(matches!(&refused, berth_core::Error::Forbidden(m) if m.contains("may open its endpoint")), "{refused:?}");

    p.submit("t", "waiting", 1, 8.0, json!({})).await;
    p.settle().await;
    assert_eq!(p.phase("t", "waiting").await, Phase::Pending);
    // Used after 500 s: the timeout counts from then.
    p.advance(500);
    let job = p.caller(&env["BERTH_JOB_TOKEN"]).await;
    berth_app::workload::workload_activity(&p.ctx.db, &job, "t", "nb", p.ctx.clock.now()).await.unwrap();
    p.advance(599);
    p.settle().await;
    assert_eq!(p.phase("t", "nb").await, Phase::Running, "599 s after its last activity");
    p.advance(2);
    p.settle().await;
    let stopping = p.workload("t", "nb").await;
    assert_eq!(stopping.status.cancellation.as_ref().unwrap().by, berth_controllers::idle::IDLE_CANCELLED_BY);
    // Stopped as a cancel stops it: SIGTERM, and the grace period (30 s) to save.
    p.advance(30);
    p.settle().await;
    let stopped = p.workload("t", "nb").await;
    assert_eq!(stopped.status.phase, Phase::Cancelled, "{:?}", stopped.status);
    let events = p.events(&stopped).await;
    assert_eq!(events, ["Created", "Admitted", "Running", "IdleTimeout", "StopRequested", "Cancelled"]);
    assert_eq!(p.phase("t", "waiting").await, Phase::Running, "its GPUs went to the work that waited");
    // Training reports no activity: nothing would read it.
    let training = berth_app::workload::workload_activity(&p.ctx.db, &p.actor, "t", "waiting", p.ctx.clock.now()).await;
    assert!(
        matches!(&training, Err(berth_core::Error::Conflict { field: Some(field), .. }) if field == "/spec/kind"),
        "{training:?}"
    );
    let late = berth_app::workload::workload_activity(&p.ctx.db, &job, "t", "nb", p.ctx.clock.now()).await;
    assert!(matches!(late, Err(berth_core::Error::Conflict { .. })), "{late:?}");
}

/// An inference service scales with its load under the team's quota: load rises → replicas
/// are added and admitted like any work, until the team's limit binds and the next one
/// waits with the quota's reason (which the service's status shows); load falls → replicas
/// are removed once the stabilization window has passed. At every step the team's
/// allocation is the service's running replicas.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_inference_service_scales_with_its_load_within_the_teams_quota(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("t", None, 4, Some(4)).await;
    p.cluster("sim-a", 1, json!({})).await;
    let load = json!([{"after_seconds": 0, "value": 5}, {"after_seconds": 100, "value": 35},
                      {"after_seconds": 300, "value": 70}, {"after_seconds": 500, "value": 5}]);
    let spec = json!({"kind": "inference", "sim": {"duration_seconds": 1_000_000, "load": load},
        "inference": {"min_replicas": 1, "max_replicas": 6, "target_in_flight": 10,
                      "scale_down_stabilization_seconds": 60}});
    // A workload of the team already holds the name its first replica would take.
    p.submit("t", "svc-r1", 1, 1.0, json!({"sim": {"duration_seconds": 1}})).await;
    p.settle().await;
    p.advance(2);
    p.settle().await;
    assert_eq!(p.phase("t", "svc-r1").await, Phase::Succeeded);
    p.submit("t", "svc", 1, 1.0, spec).await;
    // What the service has, what it asks for, and what the team holds.
    let state = async || {
        let svc = p.workload("t", "svc").await;
        let r = svc.status.replicas.clone().unwrap_or_default();
        let team = berth_app::team::team_get(&p.ctx.db, &p.actor, "t").await.unwrap();
        let held = team.status.usage.first().map_or(0.0, |u| u.allocated);
        (r.current, r.desired, held, r.waiting)
    };
    p.settle().await;
    assert_eq!(state().await, (1, 1, 1.0, None), "load 5 at 10 per replica: one replica");

    p.advance(100);
    p.settle().await;
    assert_eq!(state().await, (4, 4, 4.0, None), "load 35: four replicas, each admitted and running");
    let replicas = p.jobs("sim-a").await.into_iter().filter(|j| j.state == JobState::Running).count();
    assert_eq!(replicas, 4, "the cluster runs them");
    let svc = p.workload("t", "svc").await;
    assert!(p.events(&svc).await.contains(&"ScaledUp".to_owned()));

    p.advance(200);
    p.settle().await;
    let (current, desired, held, waiting) = state().await;
    assert_eq!((current, desired, held), (4, 6, 4.0), "load 70 asks for 6; the team's limit of 4 binds");
    let waiting = waiting.expect("why the next replica waits");
    assert!(waiting.starts_with("replica svc-r") && waiting.contains("limit"), "{waiting}");
    let r5 = p.workload("t", "svc-r5").await;
    assert_eq!(r5.status.phase, Phase::Pending, "replicas 2 to 4 run, and the name svc-r1 was taken");
    assert_eq!(r5.metadata.labels[berth_core::workload::REPLICA_OF_LABEL], svc.metadata.uid.to_string());
    // Of the two replicas the limit can never hold, one waits to say why; the other is not
    // made (max_replicas 1000 under this limit made 999 that waited for ever).
    let replicas: Vec<String> =
        sqlx::query_scalar("SELECT name FROM workloads WHERE labels ? 'berth.dev/replica-of' ORDER BY name")
            .fetch_all(&p.ctx.db)
            .await
            .unwrap();
    assert_eq!(replicas, ["svc-r2", "svc-r3", "svc-r4", "svc-r5"]);

    // The load falls at 500 s: nothing goes before the 60 s window has passed.
    p.advance(200);
    p.settle().await;
    assert_eq!(state().await.0, 4);
    p.advance(59);
    p.settle().await;
    let (current, desired, held, _) = state().await;
    assert_eq!((current, desired, held), (4, 1, 4.0), "within the window");
    p.advance(2);
    p.settle().await;
    // The replicas removed get 1 s to stop.
    p.advance(2);
    p.settle().await;
    assert_eq!(state().await, (1, 1, 1.0, None), "back to one replica, its GPUs freed");
    let left: Vec<String> =
        sqlx::query_scalar("SELECT name FROM workloads ORDER BY name").fetch_all(&p.ctx.db).await.unwrap();
    assert_eq!(left, ["svc", "svc-r1"], "the replicas are gone");
}

/// A service in a team without a limit, asking for 1,000 one-GPU replicas where one node of
/// 8 GPUs exists: replicas are made up to what the node could hold, and one more waits to
/// say why; not 999 workloads in every queue and cycle.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn replicas_are_not_made_beyond_what_the_nodes_could_hold(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("t", None, 4, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    let spec = json!({"kind": "inference",
        "sim": {"duration_seconds": 1_000_000, "load": [{"after_seconds": 0, "value": 1_000_000}]},
        "inference": {"min_replicas": 1, "max_replicas": 1000, "target_in_flight": 1}});
    p.submit("t", "svc", 1, 1.0, spec).await;
    for _ in 0..3 {
        p.settle().await;
        p.advance(1);
    }
    let svc = p.workload("t", "svc").await;
    let r = svc.status.replicas.clone().unwrap_or_default();
    assert_eq!((r.current, r.desired), (8, 1000), "the node's 8 GPUs run the service and 7 replicas");
    let replicas: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads WHERE labels ? 'berth.dev/replica-of'")
        .fetch_one(&p.ctx.db)
        .await
        .unwrap();
    assert_eq!(replicas, 8, "7 that run and one that waits");
    assert!(r.waiting.is_some_and(|w| w.starts_with("replica svc-r")), "the one that waits says why");
}

/// A service's replicas run on its cluster, whose Service reaches them: they are pinned
/// there, and the room they are held to is that cluster's nodes that take work now. Before,
/// replicas went to any cluster with room, where on Kubernetes no Service selected them.
/// Cordoning another cluster changes nothing; cordoning the service's, the replicas that
/// still wait beyond the room go at once (what runs stays).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn replicas_run_on_their_services_cluster_and_wait_only_for_its_room(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("t", None, 4, None).await;
    p.cluster("sim-a", 1, json!({})).await;
    p.cluster("sim-b", 1, json!({})).await;
    let spec = json!({"kind": "inference",
        "sim": {"duration_seconds": 1_000_000, "load": [{"after_seconds": 0, "value": 1_000_000}]},
        "inference": {"min_replicas": 1, "max_replicas": 1000, "target_in_flight": 1}});
    p.submit("t", "svc", 1, 1.0, spec).await;
    p.step().await;
    let svc = p.workload("t", "svc").await;
    assert_eq!(svc.status.phase, Phase::Running);
    let (home, other) = match svc.status.admission.as_ref().map(|a| a.cluster.as_str()) {
        Some("sim-a") => ("sim-a", "sim-b"),
        _ => ("sim-b", "sim-a"),
    };
    let replicas = async || -> Vec<(Phase, Option<String>, Option<String>)> {
        let listed = berth_store::workload::workload_list_serving(&p.ctx.db).await.unwrap();
        (listed.into_iter())
            .filter(|w| {
                w.metadata.labels.contains_key("berth.dev/replica-of") && w.metadata.deletion_timestamp.is_none()
            })
            .map(|w| {
                let pinned = w.spec.placement.cluster_selector.get("berth.dev/cluster").cloned();
                (w.status.phase, pinned, w.status.admission.map(|a| a.cluster))
            })
            .collect()
    };
    // The service's cluster has 8 GPUs: the service, 7 replicas and one that waits to say
    // why, each pinned there.
    berth_controllers::autoscaler::reconcile(&p.ctx).await.unwrap();
    let made = replicas().await;
    assert_eq!(made.len(), 8, "{made:?}");
    assert!(made.iter().all(|(_, pinned, _)| pinned.as_deref() == Some(home)), "{made:?}");
    let cordon = async |name: &str, cordoned: bool| {
        let body = json!({"spec": {"kind": "sim", "cordoned": cordoned, "sim": {"node_groups": [
            {"name": "n", "count": 1, "flavor": "h100", "gpus_per_node": 8}]}}});
        p.apply_cluster(name, body).await;
    };
    cordon(other, true).await;
    let status = berth_controllers::autoscaler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(status.replicas_removed, 0, "another cluster's room is not theirs: {status:?}");
    cordon(home, true).await;
    let status = berth_controllers::autoscaler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(status.replicas_removed, 7, "{status:?}");
    assert_eq!(replicas().await.len(), 1, "one waits to say why");
    cordon(home, false).await;
    p.settle().await;
    let placed = replicas().await;
    let running: Vec<_> = placed.iter().filter(|(phase, ..)| *phase == Phase::Running).collect();
    assert_eq!(running.len(), 7, "{placed:?}");
    assert!(running.iter().all(|(_, pinned, at)| at.as_deref() == Some(home) && pinned == at), "{placed:?}");
}

/// Counts a pass ended when dropped (the pass's future done, however it returns).
fn count_on_drop(ended: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> impl Drop {
    struct Ended(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    Ended(ended)
}

/// A reconciler that counts its passes and changes nothing.
struct Counting {
    name: &'static str,
    woken_by: berth_controllers::runner::WokenBy,
    passes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Passes ended.
    ended: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// A scheduler's cycle that each pass takes as long as (`cycle_ms`) and reports; none:
    /// a pass that changes nothing, at once.
    cycle: Option<scheduler::SchedulerStatus>,
}

impl berth_controllers::runner::Reconciler for Counting {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        "counts its passes"
    }
    fn period(&self, _: &berth_controllers::Config) -> std::time::Duration {
        std::time::Duration::from_secs(3600)
    }
    fn woken_by(&self) -> berth_controllers::runner::WokenBy {
        self.woken_by
    }
    fn reconcile<'a>(&'a mut self, _: &'a berth_controllers::Context) -> berth_controllers::runner::Pass<'a> {
        self.passes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (cycle, ended) = (self.cycle.clone(), self.ended.clone());
        Box::pin(async move {
            let _ended = count_on_drop(ended);
            let Some(cycle) = cycle else {
                return Ok(berth_controllers::runner::Passed {
                    changes: 0,
                    waits_on_time: false,
                    rest: std::time::Duration::ZERO,
                    rest_for_submissions: std::time::Duration::ZERO,
                    status: json!({}),
                });
            };
            // The cycle's own work, as long as it says it took.
            tokio::time::sleep(std::time::Duration::from_secs_f64(cycle.cycle_ms / 1000.0)).await;
            Ok(berth_controllers::runner::Passed::of(&cycle))
        })
    }
}

/// What wakes a controller is what it declares, not where it stands in the list: three
/// reconcilers (woken by their period only, by a change beyond pending work, by a change that concerns the
/// scheduler) registered in one order and then in the reverse see the same passes for the
/// same changes sent through the store's change feed.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_registration_order_changes_no_wake_up(db: berth_store::PgPool) {
    use berth_controllers::runner::WokenBy;
    use berth_store::changes::{Change, notify};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;
    let p = Plane::new(db).await;
    let mut seen = Vec::new();
    for reversed in [false, true] {
        let declared = [
            ("period", WokenBy::Period),
            ("beyond", WokenBy::BeyondPending),
            ("scheduling", WokenBy::SchedulingChange),
        ];
        let counters: Vec<_> = declared.iter().map(|_| std::sync::Arc::new(AtomicUsize::new(0))).collect();
        let mut list: Vec<Box<dyn berth_controllers::runner::Reconciler>> = declared
            .iter()
            .zip(&counters)
            .map(|(&(name, woken_by), passes)| {
                Box::new(Counting { name, woken_by, passes: passes.clone(), ended: Default::default(), cycle: None })
                    as Box<dyn berth_controllers::runner::Reconciler>
            })
            .collect();
        if reversed {
            list.reverse();
        }
        let mut running = berth_controllers::runner::start_these(&p.ctx, "order-test", list);
        let counts = || counters.iter().map(|c| c.load(SeqCst)).collect::<Vec<_>>();
        // Each runs once at start; a change is sent until the listener has seen one.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while counts()[1] < 2 {
            assert!(std::time::Instant::now() < deadline, "the listener never woke anyone: {:?}", counts());
            notify(&p.ctx.db, &Change::Table("flavors".into())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The counts once no pass has run for 200 ms (a change that wakes nobody shows only
        // as nothing happening, so some quiet time is the evidence).
        let settled = || async {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let before = counts();
                tokio::time::sleep(Duration::from_millis(200)).await;
                if counts() == before {
                    return before;
                }
                assert!(std::time::Instant::now() < deadline, "the passes never settled: {:?}", counts());
            }
        };
        let mut steps = vec![settled().await];
        for change in [
            Change::WorkloadStatuses(vec![Phase::Dispatched, Phase::Running]),
            Change::Table("teams".into()),
            Change::WorkloadStatuses(vec![Phase::Succeeded]),
            Change::Submitted,
            Change::WorkloadStatuses(vec![Phase::Pending]),
        ] {
            let (any_before, scheduling_before) = (counts()[1], counts()[2]);
            notify(&p.ctx.db, &change).await.unwrap();
            // "beyond" is woken by every change but one of pending work only, "scheduling"
            // by those: its pass says the change arrived.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while counts()[1] == any_before && counts()[2] == scheduling_before {
                assert!(std::time::Instant::now() < deadline, "{change:?} woke nobody: {:?}", counts());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            steps.push(settled().await);
        }
        running.shutdown().await;
        let deltas: Vec<Vec<usize>> =
            steps.windows(2).map(|w| w[1].iter().zip(&w[0]).map(|(after, before)| after - before).collect()).collect();
        seen.push(deltas);
    }
    // [period, beyond, scheduling] per change: a status write that takes or frees nothing
    // the scheduler counts wakes only "beyond"; a team's change and a finished workload
    // wake both; a submission and a write of pending reasons wake only "scheduling".
    assert_eq!(seen[0], [[0, 1, 0], [0, 1, 1], [0, 1, 1], [0, 0, 1], [0, 0, 1]], "registered in order");
    assert_eq!(seen[1], seen[0], "registered in reverse");
}

/// A scheduler kept busy by submissions with no room for them spends at most a fifth of the
/// time in its cycles: cycles of 150 ms that admit nothing start at least 750 ms apart (they
/// rest 4 times as long as they ran), so while one that admits runs 10 cycles back to back
/// (1.5 s or more), it runs at most one more than a 750 ms gap each allows. A change that may
/// free room, sent as such a rest begins, ends it once the cycle has rested as long as it ran
/// (the next starts within 750 ms of the last); a submission does not.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_scheduler_that_admits_nothing_rests_until_room_may_have_come_free(db: berth_store::PgPool) {
    use berth_controllers::runner::{Report, WokenBy};
    use berth_store::changes::{Change, notify};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};
    let p = Plane::new(db).await;
    let (resting, admitting) = (std::sync::Arc::new(AtomicUsize::new(0)), std::sync::Arc::new(AtomicUsize::new(0)));
    let rested = std::sync::Arc::new(AtomicUsize::new(0));
    let cycle =
        |admitted| scheduler::SchedulerStatus { admitted, explained: 100, cycle_ms: 150.0, ..Default::default() };
    let busy = |name, passes: &std::sync::Arc<AtomicUsize>, ended: &std::sync::Arc<AtomicUsize>, admitted| {
        let (woken_by, passes, ended) = (WokenBy::SchedulingChange, passes.clone(), ended.clone());
        Box::new(Counting { name, woken_by, passes, ended, cycle: Some(cycle(admitted)) })
            as Box<dyn berth_controllers::runner::Reconciler>
    };
    let list = vec![busy("resting", &resting, &rested, 0), busy("admitting", &admitting, &Default::default(), 1)];
    let started = Instant::now();
    let mut running = berth_controllers::runner::start_these(&p.ctx, "busy-test", list);
    while admitting.load(SeqCst) < 10 {
        assert!(started.elapsed() < Duration::from_secs(20), "{} cycles that admit in 20 s", admitting.load(SeqCst));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (ran, took) = (resting.load(SeqCst), started.elapsed());
    let allowed = 1 + usize::try_from(took.as_millis() / 750).unwrap();
    assert!(
        (2..=allowed).contains(&ran),
        "{ran} cycles of 150 ms that admitted nothing in {took:?} (at most {allowed})"
    );
    // The gap from the start of the next cycle that admits nothing to the one after, with
    // `change` sent as soon as the first has ended (within its 150 ms rest).
    let gap_with = |change: Change| {
        let (resting, rested, db) = (resting.clone(), rested.clone(), p.ctx.db.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let next_start = |after: usize| {
                let resting = resting.clone();
                async move {
                    while resting.load(SeqCst) == after {
                        assert!(Instant::now() < deadline, "no cycle started in 10 s");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    (resting.load(SeqCst), Instant::now())
                }
            };
            let (ran, first) = next_start(resting.load(SeqCst)).await;
            while rested.load(SeqCst) < ran {
                assert!(Instant::now() < deadline, "the cycle never ended");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            notify(&db, &change).await.unwrap();
            let (_, second) = next_start(ran).await;
            second - first
        }
    };
    let after_room = gap_with(Change::Table("clusters".into())).await;
    assert!(after_room < Duration::from_millis(750), "the next cycle started {after_room:?} after the last");
    let after_submission = gap_with(Change::Submitted).await;
    assert!(
        after_submission >= Duration::from_millis(740),
        "the next cycle started {after_submission:?} after the last"
    );
    running.shutdown().await;
    // `/api/v1/controllers` says how long each rests after its last pass.
    let statuses = berth_store::controller::controller_status_list(&p.ctx.db).await.unwrap();
    let rests = |name: &str| {
        let (_, _, status, _) = statuses.iter().find(|(n, ..)| n == name).unwrap();
        (status["rest_ms"].as_f64(), status["rest_for_submissions_ms"].as_f64())
    };
    assert_eq!(rests("resting"), (Some(150.0), Some(600.0)), "{statuses:?}");
    assert_eq!(rests("admitting"), (Some(0.0), Some(0.0)), "{statuses:?}");
    let took_long = scheduler::SchedulerStatus { cycle_ms: 14_000.0, ..Default::default() };
    assert_eq!(took_long.rest(), scheduler::REST_AT_MOST);
    assert_eq!(took_long.rest_for_submissions(), scheduler::REST_AT_MOST);
    assert_eq!(cycle(1).rest_for_submissions(), Duration::ZERO);
    // With GPUs free (a gap a new submission may fit), or new reasons left for later, it
    // rests only as long as it ran.
    let with_room = scheduler::SchedulerStatus { free_gpus: 2.0, ..cycle(0) };
    assert_eq!(with_room.rest_for_submissions(), Duration::from_millis(150));
    let behind = scheduler::SchedulerStatus { deferred: 10, ..cycle(0) };
    assert_eq!(behind.rest_for_submissions(), Duration::from_millis(150));
}

/// A cycle that admits nothing counts the GPUs still free (a new submission may fit them,
/// so it rests only as long as it ran); with none free, it rests longer while only
/// submissions wake it.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cycle_that_admits_nothing_counts_the_gpus_left_free(db: berth_store::PgPool) {
    use berth_controllers::runner::Report;
    let p = Plane::new(db).await;
    p.team("nlp", None, 16, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    p.submit("nlp", "a", 1, 6.0, json!({})).await;
    p.settle().await;
    p.submit("nlp", "big", 2, 8.0, json!({})).await;
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.admitted, cycle.free_gpus), (0, 10.0), "{cycle:?}");
    assert_eq!(cycle.rest_for_submissions(), cycle.rest());
    p.submit("nlp", "b", 1, 8.0, json!({})).await;
    p.submit("nlp", "c", 1, 1.0, json!({})).await;
    p.submit("nlp", "d", 1, 0.5, json!({})).await;
    p.settle().await;
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.admitted, cycle.free_gpus), (0, 0.5), "{cycle:?}");
    p.submit("nlp", "e", 1, 0.5, json!({})).await;
    p.settle().await;
    let cycle = scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((cycle.admitted, cycle.free_gpus), (0, 0.0), "{cycle:?}");
    assert_eq!(p.phase("nlp", "big").await, Phase::Pending);
    assert!(cycle.rest_for_submissions() > cycle.rest(), "{cycle:?}");
}

/// Status sync sleeps while no work is on a backend (an idle site no longer reads its
/// clusters every 500 ms), and a dispatch wakes it: with every controller running and
/// status sync's first pass done with nothing to watch, a workload submitted then is seen
/// running, and once its job ends on the simulated clock, done, each well within the
/// resync (10 s) it would otherwise wait for.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn status_sync_sleeps_while_nothing_runs_and_a_dispatch_wakes_it(db: berth_store::PgPool) {
    use std::time::{Duration, Instant};
    assert!(!status_sync::StatusSyncStatus::default().waits_on_time());
    assert!(status_sync::StatusSyncStatus { watched: 1, ..Default::default() }.waits_on_time());
    let p = Plane::new(db).await;
    p.team("nlp", None, 8, None).await;
    p.cluster("c1", 1, json!({})).await;
    let mut running = berth_controllers::runner::start(&p.ctx, "idle-test");
    // Its first pass found nothing on a backend (and stored so): from then on it sleeps.
    let start = Instant::now();
    loop {
        let statuses = berth_store::controller::controller_status_list(&p.ctx.db).await.unwrap();
        let idle =
            statuses.iter().any(|(name, _, status, _)| name == "status_sync" && status["last"]["ok"]["watched"] == 0);
        if idle {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "status sync stored no pass in 10 s: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.submit("nlp", "late", 1, 8.0, json!({"sim": {"duration_seconds": 60}})).await;
    let until = |phase: Phase| {
        let p = &p;
        async move {
            let start = Instant::now();
            while p.phase("nlp", "late").await != phase {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "not {phase:?} after 5 s: {:?}",
                    p.phase("nlp", "late").await
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    until(Phase::Running).await;
    p.advance(61);
    until(Phase::Succeeded).await;
    running.shutdown().await;
}

/// `spec.placement.flavor_policy` reaches the scheduler: of two workloads that accept h100
/// and l4, the ordered one takes h100 (first in its list) and the best_fit one takes the
/// 2-GPU l4 node, where it leaves less room unused.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_best_fit_workload_takes_the_flavor_it_fragments_least(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.flavor("l4").await;
    let quotas = json!([{"flavor": "h100", "guaranteed": 8}, {"flavor": "l4", "guaranteed": 2}]);
    let input = serde_json::from_value(json!({"spec": {"quotas": quotas}})).unwrap();
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "nlp", &input, None).await.unwrap();
    p.cluster("big", 1, json!({})).await;
    let l4 = json!([{"name": "n", "count": 1, "flavor": "l4", "gpus_per_node": 2}]);
    p.apply_cluster("small", json!({"spec": {"kind": "sim", "sim": {"node_groups": l4}}})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let either = json!({"count": 1, "resources": {"flavors": ["h100", "l4"], "gpus": 1}});
    p.submit("nlp", "ordered", 1, 1.0, json!({"tasks": either})).await;
    p.submit("nlp", "best", 1, 1.0, json!({"tasks": either, "placement": {"flavor_policy": "best_fit"}})).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    let flavor = |w: Workload| w.status.admission.map(|a| (a.flavor, a.cluster));
    assert_eq!(flavor(p.workload("nlp", "ordered").await), Some(("h100".into(), "big".into())));
    assert_eq!(flavor(p.workload("nlp", "best").await), Some(("l4".into(), "small".into())));
}

/// A cluster's `spec.packing` reaches the scheduler. Four 1-GPU nodes: a 0.4 task, then
/// two gangs of two 0.5 tasks, each filling a node. A 0.3 task on `fragmentation` goes to
/// the empty node, where the 0.7 left still takes the 0.5 and 0.4 tasks in sight; on
/// `best_fit` (the same cluster, changed) the next one goes beside the 0.4, where it
/// leaves the least room.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cluster_that_packs_against_fragmentation_keeps_usable_room(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 4, None).await;
    let spec = |packing: &str| {
        let nodes = json!([{"name": "n", "count": 4, "flavor": "h100", "gpus_per_node": 1}]);
        json!({"spec": {"kind": "sim", "packing": packing, "sim": {"node_groups": nodes}}})
    };
    p.apply_cluster("shared", spec("fragmentation")).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    let node_of = |w: Workload| w.status.admission.expect("admitted").placement[0].node.clone();
    for (name, count, gpus) in [("r0", 1, 0.4), ("r1", 2, 0.5), ("r2", 2, 0.5), ("small", 1, 0.3)] {
        p.submit("a", name, count, gpus, json!({})).await;
        scheduler::reconcile(&p.ctx).await.unwrap();
    }
    let beside_r0 = node_of(p.workload("a", "r0").await);
    let small = node_of(p.workload("a", "small").await);
    assert_ne!(small, beside_r0);
    for r in ["r1", "r2"] {
        assert_ne!(node_of(p.workload("a", r).await), small);
    }

    p.apply_cluster("shared", spec("best_fit")).await;
    p.submit("a", "small2", 1, 0.3, json!({})).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!(node_of(p.workload("a", "small2").await), beside_r0);
}

/// What no team can use within its fair share is lent past it, and the workload left
/// waiting is told why. Teams a and b, no guarantees, shares 12 and 12 of 24 GPUs, each
/// wanting 16: a1 and b1 run within the shares, a2 (submitted before b2) gets the last
/// node lent, borrowed, and b2 waits with the share and where the room went.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_room_no_team_can_use_within_its_share_is_lent(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("a", None, 0, None).await;
    p.team("b", None, 0, None).await;
    p.cluster("c", 3, json!({})).await;
    cluster_health::reconcile(&p.ctx).await.unwrap();
    for (team, name) in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")] {
        p.submit(team, name, 1, 8.0, json!({})).await;
    }
    scheduler::reconcile(&p.ctx).await.unwrap();
    let a2 = p.workload("a", "a2").await;
    assert!(a2.status.admission.expect("a2 is lent the last node").borrowed);
    for (team, name) in [("a", "a1"), ("b", "b1")] {
        assert!(p.workload(team, name).await.status.admission.is_some(), "{name}");
    }
    let reason = p.workload("b", "b2").await.status.pending_reason.expect("b2 waits");
    assert_eq!(reason.code, "FairShareReached");
    assert!(
        reason.message.contains("fair share 12") && reason.message.contains("went to other work"),
        "{}",
        reason.message
    );
}

/// Fairness over time (`spec.fair_sharing`): team a ran the whole cluster for two hours
/// while b was idle. When both want all of it, a's recent use (from the ledger, decayed by
/// the half-life) weighs down what a borrows: 16 idle GPUs split 1:4, not 1:1. The quota
/// preview of b without the setting shows the shares going back to 8 and 8.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_team_that_used_much_lately_borrows_less_when_its_tree_shares_over_time(db: berth_store::PgPool) {
    const DAY: u32 = 86_400;
    let p = Plane::new(db).await;
    let fair =
        json!({"quotas": [{"flavor": "h100", "guaranteed": 0}], "fair_sharing": {"usage_half_life_seconds": DAY}});
    for team in ["a", "b"] {
        let input = serde_json::from_value(json!({ "spec": fair })).unwrap();
        berth_app::team::team_apply(&p.ctx.db, &p.actor, team, &input, None).await.unwrap();
    }
    p.cluster("sim-a", 2, json!({})).await;
    let two_hours = json!({"sim": {"duration_seconds": 7200}});
    for name in ["a1", "a2"] {
        p.submit("a", name, 1, 8.0, two_hours.clone()).await;
    }
    p.settle().await;
    p.advance(7200);
    p.settle().await;
    assert_eq!(p.phase("a", "a1").await, Phase::Succeeded);

    // 16 GPUs for 2 hours, each hour counted 2^(−age / 1 day): H/ln 2 · (1 − 2^(−2/24)).
    let p = &p;
    let team = async |name: &str| berth_app::team::team_get(&p.ctx.db, &p.actor, name).await.unwrap();
    let recent = team("a").await.status.recent_usage.expect("a's recent use");
    assert_eq!(recent.usage_half_life_seconds, DAY);
    let recent = recent.flavors;
    let h = f64::from(DAY) / 3600.0;
    let expected = 16.0 * h / std::f64::consts::LN_2 * (1.0 - 2f64.powf(-2.0 / 24.0));
    assert_eq!(recent.len(), 1, "{recent:?}");
    assert!((recent[0].gpu_hours - expected).abs() < 0.05, "{recent:?} against {expected}");
    assert_eq!(recent[0].gpu_hours, recent[0].subtree_gpu_hours);
    assert_eq!(team("b").await.status.recent_usage.expect("b's, added up").flavors, []);

    // Both want the whole cluster. U = 1 and 0, S = ½: a's weight × 2^−2, b's × 1.
    for i in 0..16 {
        p.submit("a", &format!("a-more-{i}"), 1, 1.0, json!({})).await;
        p.submit("b", &format!("b-more-{i}"), 1, 1.0, json!({})).await;
    }
    p.settle().await;
    let share = |t: berth_core::team::Team| t.status.usage[0].fair_share;
    let (share_a, share_b) = (share(team("a").await), share(team("b").await));
    assert!((share_a - 3.2).abs() < 0.01 && (share_b - 12.8).abs() < 0.01, "{share_a} {share_b}");
    let mut running = [0, 0];
    for i in 0..16 {
        running[0] += usize::from(p.phase("a", &format!("a-more-{i}")).await == Phase::Running);
        running[1] += usize::from(p.phase("b", &format!("b-more-{i}")).await == Phase::Running);
    }
    assert_eq!(running.iter().sum::<usize>(), 16, "{running:?}");
    assert!(running[0] <= 4 && running[1] >= 12, "{running:?}");

    // Without it on b, the top-level teams no longer all share over time: 8 and 8.
    let spec: berth_core::team::TeamSpec =
        serde_json::from_value(json!({"quotas": [{"flavor": "h100", "guaranteed": 0}]})).unwrap();
    let preview = berth_controllers::preview::quota_preview(&p.ctx.db, &p.ctx.config, "b", &spec, p.ctx.clock.now())
        .await
        .unwrap();
    let shares: Vec<(&str, f64, f64)> =
        preview.fair_shares.iter().map(|c| (c.team.as_str(), c.before, c.after)).collect();
    assert_eq!(shares.len(), 2, "{:?}", preview.summary);
    for (team, before, after) in shares {
        let was = if team == "a" { 3.2 } else { 12.8 };
        assert!((before - was).abs() < 0.01 && (after - 8.0).abs() < 0.01, "{team}: {before} → {after}");
    }
    // The same spec as now changes nothing.
    let same: berth_core::team::TeamSpec = serde_json::from_value(fair.clone()).unwrap();
    let preview = berth_controllers::preview::quota_preview(&p.ctx.db, &p.ctx.config, "b", &same, p.ctx.clock.now())
        .await
        .unwrap();
    assert!(preview.fair_shares.is_empty(), "{:?}", preview.summary);

    // Turned off on b (its status is cleared), then on again: until b's use has been
    // added up, the top-level teams are divided as without fairness over time (not as if b
    // had used nothing, which would give it more than a); then by it.
    let apply = async |spec: &serde_json::Value| {
        let input = serde_json::from_value(json!({ "spec": spec })).unwrap();
        berth_app::team::team_apply(&p.ctx.db, &p.actor, "b", &input, None).await.unwrap();
    };
    apply(&json!({"quotas": [{"flavor": "h100", "guaranteed": 0}]})).await;
    p.settle().await;
    assert!(team("b").await.status.recent_usage.is_none());
    let mut longer = fair;
    longer["fair_sharing"]["usage_half_life_seconds"] = json!(2 * DAY);
    apply(&longer).await;
    scheduler::reconcile(&p.ctx).await.unwrap();
    assert_eq!((share(team("a").await), share(team("b").await)), (8.0, 8.0));
    p.settle().await;
    assert_eq!(team("b").await.status.recent_usage.expect("added up").usage_half_life_seconds, 2 * DAY);
    let (share_a, share_b) = (share(team("a").await), share(team("b").await));
    assert!(share_a < 8.0 && share_b > 8.0, "{share_a} {share_b}");
}

/// Inside a tree that shares over time (the setting on its top-level team only), children
/// are weighed by their subtrees' recent use. In dept, xc (under x) ran 16 GPUs for two
/// hours and was then deleted: its use stays with x (its nearest remaining team) at once,
/// so when x and y both want all of dept's 16, y's fair share is 12.8 and x's 3.2. dept's
/// status counts x's use in its subtree, none as its own.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn inside_a_tree_that_shares_over_time_the_child_that_used_less_borrows_more(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    let dept = json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 16}],
        "fair_sharing": {"usage_half_life_seconds": 86_400}}});
    berth_app::team::team_apply(&p.ctx.db, &p.actor, "dept", &serde_json::from_value(dept).unwrap(), None)
        .await
        .unwrap();
    p.team("x", Some("dept"), 0, None).await;
    p.team("xc", Some("x"), 0, None).await;
    p.team("y", Some("dept"), 0, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    for name in ["x1", "x2"] {
        p.submit("xc", name, 1, 8.0, json!({"sim": {"duration_seconds": 7200}})).await;
    }
    p.settle().await;
    p.advance(7200);
    p.settle().await;
    let team = async |name: &str| berth_app::team::team_get(&p.ctx.db, &p.actor, name).await.unwrap();
    let recent = async |name: &str| team(name).await.status.recent_usage.expect("added up").flavors;
    let used = recent("xc").await[0].gpu_hours;
    assert!(used > 30.0, "{used}");
    for w in ["x1", "x2"] {
        berth_app::workload::workload_delete(&p.ctx.db, &p.actor, "xc", w, None).await.unwrap();
    }
    p.settle().await;
    for i in 0..16 {
        p.submit("x", &format!("x-more-{i}"), 1, 1.0, json!({})).await;
        p.submit("y", &format!("y-more-{i}"), 1, 1.0, json!({})).await;
    }
    berth_app::team::team_delete(&p.ctx.db, &p.actor, "xc", None).await.unwrap();
    // At once, before the fair-sharing task's next pass, and after it.
    let share = |t: berth_core::team::Team| t.status.usage[0].fair_share;
    for pass in ["the scheduler's", "every controller's"] {
        if pass == "the scheduler's" {
            scheduler::reconcile(&p.ctx).await.unwrap();
        } else {
            p.settle().await;
        }
        let (x, d) = (recent("x").await, recent("dept").await);
        assert!((x[0].gpu_hours - used).abs() < 0.01 && (x[0].subtree_gpu_hours - used).abs() < 0.01, "{x:?}");
        assert!(d[0].gpu_hours == 0.0 && (d[0].subtree_gpu_hours - used).abs() < 0.01, "{d:?}");
        let y = recent("y").await;
        assert!(y.iter().all(|f| f.gpu_hours < 0.01), "y has used next to nothing: {y:?}");
        let (share_x, share_y) = (share(team("x").await), share(team("y").await));
        assert!(
            (share_x - 3.2).abs() < 0.01 && (share_y - 12.8).abs() < 0.01,
            "after {pass} pass: {share_x} {share_y}"
        );
    }
}

/// The quota preview of a team moved to another parent plans with the tree as it would be:
/// c, under dept (guaranteed 8), has dept's 8 while o (guaranteed 8) and c both want all
/// 16; moved to the top level with no guarantee of its own, c would share only what dept
/// leaves idle with o: 4.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_quota_preview_of_a_team_moved_plans_with_its_new_parent(db: berth_store::PgPool) {
    let p = Plane::new(db).await;
    p.team("dept", None, 8, None).await;
    p.team("c", Some("dept"), 0, None).await;
    p.team("o", None, 8, None).await;
    p.cluster("sim-a", 2, json!({})).await;
    for team in ["c", "o"] {
        p.submit(team, "all", 2, 8.0, json!({})).await;
    }
    p.settle().await;
    let spec: berth_core::team::TeamSpec =
        serde_json::from_value(json!({"quotas": [{"flavor": "h100", "guaranteed": 0}]})).unwrap();
    let preview = berth_controllers::preview::quota_preview(&p.ctx.db, &p.ctx.config, "c", &spec, p.ctx.clock.now())
        .await
        .unwrap();
    let c = preview.fair_shares.iter().find(|s| s.team == "c").expect("c's share changes");
    assert_eq!((c.before, c.after), (8.0, 4.0), "{:?}", preview.summary);
}
