use reqwest::Method;
use serde_json::json;

use crate::common::{Server, WorkloadBody, check_declarative_contract, collect_pages};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn workload_keeps_the_declarative_contract(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let v1 = WorkloadBody::new().json();
    let v2 = WorkloadBody::new().gpus(4.0).count(2).json();
    check_declarative_contract(&s, "/api/v1/teams/nlp/workloads/train", &v1, &v2, 202).await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_new_workload_is_pending_with_a_created_event(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let created = s.put_ok("/api/v1/teams/nlp/workloads/train", &WorkloadBody::new().json(), 201).await;
    assert_eq!(created.body["status"]["phase"], "Pending");
    assert_eq!(created.body["status"]["attempt"], 0);
    assert!(created.body["status"]["submitted_at"].is_string());
    assert_eq!(created.body["metadata"]["team"], "nlp");
    // Status sent by a client is ignored.
    let mut forged = WorkloadBody::new().gpus(2.0).json();
    forged["status"] = json!({"phase": "Succeeded"});
    let updated = s.put_ok("/api/v1/teams/nlp/workloads/train", &forged, 200).await;
    assert_eq!(updated.body["status"]["phase"], "Pending");
    let events = s.get("/api/v1/teams/nlp/workloads/train/events").await;
    let reasons: Vec<&str> =
        events.body["items"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["Created", "SpecUpdated"]);
    s.get("/api/v1/teams/nlp/workloads/nope/events").await.assert_problem(404, None);

    // The flavor policy is kept as sent; the default is not written out.
    assert!(updated.body["spec"]["placement"].get("flavor_policy").is_none(), "{}", updated.body);
    let mut best_fit = WorkloadBody::new().json();
    best_fit["spec"]["placement"] = json!({"flavor_policy": "best_fit"});
    let updated = s.put_ok("/api/v1/teams/nlp/workloads/train", &best_fit, 200).await;
    assert_eq!(updated.body["spec"]["placement"]["flavor_policy"], "best_fit");
    let read = s.get("/api/v1/teams/nlp/workloads/train").await;
    assert_eq!(read.body["spec"]["placement"]["flavor_policy"], "best_fit");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn workload_lists_page_and_filter(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    s.put_ok("/api/v1/teams/vision", &json!({"spec": {}}), 201).await;
    for (team, name, kind, tier) in [
        ("nlp", "b", "training", "gold"),
        ("nlp", "a", "batch", "gold"),
        ("vision", "c", "training", "silver"),
        ("nlp", "d", "inference", "silver"),
        ("vision", "a", "notebook", "bronze"),
    ] {
        let body = WorkloadBody::new().kind(kind).label("tier", tier).json();
        s.put_ok(&format!("/api/v1/teams/{team}/workloads/{name}"), &body, 201).await;
    }
    let page_names = |v: Vec<String>| v;
    assert_eq!(page_names(collect_pages(&s, "/api/v1/workloads", 2).await), ["a", "b", "d", "a", "c"]);
    assert_eq!(collect_pages(&s, "/api/v1/teams/vision/workloads", 1).await, ["a", "c"]);
    assert_eq!(collect_pages(&s, "/api/v1/workloads?team=nlp", 2).await, ["a", "b", "d"]);
    assert_eq!(collect_pages(&s, "/api/v1/workloads?kind=training", 1).await, ["b", "c"]);
    assert_eq!(collect_pages(&s, "/api/v1/workloads?phase=Pending&team=vision", 5).await, ["a", "c"]);
    assert!(collect_pages(&s, "/api/v1/workloads?phase=Running", 5).await.is_empty());
    assert!(collect_pages(&s, "/api/v1/workloads?cluster=sim-a", 5).await.is_empty());
    assert_eq!(collect_pages(&s, "/api/v1/workloads?label_selector=tier%3Dgold", 5).await, ["a", "b"]);
    assert_eq!(collect_pages(&s, "/api/v1/workloads?label_selector=tier!%3Dgold,tier", 1).await, ["d", "a", "c"]);
    assert!(collect_pages(&s, "/api/v1/workloads?label_selector=!tier", 5).await.is_empty());
    assert_eq!(collect_pages(&s, "/api/v1/workloads?name_contains=a", 1).await, ["a", "a"]);
    assert_eq!(collect_pages(&s, "/api/v1/teams/vision/workloads?name_contains=c", 5).await, ["c"]);
    assert!(collect_pages(&s, "/api/v1/workloads?name_contains=e", 5).await.is_empty());
    s.get("/api/v1/workloads?name_contains=A").await.assert_problem(422, Some("name_contains"));
    s.get("/api/v1/workloads?phase=Sleeping").await.assert_problem(400, Some("phase"));
    s.get("/api/v1/workloads?label_selector=a%3Db%20c").await.assert_problem(422, Some("label_selector"));
    s.get("/api/v1/workloads?colour=red").await.assert_problem(400, Some("colour"));
    s.get("/api/v1/teams/ghost/workloads").await.assert_problem(404, None);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn workload_rules_are_enforced_naming_the_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let before = s.table_counts().await;
    let path = "/api/v1/teams/nlp/workloads/w";
    let mut inference_on_training = WorkloadBody::new().json();
    inference_on_training["spec"]["inference"] = json!({"min_replicas": 1, "max_replicas": 2});
    let mut bad_env = WorkloadBody::new().json();
    bad_env["spec"]["run"] = json!({"env": {"1X": "y"}});
    let mut bad_runtime = WorkloadBody::new().json();
    bad_runtime["spec"]["max_runtime_seconds"] = json!(0);
    let mut wrong_team = WorkloadBody::new().json();
    wrong_team["metadata"]["team"] = json!("vision");
    let mut bad_policy = WorkloadBody::new().json();
    bad_policy["spec"]["placement"] = json!({"flavor_policy": "cheapest"});
    let cases = [
        (WorkloadBody::new().flavors(&["h100", "tpu"]).json(), "/spec/tasks/resources/flavors/1"),
        (WorkloadBody::new().flavors(&[]).json(), "/spec/tasks/resources/flavors"),
        (WorkloadBody::new().gpus(1.5).json(), "/spec/tasks/resources/gpus"),
        (WorkloadBody::new().count(0).json(), "/spec/tasks/count"),
        (WorkloadBody::new().priority(5000).json(), "/spec/priority"),
        (WorkloadBody::new().kind("daemon").json(), "/spec/kind"),
        (inference_on_training, "/spec/inference"),
        (bad_env, "/spec/run/env/1X"),
        (bad_runtime, "/spec/max_runtime_seconds"),
        (wrong_team, "/metadata/team"),
        (bad_policy, "/spec/placement/flavor_policy"),
    ];
    for (body, field) in cases {
        s.put(path, &body).await.assert_problem(422, Some(field));
    }
    s.put("/api/v1/teams/ghost/workloads/w", &WorkloadBody::new().json()).await.assert_problem(404, None);
    assert_eq!(s.table_counts().await, before);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn deleting_a_workload_that_reached_a_backend_only_marks_it(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let path = "/api/v1/teams/nlp/workloads/train";
    s.put_ok(path, &WorkloadBody::new().json(), 201).await;
    // Pretend the dispatcher got it to a backend (the controllers do this in production).
    sqlx::query("UPDATE workloads SET phase = 'Running', status = jsonb_set(status, '{phase}', '\"Running\"')")
        .execute(&s.db)
        .await
        .unwrap();
    let marked = s.delete(path).await;
    assert_eq!(marked.status, 202);
    assert!(marked.body["metadata"]["deletion_timestamp"].is_string());
    let still = s.get(path).await;
    assert_eq!(still.status, 200, "kept until the controllers cancel the backend job");
    assert!(still.body["metadata"]["deletion_timestamp"].is_string());
    // Re-applying a workload that is being deleted is refused; deleting again is harmless.
    s.put(path, &WorkloadBody::new().json()).await.assert_problem(409, None);
    assert_eq!(s.send(Method::DELETE, path, None, &[]).await.status, 202);
    let reasons = s.event_reasons(path).await;
    assert_eq!(reasons, ["Created", "DeletionRequested"]);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn audit_records_every_mutation_with_generations(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let path = "/api/v1/teams/nlp/workloads/train";
    s.put_ok(path, &WorkloadBody::new().json(), 201).await;
    s.put_ok(path, &WorkloadBody::new().json(), 200).await;
    s.put_ok(path, &WorkloadBody::new().gpus(2.0).json(), 200).await;
    s.delete(path).await;
    let audit = s.get("/api/v1/audit?kind=workload&name=train").await;
    let records = audit.body["items"].as_array().unwrap();
    let summary: Vec<(String, Option<i64>, Option<i64>)> = records
        .iter()
        .map(|r| {
            (r["verb"].as_str().unwrap().to_owned(), r["generation_before"].as_i64(), r["generation_after"].as_i64())
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("delete".to_owned(), Some(2), None),
            ("update".to_owned(), Some(1), Some(2)),
            ("create".to_owned(), None, Some(1)),
        ]
    );
    assert!(records.iter().all(|r| r["actor"] == "admin" && r["team"] == "nlp" && r["request_id"].is_string()));
    // The update keeps the spec before and after it; the create and delete keep none.
    let update = &records[1];
    let gpus = |spec: &serde_json::Value| spec["tasks"]["resources"]["gpus"].as_f64();
    assert_eq!((gpus(&update["spec_before"]), gpus(&update["spec_after"])), (Some(1.0), Some(2.0)), "{update}");
    assert!(records[0].get("spec_before").is_none() && records[2].get("spec_after").is_none());
    let all = collect_audit(&s).await;
    assert_eq!(all, 7, "2 flavors, 2 teams, and 3 workload writes (the unchanged re-PUT is no mutation)");

    // A period: from the update on (at or after its time), and before the delete.
    let time = |verb: &str| records.iter().find(|r| r["verb"] == verb).unwrap()["time"].as_str().unwrap().to_owned();
    let q = |s: &str| s.replace('+', "%2B");
    let period = format!("/api/v1/audit?kind=workload&since={}&until={}", q(&time("update")), q(&time("delete")));
    let verbs: Vec<String> = s.get(&period).await.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["verb"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(verbs, ["update"]);
    let backwards = format!("/api/v1/audit?since={}&until={}", q(&time("delete")), q(&time("update")));
    s.get(&backwards).await.assert_problem(422, Some("until"));
    s.get("/api/v1/audit?since=yesterday").await.assert_problem(400, Some("since"));
}

async fn collect_audit(s: &Server) -> usize {
    let mut n = 0;
    let mut url = "/api/v1/audit?limit=3".to_owned();
    loop {
        let page = s.get(&url).await;
        n += page.body["items"].as_array().unwrap().len();
        match page.body["next"].as_str() {
            Some(c) => url = format!("/api/v1/audit?limit=3&cursor={c}"),
            None => return n,
        }
    }
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn concurrent_puts_of_one_new_name_create_it_exactly_once(db: berth_store::PgPool) {
    let s = std::sync::Arc::new(Server::start(db).await);
    s.seed().await;
    let path = "/api/v1/teams/nlp/workloads/racy";
    let puts: Vec<_> = (0..16)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.put(path, &WorkloadBody::new().json()).await.status.as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for put in puts {
        statuses.push(put.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 200), "{statuses:?}");
    let counts = s.table_counts().await;
    assert_eq!(counts["workloads"], 1);
    assert_eq!(counts["events"], 1, "one Created event");
    let creates: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE name = 'racy' AND verb = 'create'")
        .fetch_one(&s.db)
        .await
        .unwrap();
    assert_eq!(creates, 1);
}

/// Submissions made at the same time are written together (berth_app::group_commit), and
/// each keeps what is its own: its submitter, request id and owner in its records.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn concurrent_creates_by_several_callers_keep_each_callers_records(db: berth_store::PgPool) {
    use berth_core::auth::Role;

    let s = std::sync::Arc::new(Server::start(db).await);
    s.seed().await;
    let puts: Vec<_> = (0..24)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let who = format!("user{}", i % 3);
                let token = crate::common::token(&who, &[(Role::Member, Some("nlp"))]);
                let path = format!("/api/v1/teams/nlp/workloads/w{i}");
                let reply = s.send_as(Some(&token), Method::PUT, &path, Some(&WorkloadBody::new().json())).await;
                assert_eq!(reply.status, 201, "{}", reply.body);
                let request_id = reply.headers["x-request-id"].to_str().unwrap().to_owned();
                (format!("w{i}"), who, request_id, reply.body)
            })
        })
        .collect();
    for put in puts {
        let (name, who, request_id, body) = put.await.unwrap();
        assert_eq!(body["metadata"]["owner"]["subject"], who.as_str(), "{body}");
        let (actor, recorded_id): (String, Option<String>) =
            sqlx::query_as("SELECT actor, request_id FROM audit_log WHERE name = $1 AND verb = 'create'")
                .bind(&name)
                .fetch_one(&s.db)
                .await
                .unwrap();
        assert_eq!((actor.as_str(), recorded_id.as_deref()), (who.as_str(), Some(request_id.as_str())), "{name}");
        let stored = s.get(&format!("/api/v1/teams/nlp/workloads/{name}")).await;
        assert_eq!(stored.body["metadata"]["uid"], body["metadata"]["uid"]);
    }
    let counts = s.table_counts().await;
    assert_eq!((counts["workloads"], counts["events"]), (24, 24), "one Created event each");
}

/// A submission that cannot be written (its team was deleted after it was checked) fails
/// alone: the others written in the same statement are created.
/// A submission is written on the teams and flavors the door check read in the last few
/// seconds, without a read of its own; what changed since behind this replica's back (SQL
/// here, as another replica's writes) is found by the write, which then reads them again.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_submission_on_an_old_read_of_teams_and_flavors_finds_what_changed(db: berth_store::PgPool) {
    let s = Server::start(db.clone()).await;
    s.seed().await;
    // Teams and flavors are read here, and kept for the next submissions.
    s.put_ok("/api/v1/teams/nlp/workloads/first", &WorkloadBody::new().json(), 201).await;
    sqlx::query("DELETE FROM flavors WHERE name = 'a100'").execute(&db).await.unwrap();
    let before = s.table_counts().await;
    let gone = s.put("/api/v1/teams/nlp/workloads/a100", &WorkloadBody::new().flavors(&["a100"]).json()).await;
    gone.assert_problem(422, Some("/spec/tasks/resources/flavors/0"));
    assert_eq!(s.table_counts().await, before, "nothing written for a flavor that is gone");

    // nlp deleted and created again under its name: the new team's uid, not the old one.
    let old: uuid::Uuid =
        sqlx::query_scalar("DELETE FROM teams WHERE name = 'nlp' RETURNING uid").fetch_one(&db).await.unwrap();
    s.put("/api/v1/teams/nlp/workloads/orphan", &WorkloadBody::new().json()).await.assert_problem(404, None);
    let new: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO teams (uid, name, parent_uid, spec) \
         SELECT gen_random_uuid(), 'nlp', uid, '{\"quotas\": []}' FROM teams WHERE name = 'research' RETURNING uid",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    s.put_ok("/api/v1/teams/nlp/workloads/second", &WorkloadBody::new().json(), 201).await;
    let team_uid: uuid::Uuid =
        sqlx::query_scalar("SELECT team_uid FROM workloads WHERE name = 'second'").fetch_one(&db).await.unwrap();
    assert_eq!(team_uid, new, "written in the team of that name now, not in {old}");
}

