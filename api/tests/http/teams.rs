use crate::common::{Server, TeamBody, WorkloadBody, check_declarative_contract, collect_pages};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_keeps_the_declarative_contract(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let v1 = TeamBody::new().parent("research").quota("h100", 2, None, 1).json();
    let v2 = TeamBody::new().parent("research").quota("h100", 4, Some(8), 3).json();
    check_declarative_contract(&s, "/api/v1/teams/vision", &v1, &v2, 200).await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_list_pages_and_filters_by_parent(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    for name in ["t3", "t1", "t2"] {
        s.put_ok(&format!("/api/v1/teams/{name}"), &TeamBody::new().parent("research").json(), 201).await;
    }
    let all = collect_pages(&s, "/api/v1/teams", 2).await;
    assert_eq!(all, ["nlp", "research", "t1", "t2", "t3"]);
    let children = collect_pages(&s, "/api/v1/teams?parent=research", 1).await;
    assert_eq!(children, ["nlp", "t1", "t2", "t3"]);
    assert!(collect_pages(&s, "/api/v1/teams?parent=nlp", 10).await.is_empty());
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_rules_are_enforced_naming_the_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let before = s.table_counts().await;
    let cases = [
        // A flavor that does not exist.
        (TeamBody::new().quota("tpu", 1, None, 1).json(), "/spec/quotas/0/flavor"),
        // Limit below guaranteed.
        (TeamBody::new().quota("h100", 4, Some(2), 1).json(), "/spec/quotas/0/limit"),
        // Two quotas for one flavor.
        (TeamBody::new().quota("h100", 1, None, 1).quota("h100", 1, None, 1).json(), "/spec/quotas/1/flavor"),
        // research guarantees 16 and nlp already holds 8: 9 more do not fit.
        (TeamBody::new().parent("research").quota("h100", 9, None, 1).json(), "/spec/quotas/0/guaranteed"),
        // A parent that does not exist.
        (TeamBody::new().parent("nobody").json(), "/spec/parent"),
        // The parent has no a100 guarantee at all.
        (TeamBody::new().parent("research").quota("a100", 1, None, 1).json(), "/spec/quotas/0/guaranteed"),
    ];
    for (body, field) in cases {
        s.put("/api/v1/teams/newteam", &body).await.assert_problem(422, Some(field));
    }
    // Its own parent, and a cycle research -> nlp -> research.
    s.put("/api/v1/teams/nlp", &TeamBody::new().parent("nlp").json()).await.assert_problem(422, Some("/spec/parent"));
    let cycle = s.put("/api/v1/teams/research", &TeamBody::new().parent("nlp").quota("h100", 16, None, 1).json()).await;
    cycle.assert_problem(422, Some("/spec/parent"));
    assert!(cycle.body["detail"].as_str().unwrap().contains("cycle"), "{}", cycle.body);
    // A parent cannot shrink its guarantee below what its children hold.
    s.put("/api/v1/teams/research", &TeamBody::new().quota("h100", 7, None, 1).json())
        .await
        .assert_problem(422, Some("/spec/quotas/0/guaranteed"));
    assert_eq!(s.table_counts().await, before, "rejected writes leave the database unchanged");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_team_with_children_or_live_workloads_cannot_be_deleted(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let refused = s.delete("/api/v1/teams/research").await;
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("nlp"));

    s.put_ok("/api/v1/teams/nlp/workloads/train", &WorkloadBody::new().json(), 201).await;
    let refused = s.delete("/api/v1/teams/nlp").await;
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("train"));

    assert_eq!(s.delete("/api/v1/teams/nlp/workloads/train").await.status, 202);
    assert_eq!(s.delete("/api/v1/teams/nlp").await.status, 200);
    assert_eq!(s.delete("/api/v1/teams/research").await.status, 200);
}
