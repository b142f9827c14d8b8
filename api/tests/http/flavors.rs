use serde_json::json;

use crate::common::{Server, TeamBody, check_declarative_contract, collect_pages, flavor, sim_cluster};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn flavor_keeps_the_declarative_contract(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    check_declarative_contract(&s, "/api/v1/flavors/h100", &flavor("h100"), &flavor("h100x"), 200).await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn flavor_list_pages_through_every_flavor_in_name_order(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let mut expected: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
    for name in expected.iter().rev() {
        s.put_ok(&format!("/api/v1/flavors/{name}"), &flavor(name), 201).await;
    }
    expected.sort();
    assert_eq!(collect_pages(&s, "/api/v1/flavors", 3).await, expected);
    assert_eq!(collect_pages(&s, "/api/v1/flavors", 500).await, expected);
    s.get("/api/v1/flavors?limit=0").await.assert_problem(422, Some("limit"));
    s.get("/api/v1/flavors?limit=501").await.assert_problem(422, Some("limit"));
    s.get("/api/v1/flavors?cursor=bogus").await.assert_problem(422, Some("cursor"));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn flavor_validation_names_each_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let cases = [
        (json!({"spec": {"gpu_memory_gib": 0}}), "/spec/gpu_memory_gib"),
        (json!({"spec": {"mig_profile": "1g 10gb"}}), "/spec/mig_profile"),
        (json!({"spec": {"slurm": {"gres_type": "a b"}}}), "/spec/slurm/gres_type"),
        (json!({"spec": {"kubernetes": {"node_label_value": "not valid!"}}}), "/spec/kubernetes/node_label_value"),
        (json!({"spec": {}, "metadata": {"name": "other"}}), "/metadata/name"),
        (json!({"spec": {}, "metadata": {"labels": {"bad key!": "x"}}}), "/metadata/labels/bad key!"),
        (json!({"spec": {"unknown": 1}}), "/spec/unknown"),
        (json!({"spec": {}, "extra": 1}), "/extra"),
    ];
    for (body, field) in cases {
        s.put("/api/v1/flavors/h100", &body).await.assert_problem(422, Some(field));
    }
    s.put("/api/v1/flavors/Not_A_Name", &json!({"spec": {}})).await.assert_problem(422, Some("/metadata/name"));
    assert_eq!(s.table_counts().await["flavors"], 0);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_flavor_in_use_cannot_be_deleted(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.put_ok("/api/v1/flavors/h100", &flavor("h100"), 201).await;
    s.put_ok("/api/v1/teams/nlp", &TeamBody::new().quota("h100", 4, None, 1).json(), 201).await;
    let refused = s.delete("/api/v1/flavors/h100").await;
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("team nlp"), "{}", refused.body);
    s.put_ok("/api/v1/teams/nlp", &TeamBody::new().json(), 200).await;
    s.put_ok("/api/v1/clusters/sim-a", &sim_cluster("h100"), 201).await;
    s.delete("/api/v1/flavors/h100").await.assert_problem(409, None);
    assert_eq!(s.delete("/api/v1/clusters/sim-a").await.status, 200);
    assert_eq!(s.delete("/api/v1/flavors/h100").await.status, 200);
    // Unfinished work that wants it keeps it too (found without an index on the flavors
    // of workloads, which every insert paid for).
    s.put_ok("/api/v1/flavors/h100", &flavor("h100"), 201).await;
    let work =
        json!({"spec": {"kind": "training", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}}}});
    s.put_ok("/api/v1/teams/nlp/workloads/w", &work, 201).await;
    let refused = s.delete("/api/v1/flavors/h100").await;
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("workload nlp/w"), "{}", refused.body);
}

/// A flavor deleted while something that names it is written: one of the two waits for
/// the other and then refuses, whichever came first (both succeeded, and a team's quota, a
/// cluster or a workload was left naming a flavor that no longer existed).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_flavor_deleted_while_it_is_being_named_is_refused_to_one_of_them(db: berth_store::PgPool) {
    let s = std::sync::Arc::new(Server::start(db.clone()).await);
    s.put_ok("/api/v1/teams/nlp", &TeamBody::new().json(), 201).await;
    let work = |f: &str| json!({"spec": {"kind": "training", "tasks": {"count": 1, "resources": {"flavors": [f], "gpus": 1}}}});
    // The delete first: it holds the flavor (as flavor_delete does) while each write comes.
    for (path, body, field) in [
        ("/api/v1/teams/nlp/workloads/w", work("gone"), "/spec/tasks/resources/flavors/0"),
        ("/api/v1/teams/t", TeamBody::new().quota("gone", 0, Some(1), 1).json(), "/spec/quotas/0/flavor"),
        ("/api/v1/clusters/sim-a", sim_cluster("gone"), "/spec/sim/node_groups/0/flavor"),
    ] {
        s.put_ok("/api/v1/flavors/gone", &flavor("gone"), 201).await;
        let mut delete = db.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM flavors WHERE name = 'gone' FOR UPDATE").execute(&mut *delete).await.unwrap();
        let write = tokio::spawn({
            let (s, path, body) = (s.clone(), path.to_owned(), body.clone());
            async move { s.put(&path, &body).await }
        });
        waits_on_a_lock(&db).await;
        assert!(!write.is_finished(), "{path}: the write waits for the delete");
        sqlx::query("DELETE FROM flavors WHERE name = 'gone'").execute(&mut *delete).await.unwrap();
        delete.commit().await.unwrap();
        write.await.unwrap().assert_problem(422, Some(field));
    }
    let counts = s.table_counts().await;
    assert_eq!((counts["workloads"], counts["teams"], counts["clusters"]), (0, 1, 0), "nothing written");
    // The write first: the delete waits for it, and then finds the flavor used.
    s.put_ok("/api/v1/flavors/kept", &flavor("kept"), 201).await;
    let mut write = db.begin().await.unwrap();
    let missing = berth_store::flavor::flavor_missing(&mut *write, &["kept".to_owned()]).await.unwrap();
    assert!(missing.is_empty());
    sqlx::query(
        "UPDATE teams SET spec = '{\"quotas\": [{\"flavor\": \"kept\", \"guaranteed\": 0}]}' WHERE name = 'nlp'",
    )
    .execute(&mut *write)
    .await
    .unwrap();
    let delete = tokio::spawn({
        let s = s.clone();
        async move { s.delete("/api/v1/flavors/kept").await }
    });
    waits_on_a_lock(&db).await;
    assert!(!delete.is_finished(), "the delete waits for the write");
    write.commit().await.unwrap();
    let refused = delete.await.unwrap();
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("team nlp"), "{}", refused.body);
}

/// Returns once a session of this database waits on a row lock (within 10 s, else panics).
async fn waits_on_a_lock(db: &berth_store::PgPool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    while sqlx::query_scalar::<_, i64>(waiting).fetch_one(db).await.unwrap() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no session came to wait on the lock");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