/// A submission to the group commit, of nlp's usual workload by admin.
fn submission(name: &str, team_uid: uuid::Uuid) -> berth_app::group_commit::Submission {
    use berth_core::workload::{WorkloadApply, WorkloadStatus};
    berth_app::group_commit::Submission {
        uid: berth_core::WorkloadId::new(),
        team_uid: berth_core::TeamId(team_uid),
        team: "nlp".into(),
        name: name.into(),
        labels: Default::default(),
        spec: serde_json::from_value::<WorkloadApply>(WorkloadBody::new().json()).unwrap().spec,
        status: WorkloadStatus::default(),
        owner: berth_core::meta::Owner { subject: "admin".into(), issuer: "berth".into(), service_account_uid: None },
        actor: berth_core::event::Actor::new("admin", None),
    }
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_submission_that_cannot_be_written_fails_alone(db: berth_store::PgPool) {
    use berth_app::group_commit::create;

    let s = Server::start(db.clone()).await;
    s.seed().await;
    let nlp: uuid::Uuid = sqlx::query_scalar("SELECT uid FROM teams WHERE name = 'nlp'").fetch_one(&db).await.unwrap();
    let taken_uid = berth_core::WorkloadId::new();
    let submission = |name: &str, team_uid: uuid::Uuid| {
        let mut s = submission(name, team_uid);
        if name == "w3" || name == "w5" {
            s.uid = taken_uid;
        }
        s
    };
    // Spawned together, they queue before any writer runs and make up one statement, which
    // fails: w3 and w5 share a uid. Each is then written alone, and only w5 fails. w6 names
    // a team that is gone (read before another replica deleted it): it is skipped, so the
    // caller reads the team again (and answers 404), and takes nothing down with it.
    let writes: Vec<_> = (0..8)
        .map(|i| {
            let team = if i == 6 { uuid::Uuid::new_v4() } else { nlp };
            let (db, submission) = (db.clone(), submission(&format!("w{i}"), team));
            tokio::spawn(async move { create(&db, submission).await })
        })
        .collect();
    for (i, write) in writes.into_iter().enumerate() {
        match write.await.unwrap() {
            Ok(Some(w)) => assert!(i != 5 && i != 6, "{w:?}"),
            Ok(None) => assert_eq!(i, 6, "w{i}: no name was taken"),
            Err(e) => assert_eq!(i, 5, "{e}"),
        }
    }
    let counts = s.table_counts().await;
    assert_eq!((counts["workloads"], counts["events"]), (6, 6));
}

/// A statement held up (here behind another transaction's insert of the same name) does
/// not hold up the submissions queued behind it: after `SECOND_WRITER_AFTER` one of them
/// starts a second writer, which writes them.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_statement_held_up_does_not_hold_up_the_submissions_behind_it(db: berth_store::PgPool) {
    use berth_app::group_commit::create;

    let s = Server::start(db.clone()).await;
    s.seed().await;
    let nlp: uuid::Uuid = sqlx::query_scalar("SELECT uid FROM teams WHERE name = 'nlp'").fetch_one(&db).await.unwrap();
    let mut other = db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO workloads (uid, team_uid, team_name, name, kind, flavors, spec) \
         VALUES (gen_random_uuid(), $1, 'nlp', 'held', 'batch', '{h100}', '{}')",
    )
    .bind(nlp)
    .execute(&mut *other)
    .await
    .unwrap();
    let held = tokio::spawn({
        let db = db.clone();
        async move { create(&db, submission("held", nlp)).await }
    });
    // The held statement waits on the other transaction's lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH w AS (%'",
    )
    .fetch_one(&db)
    .await
    .unwrap()
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "the first statement never waited");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let behind = tokio::time::timeout(std::time::Duration::from_secs(20), create(&db, submission("behind", nlp)))
        .await
        .expect("written while the first statement is held");
    assert!(behind.unwrap().is_some());
    assert!(!held.is_finished(), "the first is still held");
    other.rollback().await.unwrap();
    assert!(held.await.unwrap().unwrap().is_some(), "written once the other transaction let go");
}

