//! A workload's life as its owner sees it: who owns it and who may touch it, cancelling
//! with the history kept, and retention removing it later.

use std::time::Duration;

use berth_core::auth::Role;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{Server, WorkloadBody, token, two_teams_on_one_cluster};

fn names(reply: &Value) -> Vec<&str> {
    reply["items"].as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect()
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_submitter_owns_a_workload_and_only_it_or_a_team_admin_may_change_or_cancel_it(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let alice = token("alice", &[(Role::Member, Some("nlp"))]);
    let bob = token("bob", &[(Role::Member, Some("nlp"))]);
    let lead = token("lead", &[(Role::TeamAdmin, Some("research"))]);
    let path = "/api/v1/teams/nlp/workloads/mine";
    let put = s.send_as(Some(&alice), Method::PUT, path, Some(&WorkloadBody::new().json())).await;
    assert_eq!(put.status, 201, "{}", put.body);
    assert_eq!(put.body["metadata"]["owner"], json!({"subject": "alice", "issuer": "berth"}));
    // A batch records its submitter too (the one-statement fast path).
    let mut item = WorkloadBody::new().json();
    item["metadata"]["name"] = json!("bobs");
    let batch = json!({"items": [item]});
    let posted = s.send_as(Some(&bob), Method::POST, "/api/v1/teams/nlp/workloads", Some(&batch)).await;
    assert_eq!(posted.status, 201, "{}", posted.body);
    assert_eq!(posted.body["items"][0]["metadata"]["owner"]["subject"], "bob");
    assert_eq!(s.get("/api/v1/teams/nlp/workloads/bobs").await.body["metadata"]["owner"]["subject"], "bob");

    // Filtered by owner, `me` being the caller.
    let as_alice = s.send_as(Some(&alice), Method::GET, "/api/v1/workloads?owner=me", None).await;
    assert_eq!(names(&as_alice.body), ["mine"], "{}", as_alice.body);
    assert_eq!(names(&s.get("/api/v1/teams/nlp/workloads?owner=bob").await.body), ["bobs"]);
    assert!(names(&s.get("/api/v1/workloads?owner=me").await.body).is_empty(), "the admin submitted nothing");

    // Bob may not change, cancel or delete Alice's work; nothing changes.
    let before = s.get(path).await.body;
    let changed = WorkloadBody::new().priority(9).json();
    let same = WorkloadBody::new().json();
    for (method, p, body) in [
        (Method::PUT, path.to_owned(), Some(&changed)),
        // The same spec again too (it was a 200 with the whole object).
        (Method::PUT, path.to_owned(), Some(&same)),
        (Method::POST, format!("{path}/cancel"), None),
        (Method::DELETE, path.to_owned(), None),
    ] {
        let r = s.send_as(Some(&bob), method.clone(), &p, body).await;
        r.assert_problem(403, None);
        assert!(r.body["detail"].as_str().unwrap().contains("alice's"), "{method} {}", r.body);
    }
    assert_eq!(s.get(path).await.body, before, "nothing changed");
    // Alice may; so may an admin of a team above.
    let mine = s.send_as(Some(&alice), Method::PUT, path, Some(&changed)).await;
    assert_eq!((mine.status.as_u16(), &mine.body["spec"]["priority"]), (200, &json!(9)), "{}", mine.body);
    let cancelled = s.send_as(Some(&lead), Method::POST, &format!("{path}/cancel"), None).await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.body);
    assert_eq!(cancelled.body["status"]["phase"], "Cancelled");
    assert_eq!(cancelled.body["status"]["cancellation"]["by"], "lead");
    assert_eq!(cancelled.body["metadata"]["owner"]["subject"], "alice", "the owner stays");
    // The audit log says who cancelled.
    let verb: String =
        sqlx::query_scalar("SELECT verb FROM audit_log WHERE actor = 'lead'").fetch_one(&s.db).await.unwrap();
    assert_eq!(verb, "cancel");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cancelled_workload_stops_its_job_and_stays_with_its_history_until_retention_removes_it(
    db: berth_store::PgPool,
) {
    let s = Server::start(db).await;
    let mut ctx = two_teams_on_one_cluster(&s, 8).await;
    ctx.config.cancel_grace = Duration::ZERO;
    let path = "/api/v1/teams/a/workloads/train";
    s.put_ok(path, &WorkloadBody::new().gpus(8.0).json(), 201).await;
    s.put_ok("/api/v1/teams/a/workloads/waiting", &WorkloadBody::new().gpus(8.0).count(2).json(), 201).await;
    berth_controllers::scheduler::reconcile(&ctx).await.unwrap();
    berth_controllers::dispatcher::reconcile(&ctx).await.unwrap();
    berth_controllers::status_sync::reconcile(&ctx).await.unwrap();
    assert_eq!(s.get(path).await.body["status"]["phase"], "Running");

    // Cancelled while running: the workload keeps its phase, marked, until its job stops.
    let asked = s.send(Method::POST, &format!("{path}/cancel"), None, &[]).await;
    assert_eq!(asked.status, 202, "{}", asked.body);
    assert_eq!(asked.body["status"]["phase"], "Running");
    assert_eq!(asked.body["status"]["cancellation"]["by"], "admin");
    let again = s.send(Method::POST, &format!("{path}/cancel"), None, &[]).await;
    assert_eq!((again.status.as_u16(), &again.body["status"]["phase"]), (202, &json!("Running")));
    // The job stops within its (zero) grace period: each pass asks until it is gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        berth_controllers::deletion::reconcile(&ctx).await.unwrap();
        let phase = s.get(path).await.body["status"]["phase"].clone();
        if phase == "Cancelled" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not Cancelled within 10 s: {phase}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w = s.get(path).await.body;
    assert!(w["status"]["started_at"].is_string() && w["status"]["finished_at"].is_string(), "{w}");
    assert!(w["status"]["message"].as_str().unwrap().starts_with("cancelled by admin"), "{w}");
    let reasons = s.event_reasons(path).await;
    assert_eq!(reasons, ["Created", "Admitted", "Running", "CancelRequested", "StopRequested", "Cancelled"]);
    // The job is gone from the cluster: all 16 GPUs are free again.
    berth_controllers::cluster_health::reconcile(&ctx).await.unwrap();
    let cluster = s.get("/api/v1/clusters/c1").await.body;
    assert_eq!(cluster["status"]["inventory"][0]["gpus_free"], 16.0, "{}", cluster["status"]);
    // Listed with the other cancelled ones; ended, so neither cancel nor a change is taken.
    assert_eq!(names(&s.get("/api/v1/workloads?phase=Cancelled").await.body), ["train"]);
    s.send(Method::POST, &format!("{path}/cancel"), None, &[]).await.assert_problem(409, Some("/status/phase"));
    s.put(path, &WorkloadBody::new().gpus(4.0).json()).await.assert_problem(409, Some("/spec"));
    // A pending workload has no job: cancelled at once.
    let pending = s.send(Method::POST, "/api/v1/teams/a/workloads/waiting/cancel", None, &[]).await;
    assert_eq!(pending.body["status"]["phase"], "Cancelled", "{}", pending.body);

    // Kept for the retention period (30 days), then removed.
    ctx.clock.advance(Duration::from_secs(29 * 86_400));
    let kept = berth_controllers::retention::reconcile(&ctx).await.unwrap();
    assert_eq!(kept.removed, 0);
    assert_eq!(s.get(path).await.status, 200);
    ctx.clock.advance(Duration::from_secs(2 * 86_400));
    let removed = berth_controllers::retention::reconcile(&ctx).await.unwrap();
    assert_eq!(removed.removed, 2);
    assert_eq!(s.get(path).await.status, 404);
    // Its run stays in the accounting ledger (the waiting one never held GPUs).
    let ledger: Vec<(String, String, bool)> =
        sqlx::query_as("SELECT workload, outcome, started_at IS NOT NULL FROM usage_ledger ORDER BY workload")
            .fetch_all(&s.db)
            .await
            .unwrap();
    assert_eq!(ledger, [("train".to_owned(), "cancelled".to_owned(), true)]);
    // Unfinished work is never removed by retention.
    s.put_ok("/api/v1/teams/a/workloads/new", &WorkloadBody::new().json(), 201).await;
    ctx.clock.advance(Duration::from_secs(365 * 86_400));
    assert_eq!(berth_controllers::retention::reconcile(&ctx).await.unwrap().removed, 0);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_retried_post_with_an_idempotency_key_answers_the_first_result_and_creates_nothing_more(
    db: berth_store::PgPool,
) {
    let s = std::sync::Arc::new(Server::start(db).await);
    s.seed().await;
    let mut item = WorkloadBody::new().json();
    item["metadata"]["generate_name"] = json!("sweep-");
    let batch = json!({"items": [item.clone(), item.clone()]});
    let post = |key: &'static str, body: Value| {
        let s = s.clone();
        async move { s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&body), &[("Idempotency-Key", key)]).await }
    };
    let uids = |r: &Value| -> Vec<String> {
        r["items"].as_array().unwrap().iter().map(|w| w["metadata"]["uid"].as_str().unwrap().to_owned()).collect()
    };
    // Eight clients retry at once (a timeout, say): one batch is created, every answer is it.
    let retries: Vec<_> = (0..8).map(|_| tokio::spawn(post("key-1", batch.clone()))).collect();
    let mut answers = Vec::new();
    for r in retries {
        answers.push(r.await.unwrap());
    }
    assert!(answers.iter().all(|a| a.status == 201), "{:?}", answers.iter().map(|a| &a.body).collect::<Vec<_>>());
    let first = uids(&answers[0].body);
    assert!(answers.iter().all(|a| uids(&a.body) == first));
    assert_eq!(answers.iter().filter(|a| a.headers.get("idempotent-replayed").is_some()).count(), 7);
    assert_eq!(s.table_counts().await["workloads"], 2, "the generated names were made once");
    // Later, the same: the recorded answer.
    let again = post("key-1", batch.clone()).await;
    assert_eq!((again.status.as_u16(), uids(&again.body)), (201, first.clone()));
    // The key with another batch is refused naming the header; nothing is written.
    let other = json!({"items": [item.clone()]});
    post("key-1", other.clone()).await.assert_problem(422, Some("Idempotency-Key"));
    post("", other.clone()).await.assert_problem(422, Some("Idempotency-Key"));
    assert_eq!(s.table_counts().await["workloads"], 2);
    // A dry run gives the answer the write would: the refusals, the recorded answer.
    let dry = |key: String, body: Value| {
        let s = s.clone();
        async move {
            let headers = [("Idempotency-Key", key.as_str())];
            s.send(Method::POST, "/api/v1/teams/nlp/workloads?dry_run=true", Some(&body), &headers).await
        }
    };
    dry("key-1".into(), other.clone()).await.assert_problem(422, Some("Idempotency-Key"));
    dry("k".repeat(256), other.clone()).await.assert_problem(422, Some("Idempotency-Key"));
    let replayed = dry("key-1".into(), batch.clone()).await;
    assert_eq!((replayed.status.as_u16(), uids(&replayed.body)), (200, first.clone()));
    assert!(replayed.headers.get("idempotent-replayed").is_some());
    let fresh = dry("key-3".into(), other.clone()).await;
    assert_eq!(fresh.status, 200, "{}", fresh.body);
    assert!(fresh.headers.get("idempotent-replayed").is_none());
    assert_eq!(s.table_counts().await["workloads"], 2, "no dry run wrote");
    // A new key is a new request; so is the same key from another caller.
    assert_eq!(post("key-2", other.clone()).await.status, 201);
    let alice = token("alice", &[(Role::Member, Some("nlp"))]);
    let as_alice = reqwest::Client::new()
        .post(s.url("/api/v1/teams/nlp/workloads"))
        .bearer_auth(alice)
        .header("Idempotency-Key", "key-1")
        .json(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(as_alice.status(), 201);
    assert!(as_alice.headers().get("idempotent-replayed").is_none());
    assert_eq!(s.table_counts().await["workloads"], 4);
}