/// Submissions that come one at a time make groups of one; their statement is planned once
/// per connection, not at each submission (which cost Postgres as much as writing them),
/// and the connection goes back to the pool planning as before.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn submissions_one_at_a_time_are_not_planned_each_time(db: berth_store::PgPool) {
    use berth_app::group_commit::create;

    let s = Server::start(db.clone()).await;
    s.seed().await;
    let nlp: uuid::Uuid = sqlx::query_scalar("SELECT uid FROM teams WHERE name = 'nlp'").fetch_one(&db).await.unwrap();
    // One connection, so that each submission's writer takes the same one; not tested
    // before it is handed out, as berthd's are not.
    let one = sqlx::postgres::PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(1)
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    for i in 0..8 {
        assert!(create(&one, submission(&format!("w{i}"), nlp)).await.unwrap().is_some(), "w{i} created");
    }
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE 'WITH w AS (%INSERT INTO workloads%'",
    )
    .fetch_one(&one)
    .await
    .unwrap();
    // Left to itself, Postgres plans each of the first five for its parameters.
    assert_eq!((generic, custom), (8, 0));
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode").fetch_one(&one).await.unwrap();
    assert_eq!(mode, "auto", "the connection is back as it was");
    // Its connection killed, the next submission is written on another.
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&one).await.unwrap();
    sqlx::query("SELECT pg_terminate_backend($1, 5000)").bind(pid).execute(&db).await.unwrap();
    assert!(create(&one, submission("after", nlp)).await.unwrap().is_some());
    one.close().await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_queue_is_in_the_schedulers_order_and_the_summary_counts_phases(db: berth_store::PgPool) {
    use berth_core::auth::Role;

    use crate::common::{token, two_teams_on_one_cluster};

    let s = Server::start(db).await;
    let ctx = two_teams_on_one_cluster(&s, 8).await;
    // b fills the cluster; then a's w1, w2, w3 and b's x wait.
    s.put_ok("/api/v1/teams/b/workloads/big", &WorkloadBody::new().gpus(8.0).count(2).json(), 201).await;
    berth_controllers::scheduler::reconcile(&ctx).await.expect("cycle");
    for (team, name, priority) in [("a", "w1", 0), ("b", "x", 0), ("a", "w2", 5), ("a", "w3", 0)] {
        let body = WorkloadBody::new().gpus(4.0).priority(priority).json();
        s.put_ok(&format!("/api/v1/teams/{team}/workloads/{name}"), &body, 201).await;
    }
    let before_cycle = s.get("/api/v1/queue").await;
    assert_eq!(before_cycle.body["total"], 4, "{}", before_cycle.body);
    berth_controllers::scheduler::reconcile(&ctx).await.expect("cycle");

    let queue = s.get("/api/v1/queue").await;
    assert_eq!(queue.status, 200, "{}", queue.body);
    assert_eq!((queue.body["total"].as_i64(), queue.body["gpus"].as_f64()), (Some(4), Some(16.0)));
    let items = queue.body["items"].as_array().unwrap();
    let positions: Vec<i64> = items.iter().map(|w| w["status"]["queue_position"]["global"].as_i64().unwrap()).collect();
    assert_eq!(positions, [1, 2, 3, 4], "{}", queue.body);
    assert!(items.iter().all(|w| w["status"]["pending_reason"]["message"].is_string()));
    let order: Vec<&str> = items.iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(order[0], "w2", "a's higher-priority workload comes first within a: {order:?}");
    let head = s.get("/api/v1/queue?limit=2").await;
    assert_eq!(head.body["items"].as_array().unwrap().len(), 2);
    assert_eq!(head.body["total"], 4);
    s.get("/api/v1/queue?limit=0").await.assert_problem(422, Some("limit"));

    // A member of a sees a's part only, the same order.
    let member = token("m", &[(Role::Member, Some("a"))]);
    let mine = s.send_as(Some(&member), Method::GET, "/api/v1/queue", None).await;
    let names: Vec<&str> =
        mine.body["items"].as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect();
    let expected: Vec<&str> = order.iter().copied().filter(|n| *n != "x").collect();
    assert_eq!(names, expected);
    assert_eq!(mine.body["total"], 3);
    s.send_as(Some(&member), Method::GET, "/api/v1/queue?team=b", None).await.assert_problem(404, None);

    let summary = s.get("/api/v1/workloads/summary").await;
    let phases = summary.body["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 9, "every phase is listed");
    let count = |phase: &str| {
        let p = phases.iter().find(|p| p["phase"] == phase).unwrap();
        (p["workloads"].as_i64().unwrap(), p["gpus"].as_f64().unwrap())
    };
    assert_eq!(count("Pending"), (4, 16.0));
    // a reclaims its guarantee from b: the second cycle preempted big.
    assert_eq!(count("Preempting"), (1, 16.0), "{}", summary.body);
    assert_eq!(count("Admitted"), (0, 0.0));
    assert_eq!(count("Running"), (0, 0.0));
    let as_member = s.send_as(Some(&member), Method::GET, "/api/v1/workloads/summary", None).await;
    let member_pending =
        as_member.body["phases"].as_array().unwrap().iter().find(|p| p["phase"] == "Pending").unwrap().clone();
    assert_eq!(member_pending["workloads"], 3);
}

/// A batch item: the workload body, naming itself.
fn item(name: &str, body: WorkloadBody) -> serde_json::Value {
    let mut v = body.json();
    v["metadata"]["name"] = json!(name);
    v
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_batch_creates_all_its_workloads_in_order_with_their_history(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let items: Vec<_> = ["c", "a", "b"].iter().map(|n| item(n, WorkloadBody::new().label("sweep", "lr"))).collect();
    let created = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&json!({"items": items})), &[]).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.names(), ["c", "a", "b"]);
    for w in created.body["items"].as_array().unwrap() {
        assert_eq!(w["status"]["phase"], "Pending");
        assert_eq!(w["metadata"]["team"], "nlp");
        assert_eq!(w["metadata"]["labels"]["sweep"], "lr");
        assert_eq!(w["metadata"]["generation"], 1);
    }
    assert_eq!(collect_pages(&s, "/api/v1/teams/nlp/workloads?label_selector=sweep%3Dlr", 5).await, ["a", "b", "c"]);
    // Each has its Created event and audit record, as if submitted alone; the flavors
    // column follows the spec (the GPU filter of the queue and usage reads it).
    let events = s.get("/api/v1/teams/nlp/workloads/b/events").await;
    assert_eq!(events.body["items"][0]["reason"], "Created");
    let (audited, flavors): (i64, Vec<String>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM audit_log WHERE kind = 'workload' AND verb = 'create'),
                (SELECT flavors FROM workloads WHERE name = 'a')",
    )
    .fetch_one(&s.db)
    .await
    .unwrap();
    assert_eq!((audited, flavors), (3, vec!["h100".to_owned()]));
    // The workloads are ordinary afterwards: PUT changes one.
    s.put_ok("/api/v1/teams/nlp/workloads/a", &WorkloadBody::new().gpus(2.0).json(), 200).await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_bad_batch_writes_nothing_and_names_the_item_at_fault(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    s.put_ok("/api/v1/teams/nlp/workloads/taken", &WorkloadBody::new().json(), 201).await;
    let before = s.table_counts().await;
    let ok = || item("fine", WorkloadBody::new());
    let mut unnamed = WorkloadBody::new().json();
    unnamed["metadata"] = json!({});
    let mut versioned = item("v", WorkloadBody::new());
    versioned["metadata"]["resource_version"] = json!("7");
    let cases = [
        (json!({"items": [ok(), item("x", WorkloadBody::new().count(0))]}), 422, "/items/1/spec/tasks/count"),
        (json!({"items": [ok(), unnamed]}), 422, "/items/1/metadata/name"),
        (json!({"items": [ok(), item("Bad_Name", WorkloadBody::new())]}), 422, "/items/1/metadata/name"),
        (json!({"items": [ok(), ok()]}), 422, "/items/1/metadata/name"),
        (json!({"items": [versioned]}), 422, "/items/0/metadata/resource_version"),
        (
            json!({"items": [ok(), item("y", WorkloadBody::new().flavors(&["h100", "tpu"]))]}),
            422,
            "/items/1/spec/tasks/resources/flavors/1",
        ),
        (json!({"items": []}), 422, "/items"),
        (json!({"items": [ok(), item("taken", WorkloadBody::new())]}), 409, "/items/1/metadata/name"),
    ];
    for (body, status, field) in cases {
        let reply = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&body), &[]).await;
        reply.assert_problem(status, Some(field));
    }
    let too_many: Vec<_> = (0..=1000).map(|i| item(&format!("w{i}"), WorkloadBody::new())).collect();
    let reply = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&json!({"items": too_many})), &[]).await;
    reply.assert_problem(422, Some("/items"));
    let reply = s.send(Method::POST, "/api/v1/teams/ghost/workloads", Some(&json!({"items": [ok()]})), &[]).await;
    reply.assert_problem(404, None);
    assert_eq!(s.table_counts().await, before, "nothing of a refused batch is written");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn work_that_can_never_run_is_refused_at_the_door_naming_the_field(db: berth_store::PgPool) {
    // nlp: guaranteed 8, limit 16, under research (guaranteed 16, no limit).
    let s = Server::start(db).await;
    s.seed().await;
    let cluster = s.put_ok("/api/v1/clusters/sim-a", &crate::common::sim_cluster("h100"), 201).await;
    let slurm = json!({"spec": {"kind": "slurm", "endpoint": "http://127.0.0.1:9", "credentials_ref": "BERTH_CREDENTIAL_SLURM_A",
        "slurm": {"user": "berth", "partitions": [{"name": "gpu", "flavor": "h100"}]}}});
    let slurm = s.put_ok("/api/v1/clusters/slurm-a", &slurm, 201).await;
    let before = s.table_counts().await;
    let refused = |reply: &crate::common::Reply, field: &str, words: &str| {
        reply.assert_problem(422, Some(field));
        assert!(reply.body.to_string().contains(words), "{}", reply.body);
    };
    let put = |name: &str, body: WorkloadBody| {
        let path = format!("/api/v1/teams/{name}");
        let body = body.json();
        let s = &s;
        async move { s.send(Method::PUT, &path, Some(&body), &[]).await }
    };
    // Above a limit: 2 × 10 GPUs in nlp, which may hold 16.
    let r = put("nlp/workloads/big", WorkloadBody::new().count(2).gpus(10.0)).await;
    refused(&r, "/spec/tasks/resources/gpus", "team nlp may hold at most 16");
    // Non-preemptible above the team's guarantee (12 > 8): it may only run in-quota.
    let r = put("nlp/workloads/firm", WorkloadBody::new().count(3).gpus(4.0).preemptible(false)).await;
    refused(&r, "/spec/preemptible", "team nlp is guaranteed 8");
    // research's own work runs in-quota only in what nlp's guarantee leaves of its 16.
    let r = put("research/workloads/firm", WorkloadBody::new().count(3).gpus(4.0).preemptible(false)).await;
    refused(
        &r,
        "/spec/preemptible",
        "team research's own work (its guarantee less its teams') is guaranteed 8, not 12",
    );
    // Shapes are not judged before the cluster reported its nodes: a 12-GPU task passes
    // the door (a dry run, so nothing is written)…
    let r = s
        .send(
            Method::PUT,
            "/api/v1/teams/research/workloads/wide?dry_run=true",
            Some(&WorkloadBody::new().gpus(12.0).json()),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // …and once every cluster has (2 nodes of 8 GPUs on sim-a, 1 on slurm-a), a task
    // larger than every node, or more tasks than a cluster holds even empty, is refused.
    let uid = cluster.body["metadata"]["uid"].as_str().unwrap().parse().unwrap();
    let node = |name: &str| berth_store::cluster::ClusterNode {
        name: name.into(),
        flavor: Some("h100".into()),
        gpus: 8,
        unavailable_gpus: 0,
        cpus: 64,
        memory_mib: 512 * 1024,
        block: None,
        schedulable: true,
    };
    let mut tx = s.db.begin().await.unwrap();
    berth_store::cluster::cluster_nodes_replace(&mut tx, berth_core::ClusterId(uid), &[node("n1"), node("n2")])
        .await
        .unwrap();
    let uid = slurm.body["metadata"]["uid"].as_str().unwrap().parse().unwrap();
    berth_store::cluster::cluster_nodes_replace(&mut tx, berth_core::ClusterId(uid), &[node("s1")]).await.unwrap();
    tx.commit().await.unwrap();
    berth_app::feasibility::forget(&s.db); // as the controllers' next health pass would make it stale
    let r = put("research/workloads/wide", WorkloadBody::new().gpus(12.0)).await;
    refused(&r, "/spec/tasks/resources/gpus", "the largest node the placement allows has 8");
    let r = put("research/workloads/many", WorkloadBody::new().count(3).gpus(8.0)).await;
    refused(&r, "/spec/tasks/count", "holds more than 2 of them");
    // Slurm runs batch scripts only: a workload that may only go to Slurm (backend_kinds)
    // and gives neither script nor command is refused once the Slurm cluster reported.
    let mut bare = WorkloadBody::new().json();
    bare["spec"]["placement"] = json!({"backend_kinds": ["slurm"]});
    let r = s.send(Method::PUT, "/api/v1/teams/research/workloads/bare", Some(&bare), &[]).await;
    refused(&r, "/spec/run/command", "run only batch scripts");
    bare["spec"]["run"] = json!({"command": ["python", "train.py"]});
    let r = s.send(Method::PUT, "/api/v1/teams/research/workloads/bare?dry_run=true", Some(&bare), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Nor does it serve inference.
    bare["spec"]["kind"] = json!("inference");
    let r = s.send(Method::PUT, "/api/v1/teams/research/workloads/bare", Some(&bare), &[]).await;
    refused(&r, "/spec/kind", "do not serve inference");
    // A batch names the item at fault and writes nothing.
    let items = json!({"items": [
        {"metadata": {"name": "ok"}, "spec": WorkloadBody::new().json()["spec"]},
        {"metadata": {"name": "firm"}, "spec": WorkloadBody::new().count(3).gpus(4.0).preemptible(false).json()["spec"]},
    ]});
    let r = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&items), &[]).await;
    refused(&r, "/items/1/spec/preemptible", "team nlp is guaranteed 8");
    // A dry run answers 200 with the workload as the write would make it, and writes
    // nothing (no ETag or Location of something that does not exist); so does a dry batch.
    let r = s
        .send(Method::PUT, "/api/v1/teams/nlp/workloads/fine?dry_run=true", Some(&WorkloadBody::new().json()), &[])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"]["phase"], "Pending");
    assert_eq!((&r.body["metadata"]["name"], &r.body["metadata"]["generation"]), (&json!("fine"), &json!(1)));
    assert!(r.headers.get("etag").is_none() && r.headers.get("location").is_none());
    let items = json!({"items": [{"metadata": {"name": "ok"}, "spec": WorkloadBody::new().json()["spec"]}]});
    let r = s.send(Method::POST, "/api/v1/teams/nlp/workloads?dry_run=true", Some(&items), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.names(), ["ok"]);
    assert_eq!(s.table_counts().await, before, "refusals and dry runs write nothing");
    s.get("/api/v1/teams/nlp/workloads/fine").await.assert_problem(404, None);
    // What can run is accepted as before.
    s.put_ok("/api/v1/teams/nlp/workloads/fine", &WorkloadBody::new().count(2).gpus(8.0).json(), 201).await;
    // A member of nlp, which may not read its parent research, learns that an ancestor's
    // limit binds, not the ancestor's name (the door's message named it at first).
    let research = crate::common::TeamBody::new().quota("h100", 12, Some(12), 1).json();
    s.put_ok("/api/v1/teams/research", &research, 200).await;
    let alice = crate::common::token("alice", &[(berth_core::auth::Role::Member, Some("nlp"))]);
    let body = WorkloadBody::new().count(2).gpus(7.0).json();
    let r = s.send_as(Some(&alice), Method::PUT, "/api/v1/teams/nlp/workloads/wide-2", Some(&body)).await;
    refused(&r, "/spec/tasks/resources/gpus", "an ancestor team may hold at most 12");
    assert!(!r.body.to_string().contains("research"), "{}", r.body);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_admitted_workload_keeps_its_shape_and_an_ended_one_its_spec(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let path = "/api/v1/teams/nlp/workloads/train";
    s.put_ok(path, &WorkloadBody::new().gpus(8.0).json(), 201).await;
    // Pending: anything may change.
    s.put_ok(path, &WorkloadBody::new().gpus(4.0).json(), 200).await;
    let set_phase = |phase: &'static str| {
        let db = s.db.clone();
        async move {
            sqlx::query("UPDATE workloads SET phase = $1, status = jsonb_set(status, '{phase}', to_jsonb($1::text))")
                .bind(phase)
                .execute(&db)
                .await
                .unwrap();
        }
    };
    // Running on 4 GPUs: shrinking it (the node-overcommit reproduction), or any other
    // change of what the job was made from, is refused naming the field; nothing changes.
    set_phase("Running").await;
    let before = s.get(path).await.body;
    let shrink = s.put(path, &WorkloadBody::new().gpus(2.0).json()).await;
    shrink.assert_problem(422, Some("/spec/tasks/resources/gpus"));
    assert!(shrink.body["detail"].as_str().unwrap().contains("cancel and resubmit"), "{}", shrink.body);
    s.put(path, &WorkloadBody::new().gpus(4.0).count(2).json()).await.assert_problem(422, Some("/spec/tasks/count"));
    let dry = s.put(&format!("{path}?dry_run=true"), &WorkloadBody::new().gpus(2.0).json()).await;
    dry.assert_problem(422, Some("/spec/tasks/resources/gpus"));
    let after = s.get(path).await.body;
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(after["metadata"]["generation"], before["metadata"]["generation"]);
    // Priority and labels change nothing on the cluster: allowed.
    let reprioritised =
        s.put_ok(path, &WorkloadBody::new().gpus(4.0).priority(5).label("stage", "2").json(), 200).await;
    assert_eq!(reprioritised.body["spec"]["priority"], 5);

    // Ended: the spec records what ran; a change is a conflict, the same spec is fine.
    set_phase("Succeeded").await;
    let changed = s.put(path, &WorkloadBody::new().gpus(4.0).priority(6).label("stage", "2").json()).await;
    changed.assert_problem(409, Some("/spec"));
    assert!(changed.body["detail"].as_str().unwrap().contains("has ended (Succeeded)"), "{}", changed.body);
    s.put_ok(path, &WorkloadBody::new().gpus(4.0).priority(5).label("stage", "3").json(), 200).await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_batch_item_without_a_name_gets_one_from_its_generate_name(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let generated = |prefix: &str| {
        let mut v = WorkloadBody::new().json();
        v["metadata"]["generate_name"] = json!(prefix);
        v
    };
    let items: Vec<_> = (0..20).map(|_| generated("sweep-")).chain([item("named", WorkloadBody::new())]).collect();
    let created = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&json!({"items": items})), &[]).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let names = created.names();
    assert_eq!(names.last().map(String::as_str), Some("named"));
    let mut made: Vec<&String> = names[..20].iter().collect();
    for name in &made {
        assert!(name.starts_with("sweep-") && name.len() == 11, "{name}");
        assert!(name[6..].bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)), "{name}");
        assert_eq!(s.get(&format!("/api/v1/teams/nlp/workloads/{name}")).await.status, 200);
    }
    made.sort_unstable();
    made.dedup();
    assert_eq!(made.len(), 20, "every generated name is new");

    // A bad prefix, or an item with neither, is refused naming the field; nothing is written.
    let bad = json!({"items": [generated("Sweep_"), generated("ok-"), WorkloadBody::new().json()]});
    let refused = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&bad), &[]).await;
    refused.assert_problem(422, Some("/items/0/metadata/generate_name"));
    let fields: Vec<&str> =
        refused.body["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["/items/0/metadata/generate_name", "/items/2/metadata/name"]);
    let listed = s.get("/api/v1/teams/nlp/workloads?limit=100").await;
    assert_eq!(listed.body["items"].as_array().unwrap().len(), 21);
    // PUT names the workload in its path and ignores a prefix, but not a broken one.
    s.put("/api/v1/teams/nlp/workloads/x", &generated("")).await.assert_problem(422, Some("/metadata/generate_name"));
    s.put_ok("/api/v1/teams/nlp/workloads/x", &generated("ok-"), 201).await;
}

/// A GET answers from memory (berth_app::workload_cache) yet sees every write committed
/// before it, whoever made it: here SQL behind Berth's back, as another replica's writes
/// are. Readers hammering the same name meanwhile make the reads of the change feed
/// shared, so a read arriving while one is under way must wait for the next.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_read_sees_every_write_committed_before_it_whoever_wrote_it(db: berth_store::PgPool) {
    let s = std::sync::Arc::new(Server::start(db).await);
    s.seed().await;
    let path = "/api/v1/teams/nlp/workloads/w";
    let first = s.put_ok(path, &WorkloadBody::new().json(), 201).await.body;
    assert_eq!(s.get(path).await.body["metadata"]["uid"], first["metadata"]["uid"]);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (s, stop) = (s.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let status = s.get("/api/v1/teams/nlp/workloads/w").await.status;
                    assert!(status == 200 || status == 404, "{status}");
                }
            })
        })
        .collect();
    for n in 0..30 {
        sqlx::query(
            "UPDATE workloads SET labels = jsonb_build_object('n', $1::text),
                    resource_version = nextval('resource_version_seq') WHERE name = 'w'",
        )
        .bind(n.to_string())
        .execute(&s.db)
        .await
        .unwrap();
        let read = s.get(path).await;
        assert_eq!(read.body["metadata"]["labels"]["n"], n.to_string(), "write {n}: {}", read.body);
    }
    sqlx::query("DELETE FROM workloads WHERE name = 'w'").execute(&s.db).await.unwrap();
    assert_eq!(s.get(path).await.status, 404);
    let second = s.put_ok(path, &WorkloadBody::new().json(), 201).await.body;
    assert_ne!(second["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(s.get(path).await.body["metadata"]["uid"], second["metadata"]["uid"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }

    // The cache's connection to the feed is killed (an idle timeout, a proxy's restart): a
    // read may fail once, and the next ones are fresh again.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE 'WITH feed AS%'",
    )
    .fetch_one(&s.db)
    .await
    .unwrap();
    assert_eq!(killed, 1);
    sqlx::query(
        "UPDATE workloads SET labels = '{\"n\": \"after\"}', resource_version = nextval('resource_version_seq')",
    )
    .execute(&s.db)
    .await
    .unwrap();
    let mut statuses = Vec::new();
    let read = loop {
        let read = s.get(path).await;
        statuses.push(read.status.as_u16());
        if read.status == 200 || statuses.len() == 3 {
            break read;
        }
    };
    assert_eq!(read.body["metadata"]["labels"]["n"], "after", "{statuses:?} {}", read.body);
}