/// A job's own token (in its environment from dispatch) authenticates as the workload's
/// attempt: it reads nothing, and acknowledges its own checkpoint only after the stop
/// notice. The acknowledgement stops the job at once instead of at the end of the grace
/// period (30 s here).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_jobs_own_token_acknowledges_its_checkpoint_and_nothing_else(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let mut ctx = two_teams_on_one_cluster(&s, 8).await;
    ctx.job_api = Some(berth_controllers::JobApiConfig { url: s.url(""), issuer: crate::common::issuer() });
    let alice = token("alice", &[(Role::Member, Some("a"))]);
    let bob = token("bob", &[(Role::Member, Some("a"))]);
    let long = json!({"spec": {"kind": "training", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}},
                               "sim": {"duration_seconds": 3600}}});
    for name in ["train", "other"] {
        let put = s.send_as(Some(&alice), Method::PUT, &format!("/api/v1/teams/a/workloads/{name}"), Some(&long)).await;
        assert_eq!(put.status, 201, "{}", put.body);
    }
    berth_controllers::scheduler::reconcile(&ctx).await.unwrap();
    berth_controllers::dispatcher::reconcile(&ctx).await.unwrap();
    let path = "/api/v1/teams/a/workloads/train";
    let w: berth_core::workload::Workload = serde_json::from_value(s.get(path).await.body).unwrap();
    assert_eq!(w.status.phase, berth_core::workload::Phase::Running, "{:?}", w.status);
    let cluster = berth_store::cluster::cluster_fetch(&s.db, "c1").await.unwrap().unwrap();
    let sim = ctx.backends.sim(cluster.metadata.uid).unwrap();
    let env: std::collections::HashMap<_, _> =
        sim.environment(berth_controllers::job_key(&w)).unwrap().into_iter().collect();
    let job = env["BERTH_JOB_TOKEN"].as_str();
    let checkpointed = format!("{path}/checkpointed");
    assert_eq!(env["BERTH_CHECKPOINTED_URL"], s.url(&checkpointed));

    let me = s.send_as(Some(job), Method::GET, "/api/v1/me", None).await;
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.body["workload"], json!({"uid": w.metadata.uid, "attempt": 0, "team": "a"}), "{}", me.body);
    assert_eq!(me.body["grants"], json!([]));
    assert_eq!(s.send_as(Some(job), Method::GET, path, None).await.status, 404, "it reads nothing");
    let other = s.send_as(Some(job), Method::POST, "/api/v1/teams/a/workloads/other/checkpointed", None).await;
    other.assert_problem(404, None);
    let early = s.send_as(Some(job), Method::POST, &checkpointed, None).await;
    early.assert_problem(409, Some("/status/phase"));
    assert!(early.body["detail"].as_str().unwrap().contains("was not told to stop"), "{}", early.body);

    // Told to stop (cancelled by its owner): the job acknowledges, twice; a teammate who
    // may not cancel it may not acknowledge for it either.
    assert_eq!(s.send_as(Some(&alice), Method::POST, &format!("{path}/cancel"), None).await.status, 202);
    berth_controllers::deletion::reconcile(&ctx).await.unwrap();
    assert_eq!(s.send_as(Some(&bob), Method::POST, &checkpointed, None).await.status, 403);
    for _ in 0..2 {
        let ack = s.send_as(Some(job), Method::POST, &checkpointed, None).await;
        assert_eq!(ack.status, 204, "{}", ack.body);
    }
    // One pass stops the job now (not in 30 s); the next finds it gone and ends the workload.
    for _ in 0..2 {
        berth_controllers::deletion::reconcile(&ctx).await.unwrap();
    }
    let ended = s.get(path).await.body;
    assert_eq!(ended["status"]["phase"], "Cancelled", "stopped at once: {ended}");
    assert!(ended["status"]["checkpointed_at"].is_string(), "{ended}");
    let reasons = s.event_reasons(path).await;
    assert_eq!(reasons.iter().filter(|r| *r == "Checkpointed").count(), 1, "{reasons:?}");
    let over = s.send_as(Some(job), Method::POST, &checkpointed, None).await;
    over.assert_problem(409, Some("/status/phase"));
}