/// A client that re-sends its copy of a deleted object (its uid in the body) is told so
/// instead of bringing it back under a new uid; without the uid it creates a new one.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_deleted_objects_uid_does_not_bring_it_back(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    for (path, body) in [
        ("/api/v1/teams/nlp/workloads/train", WorkloadBody::new().json()),
        ("/api/v1/teams/vision", json!({"spec": {}})),
    ] {
        let first = s.put_ok(path, &body, 201).await;
        assert!(matches!(s.delete(path).await.status.as_u16(), 200 | 202));
        if path.contains("workloads") {
            // Pending: removed at once.
            assert_eq!(s.get(path).await.status, 404);
        }
        let mut again = body.clone();
        again["metadata"] = json!({"uid": first.body["metadata"]["uid"]});
        s.put(path, &again).await.assert_problem(409, Some("/metadata/uid"));
        assert_eq!(s.get(path).await.status, 404, "{path}: nothing written");
        let new = s.put_ok(path, &body, 201).await;
        assert_ne!(new.body["metadata"]["uid"], first.body["metadata"]["uid"]);
    }
    let batch = json!({"items": [{"metadata": {"name": "b", "uid": "01a23f6b-72e9-7392-b01a-138cd85ad4d4"},
        "spec": WorkloadBody::new().json()["spec"]}]});
    let refused = s.send(Method::POST, "/api/v1/teams/nlp/workloads", Some(&batch), &[]).await;
    refused.assert_problem(422, Some("/items/0/metadata/uid"));
}
